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
