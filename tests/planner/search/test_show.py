"""The search table's cells."""

from planner.search.show import _free_cell

GIB = 1024**3


def test_free_memory_below_the_headroom_never_rounds_up_to_it():
    """1.96 GiB free under a 2 GiB headroom read '2.0 !' beside 'less than the 2.0 GiB of
    free memory asked for'."""
    assert _free_cell(1.96 * GIB, True) == "1.9 !"
    assert _free_cell(1.96 * GIB, False) == "2.0  "
    assert _free_cell(12.74 * GIB, False) == "12.7  "


def test_under_a_budget_each_gpu_count_of_a_layout_is_a_leader():
    """`plan search --objective time-to-train --max-budget` on 1,024 H100: tp 4 pp 2 on
    256 GPUs led its shape, the simulation put it over the budget, and the same layout on
    128 GPUs (within it) had never been confirmed: one row where two layouts fit."""
    from types import SimpleNamespace

    from planner.search.search import _leaders

    def ev(tp: int, pp: int, gpus: int) -> SimpleNamespace:
        return SimpleNamespace(layout=SimpleNamespace(tp=tp, cp=1, pp=pp, ep=1,
                                                      num_gpus=gpus))

    ranked = [ev(4, 4, 256), ev(4, 2, 256), ev(4, 4, 128), ev(4, 2, 128), ev(8, 1, 256)]
    plain = _leaders(ranked, confirm=1, shapes=3)
    assert [(e.layout.pp, e.layout.num_gpus) for e in plain] == [(4, 256), (2, 256), (1, 256)]
    budget = _leaders(ranked, confirm=1, shapes=3, by_gpus=True)
    assert [(e.layout.pp, e.layout.num_gpus) for e in budget] == [
        (4, 256), (2, 256), (4, 128), (2, 128), (1, 256)]


def test_a_split_that_is_no_zero_stage_reads_in_amsp_notation_in_the_table():
    """AMSP (Chen et al., 2023) names the three states P, G and OS; the long form
    ('params 2, grads 2, optim 16') made the README's llama3-70b cost search 120 columns."""
    from planner.describe import sharding_cell
    from planner.specs.plan import Sharding

    split = Sharding(params=2, grads=2, optim=16)
    assert sharding_cell(split, 16, compact=True) == "P2 G2 OS16"
    assert sharding_cell(split, 16) == "params 2, grads 2, optim 16"
    assert sharding_cell(Sharding(params=1, grads=1, optim=16), 16, compact=True) == "ZeRO-1"
    assert sharding_cell(Sharding(params=1, grads=8, optim=8), 16, compact=True) == "G8 OS8"


def test_the_readmes_cost_search_fits_100_columns(capsys):
    """README's first search (llama3-70b on 128 H100, objective cost, --tokens) with a
    plan that splits each state differently among its rows."""
    from planner.search.show import WIDTH
    from tests.planner.cli_helpers import run_cli

    code, out, _ = run_cli(["search", "--model", "llama3-70b", "--cluster",
                            "cluster_specs/dgx-h100.yaml", "--gbs", "1024", "--objective",
                            "cost", "--tokens", "2e12", "--top", "5"], capsys)
    assert code == 0 and "run $" in out
    assert max(len(line) for line in out.splitlines()) <= WIDTH
