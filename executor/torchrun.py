"""`torchrun`, as `plan run` starts it: the same entry point and arguments, without the
launcher's traceback when a rank fails (the ranks have said which and why; `plan run`
repeats the first in one line). Exit code 1 then, as torchrun's."""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

__all__: list[str] = []  # a program, not a library

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ChildFailedError:
        sys.exit(1)
