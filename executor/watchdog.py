"""Failure detection: a rank that dies, fails or hangs stops every other rank, and each
says which rank it was.

Every rank runs a heartbeat thread that writes its state to the rendezvous store (the
one torchrun's agent hosts) once a second and reads everyone else's:

* a rank that raised publishes its error: the others stop at once, naming it;
* a rank whose heartbeat stopped changing for `STALE_S` died or froze (on the same host
  its process is checked directly: "exited");
* when this rank has made no progress (passes run) for `hang_timeout_s`, the rank to
  blame is one that is stuck outside communication: each heartbeat says whether the
  rank's main thread is inside torch.distributed (waiting for others) and where it is.
  If every stuck rank waits, the one that has waited longest is named. Setup and
  checkpoint phases are exempt.
* torchrun stops the survivors with SIGTERM when a local rank dies; the signal wakes this
  thread (not the main thread, which may be blocked in a collective), which names the
  dead rank before exiting.

Times are measured on this host from when a peer's counters last changed, so clocks of
other hosts do not matter. The stopping rank prints one line to stderr, writes it to
`<run dir>/stop-rank<r>.json` (the launcher reports the first one) and exits with
`EXIT_PEER_FAILED`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch.distributed as dist

from executor.launch import STOP_REQUESTED

__all__ = ["EXIT_FAILED", "EXIT_PEER_FAILED", "STALE_S", "Watchdog"]

EXIT_FAILED = 1  # this rank raised
EXIT_PEER_FAILED = 3  # this rank stopped because another one failed
STALE_S = 10.0  # no heartbeat for this long: the rank is dead or frozen
INTERVAL_S = 1.0
EXEMPT = ("setup", "checkpoint")  # phases that may legitimately take long
PREFIX = "trainplan/heartbeat/"
_WAITS = ("recv", "wait_sends")  # executor/pipeline.py: blocking waits on other ranks


@dataclass
class _Peer:
    beat: int = -1
    progress: int = -1
    beat_seen_s: float = field(default_factory=time.monotonic)
    progress_seen_s: float = field(default_factory=time.monotonic)
    state: dict = field(default_factory=dict)


class Watchdog:
    """Heartbeats and failure naming for one rank (see the module docstring)."""

    def __init__(self, *, rank: int, names: list[str], run_dir: str,
                 hang_timeout_s: float) -> None:
        self.rank, self.names, self.run_dir = rank, names, run_dir
        self.hang_timeout_s = hang_timeout_s
        self.host = socket.gethostname()
        self._beat, self._progress = 0, 0
        self._progress_s = time.monotonic()
        self._what, self._phase, self._error = "starting", "setup", ""
        self._stopping = ""  # why this rank is stopping (others adopt the cause)
        self._peers = {r: _Peer() for r in range(len(names)) if r != rank}
        self._store: dist.Store | None = None
        self._lock = threading.Lock()  # the main thread reads too, in fail()
        self._wake_r, self._wake_w = os.pipe()
        self._stopped = threading.Event()
        # held by the thread that reports why this rank stops, until it exits the process
        # (the watchdog's `_stop` and the main thread's `fail` can both get there; a second
        # waits for that exit): two threads writing one note left it half of each
        # ('{..."cause": "..."}"}', a clean clone's make test, 2026-12-07)
        self._exiting = threading.Lock()

    # ---- the main thread's side ---------------------------------------------------
    def start(self) -> None:
        """Connect to the store and publish the first heartbeat (from the main thread,
        once the process group exists)."""
        self._store = dist.PrefixStore(PREFIX, _store_client())
        self._publish()

    def watch(self) -> None:
        """Watch the others in a daemon thread (after a barrier: all have published).
        SIGTERM then wakes the thread instead of killing the process."""
        os.set_blocking(self._wake_w, False)
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(self._wake_w)
        threading.Thread(target=self._loop, name="trainplan-watchdog", daemon=True).start()

    def stop(self) -> None:
        """The run is over: stop watching (the store may go away with rank 0 now)."""
        self._stopped.set()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def progress(self, what: str) -> None:
        self._progress += 1
        self._progress_s = time.monotonic()
        self._what = what

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase that may take long (setup, checkpoint); training resumes after it."""
        self._phase = name
        self.progress(name)
        try:
            yield
        finally:
            self._phase = "train"
            self.progress(f"end of {name}")

    def fail(self, error: BaseException, details: str) -> None:
        """This rank raised. A collective broken by a rank that died raises too: then name
        the rank that failed first (waiting up to a heartbeat timeout to see it); else
        print `details` (the traceback; none for an error said in one line), publish this
        error, and exit."""
        broken = _in_torch_distributed(error)
        culprit = self._wait_for_culprit(STALE_S + 2 * INTERVAL_S if broken else INTERVAL_S)
        if culprit is not None:
            self._stop(*culprit)
        self._exiting.acquire()  # a watchdog stopping this rank meanwhile says why, and exits
        if details:
            print(details, file=sys.stderr, flush=True)
        self._error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        with contextlib.suppress(Exception):
            self._publish()
        line = f"{self.names[self.rank]} failed: {self._error}"
        self._report(line, cause=line)
        time.sleep(2 * INTERVAL_S)  # let the others read it before the store may go
        os._exit(EXIT_FAILED)

    # ---- the thread -----------------------------------------------------------------
    def _publish(self) -> None:
        assert self._store is not None
        self._beat += 1
        waiting, where = _main_thread_state()
        state = json.dumps({"beat": self._beat, "progress": self._progress,
                            "waiting": waiting, "where": where, "what": self._what,
                            "phase": self._phase, "error": self._error,
                            "stopping": self._stopping, "pid": os.getpid(), "host": self.host})
        with self._lock:
            self._store.set(str(self.rank), state)

    def _loop(self) -> None:
        while True:
            woke, _, _ = select.select([self._wake_r], [], [], INTERVAL_S)
            if self._stopped.is_set():
                return
            terminated = bool(woke)
            try:
                self._publish()
                culprit = self._check()
            except Exception as err:  # the store went away: whoever hosted it is gone
                culprit = (None, f"lost the rendezvous store ({type(err).__name__}); the "
                           "launcher or rank 0 is gone")
            if culprit is None and terminated:
                culprit = self._dead_local() or (None, "was terminated by the launcher")
            if culprit is not None:
                if os.path.exists(os.path.join(self.run_dir, STOP_REQUESTED)):
                    # `plan run` stopped the ranks (a peer that went first included), and
                    # says so once
                    os._exit(EXIT_PEER_FAILED)
                self._stop(*culprit)

    def _read(self) -> None:
        assert self._store is not None
        keys = [str(r) for r in self._peers]
        with self._lock:
            values = self._store.multi_get(keys)
        now = time.monotonic()
        for r, raw in zip(self._peers, values, strict=True):
            peer, state = self._peers[r], json.loads(raw)
            if state["beat"] != peer.beat:
                peer.beat, peer.beat_seen_s = state["beat"], now
            if state["progress"] != peer.progress:
                peer.progress, peer.progress_seen_s = state["progress"], now
            peer.state = state

    def _check(self) -> tuple[int | None, str] | None:
        """The rank to blame and what happened to it, or None if all is well."""
        self._read()
        said = self._said()
        if said is not None:
            return said
        dead = self._dead_local()
        if dead is not None:
            self._read()  # it may have said why just before it exited
            return self._said() or dead
        now = time.monotonic()
        for r, peer in self._peers.items():
            if now - peer.beat_seen_s > STALE_S:
                return r, f"stopped responding (no heartbeat for {now - peer.beat_seen_s:.0f} s)"
        return self._hang(now)

    def _said(self) -> tuple[int | None, str] | None:
        """A rank that published its own error, or the cause another rank stops for."""
        for r, peer in self._peers.items():
            if peer.state.get("error"):
                return r, f"failed: {peer.state['error']}"
        for peer in self._peers.values():
            if peer.state.get("stopping"):
                return None, peer.state["stopping"]
        return None

    def _hang(self, now: float) -> tuple[int, str] | None:
        if self._phase in EXEMPT or now - self._progress_s < self.hang_timeout_s:
            return None
        waiting, where = _main_thread_state()
        stuck = {r: (p.state.get("waiting", True), p.state.get("where", "?"),
                     now - p.progress_seen_s)
                 for r, p in self._peers.items() if p.state.get("phase") not in EXEMPT
                 and now - p.progress_seen_s >= INTERVAL_S}
        stuck[self.rank] = (waiting, where, now - self._progress_s)
        busy = [r for r, (w, _, _) in stuck.items() if not w]
        if busy:
            r = max(busy, key=lambda q: (stuck[q][2], -q))  # stuck longest
            return r, (f"made no progress for {stuck[r][2]:.0f} s outside communication "
                       f"(at {stuck[r][1]})")
        r = max(stuck, key=lambda q: (stuck[q][2], -q))
        return r, (f"made no progress for {stuck[r][2]:.0f} s; every rank waits on "
                   f"communication, this one longest (at {stuck[r][1]})")

    def _dead_local(self) -> tuple[int, str] | None:
        """A rank on this host whose process is gone (or a zombie)."""
        for r, peer in self._peers.items():
            pid = peer.state.get("pid")
            if peer.state.get("stopping") or peer.state.get("error"):
                continue  # it exited on purpose, and said why
            if peer.state.get("host") == self.host and pid and not _alive(pid):
                return r, f"exited (pid {pid})"
        return None

    def _wait_for_culprit(self, timeout_s: float) -> tuple[int | None, str] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                found = self._check()
            except Exception:
                return None
            if found is not None and found[0] != self.rank:
                return found
            time.sleep(INTERVAL_S / 4)
        return None

    def _stop(self, culprit: int | None, reason: str) -> None:
        if self._stopped.is_set():
            return  # the run is over: its teardown is not a failure
        self._exiting.acquire()  # the first to stop this rank reports; a second waits
        who = "" if culprit is None else self.names[culprit] + " "
        self._stopping = f"{who}{reason}"
        with contextlib.suppress(Exception):
            self._publish()  # so that the others name the same rank
        self._report(f"{self.names[self.rank]}: stopping: {self._stopping}",
                     cause=self._stopping)
        os._exit(EXIT_PEER_FAILED)

    def _report(self, line: str, *, cause: str) -> None:
        """Say it on stderr, and in a note the launcher reads (`cause`: what went wrong,
        naming the rank)."""
        print(f"[trainplan] {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            # written aside, then renamed: the launcher may read the run dir at any
            # moment (it did, and found an empty note), and never sees half a note
            path = os.path.join(self.run_dir, f"stop-rank{self.rank}.json")
            with open(path + ".part", "w", encoding="utf-8") as fh:
                json.dump({"time": time.time(), "rank": self.rank, "cause": cause}, fh)
            os.replace(path + ".part", path)


def _in_torch_distributed(error: BaseException) -> bool:
    """Whether the error came out of torch.distributed (a broken collective)."""
    tb = error.__traceback__
    while tb is not None:
        if "/torch/distributed/" in tb.tb_frame.f_code.co_filename.replace(os.sep, "/"):
            return True
        tb = tb.tb_next
    return False


def _main_thread_state() -> tuple[bool, str]:
    """Whether the main thread is inside torch.distributed (waiting for other ranks),
    and the innermost place in our code where it is."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    waiting, where = False, "?"
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in path or frame.f_code.co_name in _WAITS:
            waiting = True
        if where == "?" and "/executor/" in path:
            where = f"{os.path.basename(path)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return waiting, where


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _store_client() -> dist.Store:
    """A connection of our own to the rendezvous store (torchrun's agent hosts it at
    MASTER_ADDR:MASTER_PORT), so the thread never shares the process group's."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=datetime.timedelta(seconds=30))
