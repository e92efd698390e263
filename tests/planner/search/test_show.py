"""The search table's cells."""

from planner.search.show import _free_cell

GIB = 1024**3


def test_free_memory_below_the_headroom_never_rounds_up_to_it():
    """1.96 GiB free under a 2 GiB headroom read '2.0 !' beside 'less than the 2.0 GiB of
    free memory asked for'."""
    assert _free_cell(1.96 * GIB, True) == "1.9 !"
    assert _free_cell(1.96 * GIB, False) == "2.0  "
    assert _free_cell(12.74 * GIB, False) == "12.7  "
