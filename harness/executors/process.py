"""Cases in a spawned worker process, reused across cases (and their built models: harness.engine.models.MODELS).

A hang is killed at the per-case timeout (``timeout``), a worker that dies (a signal, a segfault, an
exit) is recorded against its case — ``oom`` only when the kernel recorded an out-of-memory kill meanwhile,
else ``crashed`` (:mod:`harness.executors.deaths`) — and the sweep goes on in a new worker. A Python exception or a caught out-of-memory is the case's result and the worker stays;
only an error that poisons its CUDA context (:func:`harness.executors.base.poisons_worker`)
replaces it.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.spawn as spawn
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection

from harness.contract import registry
from harness.executors.base import interleave_groups, poisons_worker
from harness.executors.deaths import death_record, read_oom_kills
from harness.engine.env import die_with_parent, freeze_heap
from harness.engine.replicate import imprecise, merge_processes, per_process_timing
from harness.engine.runner import RunOptions, run_case, run_group
from harness.contract.records import CaseRecord
from harness.contract.spec import Case

_CTX = mp.get_context("spawn")   # never fork: CUDA and OpenMP state do not survive it
WORKER_NAME = "bench-worker"
_START_TIMEOUT_S = 120.0
log = logging.getLogger("bench")


def _worker(conn: Connection) -> None:
    die_with_parent()
    registry.list_archs()     # import the built-in and installed architectures before the first case is timed
    freeze_heap()             # the imports stay out of the collections before each measurement
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        what, opts = job
        conn.send(run_group(what, opts) if isinstance(what, list) else run_case(what, opts))


def skip_main_in_workers() -> None:
    """From now on a spawned bench worker (a process named :data:`WORKER_NAME`) does not re-run this process's
    ``__main__``, as spawn otherwise does: for the ``bench`` command that is its console script, whose import is
    the whole command line (pandas, matplotlib, scipy, the reports): seconds of a worker's start for nothing it
    uses — a worker runs :func:`_worker`, the registry's zoo and the ``--plugin`` files only. Called by the command
    line (``cli.app``); a script that registers architectures in its own ``__main__`` and spawns workers through
    the Python API keeps spawn's behaviour. Other processes keep it too. Idempotent."""
    if getattr(spawn.get_preparation_data, "bench_skips_main", False):
        return
    prepare = spawn.get_preparation_data

    def preparation_data(name: str) -> dict:
        data = prepare(name)
        if name == WORKER_NAME:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data
    preparation_data.bench_skips_main = True            # type: ignore[attr-defined]
    spawn.get_preparation_data = preparation_data


_prestarted: list[tuple[mp.process.BaseProcess, Connection]] = []


def prestart() -> None:
    """Spawn one worker now without waiting for it (it imports torch and the zoo meanwhile): the next
    :class:`ProcessExecutor` takes it instead of spawning its own, so the worker's start overlaps what the parent
    does in between (the run's calibration). At most one is kept; a daemon, it dies with this process."""
    if _prestarted:
        return
    parent, child = _CTX.Pipe()
    proc = _CTX.Process(target=_worker, args=(child,), daemon=True, name=WORKER_NAME)
    proc.start()
    child.close()
    _prestarted.append((proc, parent))


