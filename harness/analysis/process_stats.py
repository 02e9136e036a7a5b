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
* a ratio of two such timings (:func:`process_ratio`) resamples both sides apart; its degrees of freedom are
  Welch's, and its **minimum detectable effect** is the slowdown the test would catch with ``POWER``
  probability: ``exp((t(1 - alpha/2) + t(POWER)) · se) - 1``.

A third level sits above processes: the *occasion* (a baseline file and the check that reads it run minutes or
days apart). :func:`occasion_ratio` judges a check against a baseline measured on several occasions, with the
spread between them in its standard error and ``K - 1`` degrees of freedom.

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
POWER = 0.8
"""The minimum detectable effect is the change caught with this probability."""


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


def _se(reps: np.ndarray, p: int) -> float:
    return float(reps.std(ddof=1)) * math.sqrt(p / (p - 1))


def process_summary(groups: Sequence[Sequence[float]], confidence: float = 0.95, n_boot: int = N_BOOT,
                    seed: int = 0) -> ProcessSummary:
    """The process-level view of a timing (samples in seconds, one sequence per process, at least two)."""
    if len(groups) < 2 or not all(len(g) for g in groups):
        raise ValueError("a process-level interval needs at least two processes with samples")
    meds = np.array([float(np.median(g)) for g in groups]) * 1e3
    logs = np.log(meds)
    p = len(groups)
    se = _se(hierarchical_log_means(groups, n_boot, np.random.default_rng(seed)), p)
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


@dataclass(frozen=True)
class TRatio:
    """A log ratio tested on Student's t: ``ratio``, its interval, the standard error of its log, the degrees of
    freedom, the minimum detectable effect (power :data:`POWER`) and whether it is significant."""

    ratio: float
    ci_low: float
    ci_high: float
    se_log: float
    df: float
    mde: float
    significant: bool


@dataclass(frozen=True)
class ProcessRatio(TRatio):
    """Candidate over baseline across processes: ``ratio`` (geometric means of the per-process medians), its
    interval at ``confidence``, the standard error of its log, Welch's degrees of freedom and the minimum
    detectable effect at ``alpha`` (two-sided) with power :data:`POWER`."""

    n_base: int
    n_cand: int


def _t_test(log_r: float, se: float, df: float, alpha: float, confidence: float
            ) -> tuple[float, float, float, float, float, float, bool]:
    """(ratio, interval at ``confidence``, se, df, minimum detectable effect, significant at ``alpha``) of a log
    ratio with standard error ``se`` on Student's t with ``df`` degrees of freedom."""
    from scipy import stats as sps

    t_show = float(sps.t.ppf(0.5 + confidence / 2.0, df))
    t_test = float(sps.t.ppf(1.0 - alpha / 2.0, df))
    t_power = float(sps.t.ppf(POWER, df))
    return (math.exp(log_r), math.exp(log_r - t_show * se), math.exp(log_r + t_show * se), se, df,
            math.expm1((t_test + t_power) * se), abs(log_r) > t_test * se)


def process_ratio(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], *, alpha: float = 0.002,
                  confidence: float = 0.95, n_boot: int = N_BOOT, seed: int = 0) -> ProcessRatio:
    """median(cand)/median(base) over processes (both sides at least two processes). ``significant``: the
    ``1 - alpha`` interval excludes 1; the interval returned is at ``confidence`` (what is shown)."""
    if len(base) < 2 or len(cand) < 2:
        raise ValueError("a process-level ratio needs at least two processes on each side")
    rng = np.random.default_rng(seed)
    rb, rc = hierarchical_log_means(base, n_boot, rng), hierarchical_log_means(cand, n_boot, rng)
    pb, pc = len(base), len(cand)
    vb, vc = _se(rb, pb) ** 2, _se(rc, pc) ** 2
    se = math.sqrt(vb + vc)
    df = (vb + vc) ** 2 / (vb ** 2 / (pb - 1) + vc ** 2 / (pc - 1)) if vb + vc > 0 else float(pb + pc - 2)
    lb = np.log([float(np.median(g)) for g in base]).mean()
    lc = np.log([float(np.median(g)) for g in cand]).mean()
    log_r = float(lc - lb)
    return ProcessRatio(*_t_test(log_r, se, df, alpha, confidence), pb, pc)


