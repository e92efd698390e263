"""Ctrl-C while `plan run` starts its ranks: one line from `plan run`, no traceback from
torchrun or the ranks (torchrun's agent forwards SIGINT to the ranks; both were in the
middle of importing torch and printed a KeyboardInterrupt traceback each)."""

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")


def test_a_rank_ends_quietly_on_sigint():
    from executor.worker import main

    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # the arguments are checked after the handler
            main(["--steps", "x"])
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("delay_s", [0.05, 0.3])
def test_torchrun_interrupted_while_torch_loads_says_nothing(delay_s):
    proc = subprocess.Popen([sys.executable, "-m", "executor.torchrun", "--help"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # 0: torch had loaded and --help was done; -2: before Python set its own handler
    assert proc.returncode in (0, 130, -signal.SIGINT)
