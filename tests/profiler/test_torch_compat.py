"""The collectives run under the torch a GPU machine brings (2.11 there: no
`all_gather_single` / `reduce_scatter_single`, which torch 2.12 added)."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from profiler.torch_compat import all_gather_single, reduce_scatter_single  # noqa: E402


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("older_torch", [False, True])
def test_gather_and_scatter_under_either_name(one_rank_group, monkeypatch, older_torch):
    if older_torch:
        monkeypatch.delattr(dist, "all_gather_single", raising=False)
        monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    full, shard = torch.zeros(4), torch.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # 2.13 deprecates the older names
        all_gather_single(full, shard)
        assert full.tolist() == [0.0, 1.0, 2.0, 3.0]
        out = torch.zeros(4)
        reduce_scatter_single(out, full + 1)
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]
