"""Running the `plan` command line in-process, as the CLI tests do."""

from planner.cli import main


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of `plan ARGV`; argparse's exits count as exit codes."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