class ProcessExecutor:
    def __init__(self) -> None:
        self.proc: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.startup_s = 0.0      # spawning workers until each said ready (harness.engine.overhead)
        self.starts = 0

    def _start(self) -> None:
        t0 = time.perf_counter()
        try:
            self._spawn()
        finally:
            self.startup_s += time.perf_counter() - t0
            self.starts += 1

    def _spawn(self) -> None:
        if _prestarted:                        # a worker started earlier (prestart): wait only for what is left
            self.proc, parent = _prestarted.pop()
        else:
            parent, child = _CTX.Pipe()
            self.proc = _CTX.Process(target=_worker, args=(child,), daemon=True, name=WORKER_NAME)
            self.proc.start()
            child.close()
        self.conn = parent
        try:
            ready = parent.poll(_START_TIMEOUT_S) and parent.recv() == "ready"
        except (EOFError, OSError):          # the worker died while starting (e.g. a plug-in failed to import)
            ready = False
        if not ready:
            self.proc.join(5)
            code = self.proc.exitcode
            self._stop()
            raise RuntimeError(f"the benchmark worker process did not start (exit code {code}); "
                               "its own error is printed above")

    def _stop(self) -> None:
        started = self.proc is not None and self.proc.pid is not None     # a failed start has no process
        if started and self.proc.is_alive():
            self.proc.kill()
        if started:
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        if opts.processes > 1:
            yield from self._replicated(cases, opts)
            return
        yield from self._run(cases, opts)

    def _replicated(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        """``opts.processes`` passes over ``cases``, each in a fresh worker with 1/N of the timing budget
        (:func:`harness.engine.replicate.per_process_timing`); then, up to ``opts.max_processes``, more passes over
        the groups whose interval over processes is still wider than ×/÷ ``opts.precision``
        (:func:`harness.engine.replicate.imprecise`: side-by-side groups stay whole, so their processes stay
        paired). Per case the records are merged (:func:`harness.engine.replicate.merge_processes`) and yielded
        once its group's last pass is done."""
        n = opts.processes
        one = dataclasses.replace(opts, processes=1, max_processes=0, timing=per_process_timing(opts.timing, n))
        replica = dataclasses.replace(one, replica=True)
        groups = interleave_groups(cases) if opts.interleave else [[c] for c in cases]
        parts: dict[str, list[CaseRecord]] = {c.key: [] for c in cases}
        todo = list(range(len(groups)))
        for i in range(max(n, opts.max_processes)):
            if i >= n:
                todo = [todo[j] for j in imprecise([[c.key for c in groups[g]] for g in todo], parts, opts.precision)]
                if not todo:
                    break
            self._stop()                          # a fresh process for every pass
            # the counting, memory and energy passes once, in the first process (merge_processes keeps its)
            for rec in self._run_groups([groups[g] for g in todo], one if i == 0 else replica):
                parts[rec.case_key].append(rec)
            log.info("process %d of %s done (%d cases%s)", i + 1, n if i < n else f"up to {opts.max_processes}",
                     sum(len(groups[g]) for g in todo),
                     "" if i < n else f" whose interval was wider than ×/÷{opts.precision:g}")
        self._stop()
        for c in cases:
            yield merge_processes(parts[c.key])

    def _run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        yield from self._run_groups(interleave_groups(cases) if opts.interleave else [list(cases)], opts)

    def _run_groups(self, groups: Sequence[Sequence[Case]], opts: RunOptions) -> Iterator[CaseRecord]:
        """Each group side by side in one worker (``opts.interleave``; a group of one alone), else case by case."""
        for group in groups:
            if not opts.interleave or len(group) == 1:
                yield from self._each(group, opts)
                continue
            self._ensure()
            records = self._group(list(group), opts)
            if records is None:       # the worker died or hung: each case alone, so the one at fault is found
                self._stop()
                yield from self._each(group, opts)
                continue
            if any(poisons_worker(r.message) for r in records if r.status == "error"):
                self._stop()
            yield from records

    def _ensure(self) -> None:
        if self.proc is None or not self.proc.is_alive():
            self._stop()
            self._start()

    def _each(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        for case in cases:
            self._ensure()
            rec = self._one(case, opts)       # a timeout or a crash has stopped the worker already
            if rec.status == "error" and poisons_worker(rec.message):
                self._stop()                  # its CUDA context is unusable: a fresh worker for the next case
            yield rec

    def _group(self, group: list[Case], opts: RunOptions) -> list[CaseRecord] | None:
        """The group's records from one worker, or None when it died or ran past the group's timeout."""
        assert self.conn is not None
        self.conn.send((list(group), opts))
        if not self.conn.poll(opts.timeout_s * len(group)):
            return None
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def _one(self, case: Case, opts: RunOptions) -> CaseRecord:
        assert self.conn is not None and self.proc is not None
        kills = read_oom_kills()
        self.conn.send((case, opts))
        if not self.conn.poll(opts.timeout_s):
            self._stop()
            return case.record("timeout", f"no result within the {opts.timeout_s:g} s timeout",
                               duration_s=opts.timeout_s)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self._stop()
            return death_record(case, code, kills, read_oom_kills())

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
        self._stop()
