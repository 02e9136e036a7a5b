"""Two versions of the code timed side by side: a git worktree of REF and this checkout, each in its own
worker process (:mod:`harness.engine.ab_worker`), alternating in rounds per case, a fresh random order per round.

Noise between machines (or between two CI jobs) dwarfs noise within one job, so ``bench check --against REF``
measures the baseline and the candidate in the same job, interleaved: round i of both sides ran back to back, and
the comparison over the pairs of processes (:func:`harness.analysis.comparison.compare_timings`, paired) cancels
what drifted in between. REF runs with this environment's
packages (no second install). REF must have the worker: ``harness/engine/ab_worker.py``, or ``harness/ab_worker.py``
in the commits from ``--against``'s first until the harness was regrouped into folders.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness.engine.env import REPO
from harness.contract.errors import BenchInputError
from harness.instruments.load import ROOT_PID_ENV
from harness.contract.records import CaseRecord
from harness.engine.runner import RunOptions
from harness.contract.spec import Case, workload_dict
from harness.engine.replicate import merge_processes

_START_S = 120.0


def case_dict(case: Case) -> dict[str, Any]:
    return {"suite": case.suite, "line": case.line, "arch": case.arch, "overrides": [list(kv) for kv in case.overrides],
            "workload": workload_dict(case.workload), "metrics": list(case.metrics), "point": case.point}


def record_from(d: dict[str, Any]) -> CaseRecord:
    fields = {f.name for f in dataclasses.fields(CaseRecord)}
    d = {k: v for k, v in d.items() if k in fields}
    for k in ("samples_s", "rounds"):
        d[k] = tuple(d.get(k) or ())
    return CaseRecord(**d)


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached git worktree of ``ref`` of this repository, removed afterwards."""
    def git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if git("rev-parse", "--git-dir").returncode != 0:
        raise BenchInputError(f"{REPO} is not a git checkout: --against needs one", where="--against")
    if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise BenchInputError(f"no commit {ref!r} in this repository", where="--against")
    tmp = Path(tempfile.mkdtemp(prefix="bench-against-"))
    tree = tmp / "ref"
    added = git("worktree", "add", "--detach", str(tree), ref)
    if added.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BenchInputError(f"cannot check out {ref}: {added.stderr.strip().splitlines()[-1]}", where="--against")
    try:
        if worker_module(tree) is None:
            raise BenchInputError(f"{ref} predates `bench check --against` (no harness/engine/ab_worker.py): compare "
                                  "with a baseline file instead", where="--against")
        yield tree
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)


def worker_module(tree: Path) -> str | None:
    """The A/B worker's module in checkout ``tree``: where it is now, or where it was before the harness was
    regrouped into folders (so ``--against`` an older commit still works); None when ``tree`` has none."""
    for parts in (("harness", "engine", "ab_worker"), ("harness", "ab_worker")):
        if tree.joinpath(*parts[:-1], parts[-1] + ".py").exists():
            return ".".join(parts)
    return None


