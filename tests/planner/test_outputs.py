"""Outputs are checked before work starts and written whole or not at all."""

import os

import pytest

from planner.outputs import (
    PLAN_SUFFIXES,
    atomic_path,
    check_distinct,
    check_output_dir,
    check_output_file,
    write_text,
)
from profiler.schema import SpecError


@pytest.mark.parametrize("name, suffixes, message", [
    ("notes.txt", PLAN_SUFFIXES, "'notes.txt' is not allowed (a .yaml, .yml, .json file)"),
    ("missing/p.yaml", PLAN_SUFFIXES, "(folder 'missing' does not exist)"),
    ("folder", None, "(a file, not a folder)"),
    ("folder.yaml", PLAN_SUFFIXES, "(a file, not a folder)"),
    ("", None, "'' is not allowed (a file name)"),
])
def test_bad_output_files_are_refused(tmp_path, monkeypatch, name, suffixes, message):
    monkeypatch.chdir(tmp_path)
    os.mkdir("folder")
    os.mkdir("folder.yaml")
    with pytest.raises(SpecError) as err:
        check_output_file(name, flag="-o", suffixes=suffixes)
    assert str(err.value).startswith("-o: ") and message in str(err.value)


def test_a_special_file_is_not_an_output(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")
    with pytest.raises(SpecError, match="a regular file"):
        check_output_file(str(tmp_path / "dangling.json"), flag="--trace")
    with pytest.raises(SpecError, match="a regular file"):
        check_output_file("/dev/null", flag="-o")


def test_output_folders(tmp_path):
    (tmp_path / "file").write_text("x")
    check_output_dir(str(tmp_path / "new" / "deeper"), flag="-o")  # created later
    with pytest.raises(SpecError, match=r"-o: .* is not allowed \(a folder, not a file\)"):
        check_output_dir(str(tmp_path / "file"), flag="-o")
    with pytest.raises(SpecError, match=r"is a file, not a folder"):
        check_output_dir(str(tmp_path / "file" / "sub"), flag="-o")


def test_names_the_file_system_allows_and_only_those(tmp_path):
    """A 245-character name (allowed) failed at the end of the work: its temporary name
    passed 255 bytes; a name past the limit is refused before the work."""
    longest = "a" * 250 + ".yaml"  # 255 bytes
    check_output_file(str(tmp_path / longest), flag="-o", suffixes=PLAN_SUFFIXES)
    write_text(str(tmp_path / longest), "new")
    assert os.listdir(tmp_path) == [longest] and (tmp_path / longest).read_text() == "new"
    with pytest.raises(SpecError, match=r"-o: .* is not allowed \(names of at most 255 "
                                        r"bytes each, the file system's limit; one here "
                                        r"has 257\)"):
        check_output_file(str(tmp_path / ("é" * 126 + ".yaml")), flag="-o")
    with pytest.raises(SpecError, match=r"one here has 300\)"):
        check_output_dir(str(tmp_path / ("d" * 300) / "report"), flag="-o")
    # an extension of most of the name: the temporary name leaves it out (it was cut
    # character by character from an empty stem for ever)
    for name in ("a." + "x" * 240, "." + "y" * 250):
        write_text(str(tmp_path / name), "text")
        assert (tmp_path / name).read_text() == "text"


def test_two_outputs_may_not_be_one_file(tmp_path):
    with pytest.raises(SpecError, match=r"--trace: .* \(the same file as -o\)"):
        check_distinct({"-o": str(tmp_path / "a.json"), "--trace": str(tmp_path / "a.json")})
    check_distinct({"-o": str(tmp_path / "a.json"), "--trace": None})


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.yaml"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(str(path)) as tmp:
        assert tmp.endswith(".yaml") and os.path.dirname(tmp) == str(tmp_path)
        with open(tmp, "w") as fh:
            fh.write("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.yaml"]
    write_text(str(path), "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.yaml"]


@pytest.mark.parametrize("command", ["simulate", "search"])
def test_an_output_is_never_a_file_the_command_reads(tmp_path, capsys, command):
    """`-o` naming the --cluster file wrote a plan over the user's cluster."""
    import shutil

    from tests.planner.cli_helpers import run_cli

    cluster = tmp_path / "c.yaml"
    shutil.copy("cluster_specs/selene-a100.yaml", cluster)
    before = cluster.read_text()
    layout = ["--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "1"] if command == "simulate" else []
    code, _, err = run_cli([command, "--model", "gpt3-1.3b", "--cluster", str(cluster),
                            "--gbs", "8", *layout, "-o", str(cluster)], capsys)
    assert code == 2 and "-o: " in err and "(the same file as --cluster)" in err, err
    assert cluster.read_text() == before


def test_a_folder_that_takes_no_file_is_refused_before_the_work(tmp_path, monkeypatch):
    """Permission bits do not tell /proc, /sys, a read-only mount or a full disk: as root
    `--trace /proc/x.json` passed the check, ran the whole simulation, then died writing
    with a traceback. The check now makes (and removes) a file there."""
    import errno
    import tempfile

    from planner.outputs import check_output_dir, check_output_file
    from profiler.schema import SpecError

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    check_output_file(str(tmp_path / "t.json"), flag="--trace")
    assert not list(tmp_path.iterdir())  # the probe is gone
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(SpecError, match="is not writable \\(Read-only file system\\)"):
        check_output_file(str(tmp_path / "t.json"), flag="--trace")
    with pytest.raises(SpecError, match="is not writable \\(Read-only file system\\)"):
        check_output_dir(str(tmp_path / "report"), flag="-o")
