"""Typed flags: every number a flag takes is ASCII, finite and inside its documented range."""

import argparse

import pytest

from planner.commands.args import gbs_arg, int_in, int_list, number_in, path_arg, tokens_arg


@pytest.mark.parametrize("text, message", [
    ("nan", "'nan' is not allowed (a finite number)"),
    ("inf", "'inf' is not allowed (a finite number)"),
    ("-inf", "'-inf' is not allowed (a finite number)"),
    ("1e999", "'1e999' is not allowed (a finite number)"),
    ("١٢", "is not allowed (a finite number)"),  # float() would read Arabic-Indic digits
    ("-3", "-3.0 is not allowed (must be > 0)"),
    ("0", "0.0 is not allowed (must be > 0)"),
    ("1e30", "1e+30 is not allowed (must be ≤ 1e+17)"),
])
def test_numbers_are_finite_and_bounded(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(")
                       .replace(")", r"\)").replace("+", r"\+")):
        tokens_arg(text)


def test_number_in_keeps_good_values():
    assert tokens_arg("2e12") == 2e12
    assert number_in(low=0, high=1)("0") == 0.0


@pytest.mark.parametrize("parse, text, message", [
    (gbs_arg, "1000000000", "1000000000 is not allowed (must be ≤ 65,536)"),
    (gbs_arg, "1e9", "'1e9' is not an integer"),
    (gbs_arg, "²", "'²' is not an integer"),
    (gbs_arg, "0", "0 is not allowed (must be ≥ 1)"),
    (gbs_arg, "9" * 5000, "is not allowed (must be ≤ 65,536)"),  # a whole number, too large
    (gbs_arg, "99999999999999999999", "is not allowed (must be ≤ 65,536)"),
    (gbs_arg, "-99999999999999999999", "is not allowed (must be ≥ 1)"),
    (int_list, "1,²", "is not a comma-separated list"),
    (int_list, ",".join(["1"] * 100), "at most 64 integers"),
    (path_arg, "", "'' is not allowed (a file name)"),
])
def test_integers_and_names(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    assert message in str(err.value)
    assert len(str(err.value)) < 200


def test_int_in_keeps_good_values():
    assert int_in(1, 8)(" 8 ") == 8 and gbs_arg("65536") == 65536


def test_profile_sizes_are_bounded(capsys):
    """`plan profile --collectives --nprocs 100000` would have spawned 100,000 processes."""
    from tests.planner.cli_helpers import run_cli

    for flags, needle in ((["--collectives", "--nprocs", "100000"],
                           "argument --nprocs: 100000 is not allowed (must be ≤ 256)"),
                          (["--model", "debug-tiny", "--mbs", "1,999999"],
                           "argument --mbs: '1,999999' is not allowed (each must be ≤ 65,536)"),
                          (["--model", "debug-tiny", "--repeats", "10000000"],
                           "must be ≤ 100,000")):
        code, out, err = run_cli(["profile", *flags, "-o", "p.csv"], capsys)
        assert code == 2 and needle in err and err.count("\n") == 1, err