class Side:
    """One version's worker process: ``PYTHONPATH`` at its checkout, spoken to over a socket pair."""

    def __init__(self, name: str, tree: Path, plugins: Sequence[str] = ()) -> None:
        self.name, self.tree, self.plugins = name, tree, tuple(plugins)
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": str(self.tree), "BENCH_AB_FD": str(theirs.fileno()),
               "BENCH_AB_PLUGINS": os.pathsep.join(self.plugins),
               ROOT_PID_ENV: os.environ.get(ROOT_PID_ENV, str(os.getpid()))}
        module = worker_module(self.tree) or "harness.engine.ab_worker"
        self.proc = subprocess.Popen([sys.executable, "-c", f"from {module} import serve; serve()"],
                                     cwd=self.tree, env=env, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.conn = Connection(ours.detach())

    def ask(self, cmd: str, arg: Any = None, extra: Any = None, timeout: float = _START_S) -> tuple[str, Any]:
        """Send one command; ("lost", why) when the worker died or did not answer within ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        assert self.conn is not None
        try:
            self.conn.send((cmd, arg, extra))
            if self.conn.poll(timeout):
                return self.conn.recv()
            why = f"no answer within {timeout:g} s"
        except (EOFError, OSError, BrokenPipeError):
            why = f"worker process died (exit code {self.proc.poll() if self.proc else None})"
        self.stop()
        return "lost", why

    def ask_to_stop(self) -> None:
        """Tell the worker to exit, without waiting for it (:meth:`stop` waits): several workers then shut down side
        by side."""
        if self.conn is not None:
            try:
                self.conn.send(("stop", None, None))
            except OSError:
                pass
            self.conn.close()
            self.conn = None

    def stop(self) -> None:
        self.ask_to_stop()
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = self.conn = None


PROCESSES = 2
"""Worker processes per version when the caller names none (``bench check --against`` passes its ``--processes``,
default :data:`harness.engine.replicate.GATE_PROCESSES`). Rounds alternate between them: a process's own luck (memory
layout, where its threads run) moves a small model's time by tens of percent from one process to the next, so the
gate's test is over (paired) processes (:mod:`harness.analysis.comparison`), not over rounds or samples; ``bench
check`` adds batches of them where a case cannot yet see the slowdown asked for (:mod:`reports.check.adaptive`)."""


def interleave_versions(cases: Sequence[Case], opts: RunOptions, ref_tree: Path, here: Path = REPO, seed: int = 0,
                        on_pair: Callable[[CaseRecord, CaseRecord], None] | None = None,
                        processes: int = PROCESSES) -> list[tuple[CaseRecord, CaseRecord]]:
    """(baseline = REF's record, candidate = this checkout's record) per case. Each version runs in
    ``processes`` workers; per case every worker prepares it, then ``opts.timing.rounds`` rounds, each in a
    fresh random order of the two versions, round r timed by worker r mod ``processes`` of each (the rounds
    rounded up to a multiple of ``processes``). A version's record holds worker 0's rounds, then worker 1's, ...
    (:func:`harness.engine.replicate.merge_processes`): its interval and the gate's test are over processes."""
    sides = {name: [Side(name, tree, opts.plugins) for _ in range(processes)]
             for name, tree in (("base", ref_tree), ("cand", here))}
    rng = random.Random(seed)
    n_rounds = processes * math.ceil(opts.timing.rounds / processes)     # as many rounds in every worker
    out: list[tuple[CaseRecord, CaseRecord]] = []
    everyone = [w for workers in sides.values() for w in workers]
    try:
        if cases:
            for w in everyone:              # all start side by side (each imports torch); each is asked in turn below
                w.start()
        for case in cases:
            group = f"ab-{case.key}"
            timing = {k: v for k, v in dataclasses.asdict(opts.timing).items() if k != "flush_l2" or v}  # an older worker has no flush_l2
            state = {name: [w.ask("prepare", case_dict(case), {"timing": timing, "memory": k == 0}, opts.timeout_s)
                            for k, w in enumerate(workers)] for name, workers in sides.items()}
            which: dict[str, list[list[int]]] = {name: [[] for _ in range(processes)] for name in sides}
            for r in range(n_rounds):
                order = list(sides)
                rng.shuffle(order)
                for name in order:
                    k = r % processes
                    if state[name][k][0] != "ready":
                        continue
                    got = sides[name][k].ask("round", timeout=opts.timeout_s)
                    if got[0] == "ok":
                        which[name][k].append(r)
                    else:
                        state[name][k] = got
            recs = {}
            for name, workers in sides.items():
                parts: list[tuple[CaseRecord, list[int]]] = []
                failure: CaseRecord | None = None
                for k, w in enumerate(workers):
                    if state[name][k][0] == "ready":
                        state[name][k] = w.ask("finish", group, timeout=opts.timeout_s)
                    kind, payload = state[name][k]
                    rec = record_from(payload) if kind == "done" else case.record(
                        "timeout" if "no answer" in str(payload) else "error", f"{name} worker: {payload}")
                    if rec.ok:
                        parts.append((rec, which[name][k]))
                    elif failure is None:
                        failure = rec
                timed = [p[0] for p in parts if p[0].samples_s]
                recs[name] = failure or (merge_processes(timed) if timed else parts[0][0])
            pair = (recs["base"], recs["cand"])
            out.append(pair)
            if on_pair:
                on_pair(*pair)
    finally:
        for w in everyone:
            w.ask_to_stop()
        for w in everyone:
            w.stop()
    return out
