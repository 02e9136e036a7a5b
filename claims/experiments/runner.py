"""The skeleton every claims experiment runs through, written once.

An experiment is an :class:`Experiment`: its claim, its QUICK/FULL presets (frozen dataclasses) and a
``measure(setup, seeds)`` that returns its result fields and its scale fields. :meth:`Experiment.run`
picks the preset, times the whole run and assembles the record every experiment returns::

    {"claim", "setup", "seeds", **fields, "scale": {**scale, "wall_seconds"}}

:func:`sweep` runs one trial per variant × seed and gives, per variant, each measured value as a list
over seeds (:func:`per_seed`), the shape the probes turn into means with 95% intervals.

**Trials in worker processes.** The trials of a sweep are independent (each builds its model from its seed and
draws its data from its own seeded generator), and the models are tiny: torch's intra-op threads scale poorly
on their small ops. An experiment built with ``parallel=True`` (no rule reads a time it measures) may therefore
train its trials in ``workers`` spawned processes of ONE thread each instead of one after another at that many
threads: ``bench claims`` (claims.evidence.Context.experiment) runs a parallel experiment under
:meth:`Training.pooled` at its thread count (2 workers at 1 thread on 2 cores); ``run()`` alone is serial. The
figures are those of the same trials run one by one at one thread (tests/test_experiment_pool.py checks it);
every experiment's result records how it was trained (``trained_by``: workers, threads per worker). The processes
are spawned, never forked (a fork after torch has run OpenMP ops can hang), so the trial and its variants must
be picklable: module-level functions, ``functools.partial`` of them, frozen dataclasses.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

import torch

Seeds = tuple[int, ...]
S = TypeVar("S")
V = TypeVar("V")

Fields = dict[str, Any]


@dataclass(frozen=True)
class Training:
    """How a sweep's trials are trained: ``workers`` processes (1: in the caller, one trial after another) of
    ``threads`` torch threads each."""

    workers: int = 1
    threads: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1 or self.threads < 1:
            raise ValueError(f"workers and threads must be >= 1, got {self.workers}, {self.threads}")

    @classmethod
    def serial(cls) -> Training:
        """In the caller, at its torch thread count."""
        return cls(1, torch.get_num_threads())

    @classmethod
    def pooled(cls, threads: int | None = None) -> Training:
        """``threads`` (default: the caller's torch thread count) worker processes of one thread each."""
        return cls(max(1, threads if threads is not None else torch.get_num_threads()), 1)

    def as_dict(self) -> Fields:
        return {"workers": self.workers, "threads_per_worker": self.threads}


@dataclass
class _Active:
    """The plan in force and its worker processes, started at the first pooled sweep and shared by the sweeps
    after it (a worker runs trial after trial: each trial seeds all it draws, so none depends on the one before)."""

    plan: Training
    pool: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.plan.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_worker_init, initargs=(self.plan.threads,))
        return self.pool


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("training", default=None)


@contextlib.contextmanager
def training(plan: Training) -> Iterator[Training]:
    """Within the block, :func:`sweep` trains as ``plan`` says; its worker processes end with the block (a block
    inside one of the same plan shares the outer block's workers)."""
    outer = _ACTIVE.get()
    if outer is not None and outer.plan == plan:
        yield plan
        return
    active = _Active(plan)
    token = _ACTIVE.set(active)
    try:
        yield plan
    finally:
        _ACTIVE.reset(token)
        if active.pool is not None:
            active.pool.shutdown(cancel_futures=True)


@dataclass(frozen=True)
class Experiment(Generic[S]):
    """One claims experiment as data: what it decides, its presets, and what it measures."""

    claim: str
    quick: S
    full: S
    measure: Callable[[S, Seeds], tuple[Fields, Fields]]      # (setup, seeds) -> (result fields, scale)
    parallel: bool = False      # its sweeps' trials may train in worker processes (nothing per trial is timed)

    def run(self, quick: bool = True, seeds: Iterable[int] = (0, 1, 2), setup: S | None = None,
            plan: Training | None = None) -> Fields:
        """The experiment at ``setup`` (default: the QUICK or FULL preset) over ``seeds``, as JSON-safe data.
        ``plan`` (default: :meth:`Training.serial`) says how its sweeps train; the result's ``trained_by`` records
        it. Only a ``parallel`` experiment may be given a plan of several workers."""
        setup = setup if setup is not None else self.quick if quick else self.full
        seeds = tuple(int(s) for s in seeds)
        if not seeds:
            raise ValueError("an experiment needs at least one seed")
        plan = plan if plan is not None else Training.serial()
        if plan.workers > 1 and not self.parallel:
            raise ValueError(f"experiment {self.claim} times its trials: it trains them in one process, not {plan.workers}")
        t0 = time.perf_counter()
        with training(plan):
            fields, scale = self.measure(setup, seeds)
        if "trained_by" in fields:
            raise ValueError(f"experiment {self.claim}: 'trained_by' is the record's own field")
        return {"claim": self.claim, "setup": asdict(setup), "seeds": list(seeds), **fields,
                "trained_by": plan.as_dict(), "scale": {**scale, "wall_seconds": time.perf_counter() - t0}}


def per_seed(records: list[Fields]) -> Fields:
    """Per-seed records (one dict per seed, the same keys) as one dict of lists over seeds; nested dicts
    are transposed the same way, any other value (a loss curve, None) becomes one list entry."""
    first = records[0]
    return {key: per_seed([r[key] for r in records]) if isinstance(first[key], dict) else [r[key] for r in records]
            for key in first}


def sweep(variants: Mapping[str, V], seeds: Seeds, trial: Callable[[V, int], Fields]) -> dict[str, Fields]:
    """``trial(variant, seed)`` for every variant and seed; per variant name, :func:`per_seed` of its trials.
    Inside :func:`training` with more than one worker, the trials run in that many spawned processes of
    ``threads`` threads each (``trial`` and the variants must be picklable); otherwise here, one by one."""
    active = _ACTIVE.get()
    plan = active.plan if active is not None else Training.serial()
    jobs = [(name, variant, seed) for name, variant in variants.items() for seed in seeds]
    if active is None or plan.workers == 1 or len(jobs) == 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(plan.threads)                     # what the result's ``trained_by`` says
        try:
            results = [trial(variant, seed) for _, variant, seed in jobs]
        finally:
            torch.set_num_threads(threads)
    else:
        results = _pooled(active.executor(), trial, [(variant, seed) for _, variant, seed in jobs])
    by_name: dict[str, list[Fields]] = {name: [] for name in variants}
    for (name, _, _), result in zip(jobs, results):
        by_name[name].append(result)
    return {name: per_seed(records) for name, records in by_name.items()}


def _pooled(pool: ProcessPoolExecutor, trial: Callable[[V, int], Fields], jobs: list[tuple[V, int]]) -> list[Fields]:
    """``trial`` on each (variant, seed) of ``jobs`` in the pool's workers; results in order. A trial's exception
    is raised here (the trials not started yet are cancelled: they would decide nothing), never turned into a
    result."""
    futures = [pool.submit(trial, variant, seed) for variant, seed in jobs]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise


def _worker_init(threads: int) -> None:
    """A worker trains at ``threads`` torch threads."""
    torch.set_num_threads(threads)


def timed(fn: Callable[..., V], *args: Any) -> tuple[V, float]:
    """``fn(*args)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def finite_or_none(x: float) -> float | None:
    """JSON has no inf/NaN: non-finite values are reported as None."""
    return x if math.isfinite(x) else None


def relative(a: float, b: float) -> float:
    """a / b − 1 (NaN when b is 0)."""
    return a / b - 1 if b else float("nan")
