"""Cases in a spawned worker process, reused across cases and restarted after any failure.

A hang is killed at the per-case timeout (``timeout``), a worker that dies (the kernel's OOM
killer sends SIGKILL; a segfault) is recorded against its case, and the sweep goes on.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import signal
import sys
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection

from harness.runner import RunOptions, run_case
from harness.spec import Case, Record

_CTX = mp.get_context("spawn")   # never fork: CUDA and OpenMP state do not survive it
_START_TIMEOUT_S = 120.0


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker if the parent dies (e.g. ``kill -9``)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def _worker(conn: Connection) -> None:
    _die_with_parent()
    import architectures  # noqa: F401  (import once, before the first case is timed)
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        case, opts = job
        conn.send(run_case(case, opts))


class ProcessExecutor:
    def __init__(self) -> None:
        self.proc: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None

    def _start(self) -> None:
        parent, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=_worker, args=(child,), daemon=True, name="bench-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(_START_TIMEOUT_S) or parent.recv() != "ready":
            self._stop()
            raise RuntimeError("the benchmark worker process did not start")

    def _stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[Record]:
        for case in cases:
            if self.proc is None or not self.proc.is_alive():
                self._stop()
                self._start()
            rec = self._one(case, opts)
            if rec.status != "ok":
                self._stop()          # a fresh worker after any failure: no leaked state
            yield rec

    def _one(self, case: Case, opts: RunOptions) -> Record:
        assert self.conn is not None and self.proc is not None
        self.conn.send((case, opts))
        if not self.conn.poll(opts.timeout_s):
            self._stop()
            return Record.for_case(case, "timeout", f"no result within the {opts.timeout_s:g} s timeout",
                                   duration_s=opts.timeout_s)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            if code == -signal.SIGKILL:
                return Record.for_case(case, "oom", "worker was killed (SIGKILL), most likely by the "
                                                    "kernel's out-of-memory killer")
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            return Record.for_case(case, "error", f"worker process died ({how})")

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
        self._stop()
