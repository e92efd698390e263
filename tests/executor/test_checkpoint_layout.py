"""The layout-independent checkpoint form (executor/checkpoint_layout.py) and the checks a
checkpoint passes before it is loaded (executor/checkpoint.py), in one process."""

import hashlib
import json
import math
import os
import pickle

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from executor import checkpoint  # noqa: E402
from executor.checkpoint_layout import (  # noqa: E402
    ParamPlace,
    Piece,
    _boxes,
    range_pieces,
    tp_segments,
)
from executor.tensor_parallel import regroup_rows  # noqa: E402
from planner.specs.model import preset  # noqa: E402
from tests.executor.distributed import homogeneous  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _plan():
    """A plan for the marker (model and layout) of a one-process checkpoint."""
    return homogeneous(preset("debug-tiny"), world=1, mbs=1, gbs=1)


@st.composite
def _flat_ranges(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    n = math.prod(shape)
    lo = draw(st.integers(0, n))
    return shape, lo, draw(st.integers(lo, n))


@settings(max_examples=200, deadline=None)
@given(_flat_ranges())
def test_boxes_hold_a_flat_range_in_order(case):
    shape, lo, hi = case
    index = torch.arange(math.prod(shape)).view(shape)
    got = []
    for offsets, sizes in _boxes(shape, lo, hi):
        box = index[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))]
        run = box.reshape(-1).tolist()
        assert run == list(range(run[0], run[0] + len(run)))  # one contiguous run
        got += run
    assert got == list(range(lo, hi))


@pytest.mark.parametrize(("widths", "dim", "tp"), [
    ([16, 8, 8], 0, 2),  # a fused QKV weight (q | k | v), regrouped per rank
    ([12, 12], 0, 4),  # SwiGLU's gate | up
    ([10], 0, 4),  # uneven: torch.chunk leaves the last rank short
    ([9], 1, 2),  # a row-parallel weight: columns split
])
def test_tp_shards_cut_into_flat_ranges_rebuild_the_whole(widths, dim, tp):
    """Each tp rank's local tensor (as tensor parallelism holds it), cut into ranges as
    optimizer shards are, gives pieces that rebuild the whole parameter in the model's
    order."""
    shape = (sum(widths), 3) if dim == 0 else (3, sum(widths))
    whole = torch.arange(math.prod(shape), dtype=torch.float32).view(shape)
    held = regroup_rows(whole, widths, tp) if dim == 0 and len(widths) > 1 else whole
    rebuilt = torch.full(shape, -1.0)
    for rank in range(tp):
        local = torch.chunk(held, tp, dim=dim)[rank]
        blocks = widths if dim == 0 else [shape[1]]
        place = ParamPlace("w", shape, dim, tp_segments(blocks, tp=tp, rank=rank))
        assert place.local_shape == tuple(local.shape)
        flat, n = local.reshape(-1), local.numel()
        for lo, hi in ((0, n // 3), (n // 3, n - 2), (n - 2, n)):  # three "shards"
            for p in range_pieces("w", place, flat[lo:hi], lo, hi, write=True):
                box = tuple(slice(o, o + s) for o, s in zip(p.offsets, p.tensor.shape,
                                                           strict=True))
                assert (rebuilt[box] == -1).all()  # every element once
                rebuilt[box] = p.tensor
    assert torch.equal(rebuilt, whole)


def _pieces(values, cuts):
    """`values` (one whole tensor "w" and a step) as pieces cut at the rows `cuts`."""
    out, edges = [], [0, *cuts, values.shape[0]]
    for a, b in zip(edges, edges[1:], strict=False):
        out.append(Piece("w", tuple(values.shape), (a, 0), values[a:b]))
    return [*out, Piece("state.w.step", (), (), torch.tensor(3.0))]


def test_a_checkpoint_loads_under_other_boxes(tmp_path):
    """Saved in boxes of rows 0-2 / 2-7, loaded into boxes 0-5 / 5-7: DCP reads the
    overlaps (the resharding every layout change relies on)."""
    plan = _plan()
    values = torch.arange(21, dtype=torch.float32).view(7, 3)
    checkpoint.save(str(tmp_path), 4, _pieces(values, [2]), plan=plan)
    target = torch.zeros(7, 3)
    into = _pieces(target, [5])
    into[-1].tensor.zero_()
    found = checkpoint.resume(str(tmp_path), into, plan=plan)
    assert found is not None and found.step == 4
    assert found.note == f"resume: from step 4 ({tmp_path / 'step-00000004'})"
    assert torch.equal(target, values) and into[-1].tensor.item() == 3.0


def test_a_checkpoint_that_lacks_a_tensor_is_not_loaded(tmp_path):
    plan = _plan()
    checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), []), plan=plan)
    want = [*_pieces(torch.zeros(4, 2), []), Piece("v", (2,), (0,), torch.zeros(2))]
    with pytest.raises(checkpoint.CheckpointError, match=r"step 2: it holds no tensor v\)"):
        checkpoint.resume(str(tmp_path), want, plan=plan)