def paired_process_ratio(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], *, alpha: float = 0.002,
                         confidence: float = 0.95, n_boot: int = N_BOOT, seed: int = 0) -> ProcessRatio:
    """Like :func:`process_ratio` for processes run in pairs (``bench check --against``: worker k of each version
    took its rounds alternately with the other's worker k, so both saw the same load): per pair the log ratio of
    the medians; the two-level bootstrap resamples the pairs, then the samples within each process; the interval
    is ± t(P - 1) standard errors. Load that drifts over the check cancels within a pair; each process's own luck
    does not, and stays in the spread."""
    if len(base) != len(cand) or len(base) < 2:
        raise ValueError("a paired process-level ratio needs the same number (two or more) of processes a side")
    rng = np.random.default_rng(seed)
    p = len(base)

    def inner(groups: Sequence[Sequence[float]]) -> np.ndarray:
        out = np.empty((p, n_boot))
        for j, g in enumerate(groups):
            a = np.asarray(g, dtype=np.float64)
            out[j] = np.log(np.median(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1))
        return out

    diff = inner(cand) - inner(base)                                  # (P, n_boot): log ratio per pair
    picks = rng.integers(0, p, size=(n_boot, p))
    reps = diff[picks, np.arange(n_boot)[:, None]].mean(axis=1)
    se = _se(reps, p)
    log_r = float(np.mean([math.log(np.median(c) / np.median(b)) for b, c in zip(base, cand)]))
    df = float(p - 1)
    return ProcessRatio(*_t_test(log_r, se, df, alpha, confidence), p, p)


ONE_PROCESS_NOTE = "one process: the interval covers this process only"
"""What a timing measured in one worker process says about its interval."""


@dataclass(frozen=True)
class OccasionRatio(TRatio):
    """Candidate (one occasion: a check) over a baseline measured on ``n_occasions`` occasions, as
    :class:`ProcessRatio` says (the geometric means of the per-process medians, occasions weighted equally;
    ``df = n_occasions - 1``), with the components of the variance: ``occasion_sd`` (SD of the baseline's
    occasion means, log, between-process noise included) and ``process_sd`` (pooled SD of the log process medians
    within an occasion)."""

    n_occasions: int
    occasion_sd: float
    process_sd: float


def occasion_ratio(base_occasions_ms: Sequence[Sequence[float]], cand_ms: Sequence[float], *, alpha: float = 0.002,
                   confidence: float = 0.95) -> OccasionRatio:
    """A check's timing against a baseline measured on several occasions (per occasion, its per-process medians;
    the candidate's per-process medians, one or more): the third level above processes and rounds.

    A file baseline and the check that reads it run on two *occasions* — minutes or days apart — and a case's
    speed moves between occasions by more than its processes differ within one (a quiet 2-core machine: a
    1.5 ms model 23 % slower, all five processes alike, 14 minutes after its baseline). The spread between
    occasions is seen only by measuring several: with the log occasion means ``m_1 … m_K`` of the baseline (their
    variance ``s_o²`` holds the between-process noise of ``N_b`` processes an occasion), the within-occasion
    process variance ``s_p²`` (pooled over the baseline's occasions and the candidate's processes), the check is a
    prediction for a new occasion of ``N_c`` processes::

        se² = max(s_o² − s_p²/N_b, 0) + s_p²/N_c + s_o²/K,   df = K − 1

    (with ``N_c = N_b`` that is ``s_o²·(1 + 1/K)``, the textbook prediction interval). Few occasions give few
    degrees of freedom, so the test is wide until the baseline holds more of them: that is what a file baseline
    can prove, and the minimum detectable effect says it."""
    occ = [np.log(np.asarray(o, dtype=np.float64)) for o in base_occasions_ms if len(o)]
    if len(occ) < 2:
        raise ValueError("an occasion-level ratio needs a baseline of at least two occasions")
    lc = np.log(np.asarray(cand_ms, dtype=np.float64))
    if lc.size == 0 or not np.all(np.isfinite(lc)) or not all(np.all(np.isfinite(o)) for o in occ):
        raise ValueError("an occasion-level ratio needs positive, finite medians on both sides")
    k = len(occ)
    means = np.array([o.mean() for o in occ])
    s_o2 = float(means.var(ddof=1))
    groups = occ + ([lc] if lc.size >= 2 else [])
    dof = sum(g.size - 1 for g in groups)
    s_p2 = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof) if dof > 0 else 0.0
    n_b = float(np.mean([o.size for o in occ]))
    var = max(s_o2 - s_p2 / n_b, 0.0) + s_p2 / lc.size + s_o2 / k
    se = math.sqrt(var)
    df = float(k - 1)
    log_r = float(lc.mean() - means.mean())
    return OccasionRatio(*_t_test(log_r, se, df, alpha, confidence), k, math.sqrt(s_o2), math.sqrt(s_p2))
