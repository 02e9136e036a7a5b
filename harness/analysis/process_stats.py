"""Timing statistics with the worker process as the unit of replication (pure numpy/scipy, no torch).

A process's samples share its luck — memory layout, where its threads land, the state of the machine when it
started — so they are not independent draws of "how long does this case take". Kalibera & Jones ("Rigorous
benchmarking in reasonable time", ISMM 2013) model a timing as two levels, processes then iterations within
them; pyperf spawns 20 worker processes per benchmark for the same reason. Here:

* a timing measured in P processes is stored as its samples in rounds, the rounds of process 0 first, then
  process 1, ... (``rounds_per_process`` consecutive rounds each): :func:`process_groups` cuts them apart;
* the typical time is the geometric mean of the per-process medians, and its interval a **two-level
  bootstrap**: resample P processes with replacement, then each chosen process's samples with replacement, take
  the mean of the log medians (:func:`hierarchical_log_means`); the standard deviation of those replicates, times
  ``sqrt(P / (P - 1))`` (the plug-in bootstrap's small-sample bias), is the standard error, and the interval is
  ``± t(P - 1)`` standard errors on the log scale (with only a few processes a percentile interval of a bootstrap
  is far too narrow: 3 processes have 10 distinct resamples);
* the ratio of two such timings is :func:`harness.analysis.ratios.process_ratio`.

With one process there is no between-process spread to see: no interval is made here, and callers say "one
process: the interval covers this process only".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.analysis.stats import t_halfwidth

N_BOOT = 2000
"""Bootstrap replicates (seeded: the same data give the same interval)."""


def process_groups(samples_s: Sequence[float], rounds: Sequence[int], n_processes: int
                   ) -> list[tuple[float, ...]] | None:
    """The samples of each process, or None when they cannot be cut apart (fewer than two processes, no rounds,
    or a round count that is not a multiple of ``n_processes``): the rounds of process 0 come first, then those
    of process 1, ..., ``len(rounds) // n_processes`` each."""
    if n_processes < 2 or not rounds or len(rounds) % n_processes or sum(rounds) != len(samples_s):
        return None
    per = len(rounds) // n_processes
    out, i = [], 0
    for p in range(n_processes):
        n = sum(rounds[p * per:(p + 1) * per])
        out.append(tuple(samples_s[i:i + n]))
        i += n
    return out if all(out) else None


def hierarchical_log_means(groups: Sequence[Sequence[float]], n_boot: int = N_BOOT,
                           rng: np.random.Generator | None = None) -> np.ndarray:
    """``n_boot`` two-level bootstrap replicates of the mean log per-process median: processes resampled with
    replacement, then each chosen process's samples with replacement (Kalibera & Jones' hierarchical bootstrap)."""
    rng = rng or np.random.default_rng(0)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    p = len(arrays)
    out = np.empty(n_boot)
    # per process, n_boot resampled log medians (resampling within a process is independent of which is picked)
    inner = np.empty((p, n_boot))
    for j, a in enumerate(arrays):
        idx = rng.integers(0, a.size, size=(n_boot, a.size))
        inner[j] = np.log(np.median(a[idx], axis=1))
    picks = rng.integers(0, p, size=(n_boot, p))                     # (n_boot, P): which processes
    cols = np.arange(n_boot)[:, None]
    out[:] = inner[picks, cols].mean(axis=1)
    return out


@dataclass(frozen=True)
class ProcessSummary:
    """One timing over its processes (milliseconds): the geometric mean of the per-process medians, its interval,
    the between-process coefficient of variation and the counts."""

    centre_ms: float
    ci_low_ms: float
    ci_high_ms: float
    se_log: float
    process_cv: float
    n_processes: int
    medians_ms: tuple[float, ...]

    def metrics(self) -> dict[str, float]:
        """``process_ci_low_ms``/``process_ci_high_ms``, ``process_gmean_ms``, ``process_cv``, ``n_processes``."""
        return {"process_gmean_ms": self.centre_ms, "process_ci_low_ms": self.ci_low_ms,
                "process_ci_high_ms": self.ci_high_ms, "process_cv": self.process_cv,
                "n_processes": float(self.n_processes)}


def process_se(reps: np.ndarray, p: int) -> float:
    """The standard error of a mean over ``p`` processes from its bootstrap replicates ``reps``: their standard
    deviation times ``sqrt(p / (p - 1))`` (the plug-in bootstrap's small-sample bias)."""
    return float(reps.std(ddof=1)) * math.sqrt(p / (p - 1))


def process_summary(groups: Sequence[Sequence[float]], confidence: float = 0.95, n_boot: int = N_BOOT,
                    seed: int = 0) -> ProcessSummary:
    """The process-level view of a timing (samples in seconds, one sequence per process, at least two)."""
    if len(groups) < 2 or not all(len(g) for g in groups):
        raise ValueError("a process-level interval needs at least two processes with samples")
    meds = np.array([float(np.median(g)) for g in groups]) * 1e3
    logs = np.log(meds)
    p = len(groups)
    se = process_se(hierarchical_log_means(groups, n_boot, np.random.default_rng(seed)), p)
    from scipy import stats as sps   # scipy.stats (~1 CPU-s): imported when an interval is made, not by `bench run`

    half = float(sps.t.ppf(0.5 + confidence / 2.0, p - 1)) * se
    centre = float(np.exp(logs.mean()))
    return ProcessSummary(centre, centre * math.exp(-half), centre * math.exp(half), se,
                          float(meds.std(ddof=1) / meds.mean()), p, tuple(float(m) for m in meds))


def group_halfwidth(medians: Sequence[Sequence[float]], confidence: float = 0.95) -> float:
    """How precisely a group of cases timed side by side is known over its processes: ``medians[c][p]`` is case
    c's median in process p (the same processes, in the same order, for every case of the group). For one case,
    the half-width of its t-interval over processes (log scale, ``t(P-1) · sd / √P`` of the log medians); for
    two or more, the largest such half-width of a pair's per-process log ratio (what a side-by-side figure
    reads: each process's luck shared by the pair cancels). ``inf`` with fewer than two processes.
    :func:`harness.engine.replicate.imprecise` stops adding processes to a group once this is small enough."""
    p = min((len(m) for m in medians), default=0)
    if p < 2:
        return math.inf
    logs = np.log(np.asarray([list(m)[:p] for m in medians], dtype=np.float64))      # (cases, P)
    if len(logs) == 1:
        series = logs
    else:
        i, j = np.triu_indices(len(logs), k=1)
        series = logs[i] - logs[j]                                                   # (pairs, P)
    return float(t_halfwidth(series, confidence).max())


ONE_PROCESS_NOTE = "one process: the interval covers this process only"
"""What a timing measured in one worker process says about its interval."""
