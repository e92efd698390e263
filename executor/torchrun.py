"""`torchrun`, as `plan run` starts it: the same entry point and arguments, without the
launcher's traceback when a rank fails (the ranks have said which and why; `plan run`
repeats the first in one line). Exit code 1 then, as torchrun's. Stopped by SIGTERM or
Ctrl-C (`plan run` interrupted), it stops the ranks as torchrun does and exits 128 + the
signal, without a traceback."""

from __future__ import annotations

import os
import signal
import sys


def _exit_quietly(*_: object) -> None:
    """Ctrl-C where there is nothing to stop: exit 130 at once, without unwinding."""
    os._exit(130)


if __name__ == "__main__":  # Ctrl-C while this loads (seconds on a busy host): no rank yet,
    # nothing to clean up. Exits at once: a SystemExit raised inside torch's import (a
    # Python call from its C++ initialisers) aborted the process with SIGABRT (-6) at
    # 0.4 s in a `make test` run here (2026-12-04, under the parallel suite's load)
    signal.signal(signal.SIGINT, _exit_quietly)

import logging  # noqa: E402  # after the handler: an interrupted import printed a traceback

__all__: list[str] = []  # a program, not a library

if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    signal.signal(signal.SIGINT, signal.default_int_handler)  # torchrun's agent takes over
    # its warnings (the ranks it stops, the signal it got) are `plan run`'s to say
    logging.getLogger("torch.distributed.elastic").setLevel(os.environ.get("LOGLEVEL", "ERROR"))
    try:
        main(sys.argv[1:])
    except ChildFailedError:
        sys.exit(1)
    except SignalException as stop:  # the ranks are stopped by now
        sys.exit(128 + int(stop.sigval))
    except KeyboardInterrupt:  # before the agent's own handlers, so before any rank
        sys.exit(130)
    finally:  # the agent is done: Ctrl-C while the interpreter exits (its atexit
        # callbacks; torch's printed a KeyboardInterrupt traceback, 2026-12-04) is an exit
        signal.signal(signal.SIGINT, _exit_quietly)