class _RunsCode:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_metadata_unpickles_dcp_classes_only(tmp_path):
    """Even under a marker that matches it, a pickle naming anything but DCP's metadata
    classes is refused before it can run."""
    plan = _plan()
    folder = checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), [1]), plan=plan)
    marker = checkpoint.read_marker(folder, 2)
    md = checkpoint.read_metadata(folder, marker["files"])  # DCP's own pickle reads
    assert set(md.state_dict_metadata) == {"w", "state.w.step"}
    sentinel = tmp_path / "code-ran"
    with open(os.path.join(folder, ".metadata"), "wb") as fh:
        pickle.dump(_RunsCode(str(sentinel)), fh)
    with pytest.raises(checkpoint.CheckpointError, match="posix.mkdir is not allowed"):
        checkpoint.read_metadata(folder, marker["files"])
    assert not sentinel.exists()


def test_metadata_may_point_only_into_the_listed_files(tmp_path):
    plan = _plan()
    folder = checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), [1]), plan=plan)
    files = dict(checkpoint.read_marker(folder, 2)["files"])
    shard = next(n for n in files if n.endswith(".distcp"))
    del files[shard]
    with pytest.raises(checkpoint.CheckpointError, match=f"points at '{shard}'"):
        checkpoint.read_metadata(folder, files)


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda m: m["files"].update({"../outside": m["files"][".metadata"]}),
     "file name '../outside' is not a plain name"),
    (lambda m: m.update(step=6), "step 6, the folder's is 2"),
    (lambda m: m["files"].pop(".metadata"), "no file list with .metadata"),
    (lambda m: m["files"][".metadata"].update(sha256="x"), ".metadata: no SHA-256 and size"),
    (lambda m: m.pop("format"), "not a trainplan-checkpoint/2 marker"),
])
def test_a_marker_is_checked_before_it_is_used(tmp_path, edit, problem):
    plan = _plan()
    folder = checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), [1]), plan=plan)
    path = os.path.join(folder, checkpoint.COMPLETE)
    with open(path, encoding="utf-8") as fh:
        marker = json.load(fh)
    edit(marker)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(marker, fh)
    with pytest.raises(checkpoint.CheckpointError, match=problem):
        checkpoint.read_marker(folder, 2)


@pytest.mark.parametrize(("data", "kind"), [(b"\xff\xfe\x00garbage", "UnicodeDecodeError"),
                                          (b"[" * 100_000, "RecursionError"),
                                          (b'{"format": ', "JSONDecodeError")])
def test_a_marker_that_does_not_read_is_refused(tmp_path, data, kind):
    plan = _plan()
    folder = checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), [1]), plan=plan)
    with open(os.path.join(folder, checkpoint.COMPLETE), "wb") as fh:
        fh.write(data)
    with pytest.raises(checkpoint.CheckpointError, match=f"does not read \\({kind}\\)"):
        checkpoint.read_marker(folder, 2)


def test_every_file_is_hashed_in_the_marker(tmp_path):
    plan = _plan()
    folder = checkpoint.save(str(tmp_path), 2, _pieces(torch.ones(4, 2), [1]), plan=plan)
    files = checkpoint.read_marker(folder, 2)["files"]
    assert set(files) == set(os.listdir(folder)) - {checkpoint.COMPLETE}
    for name, info in files.items():
        with open(os.path.join(folder, name), "rb") as fh:
            data = fh.read()
        assert info == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
