"""The ratio of two timings at each level of replication, each a log ratio with its Student-t interval (pure
numpy/scipy, no torch):

* **rounds** timed side by side in one process (:func:`paired_ratio`): per round the ratio of the round medians;
* **processes** (:func:`process_ratio`, or :func:`paired_process_ratio` for processes run in pairs): both sides
  resampled by the two-level bootstrap of :mod:`harness.analysis.process_stats`; the degrees of freedom are
  Welch's, and the **minimum detectable effect** is the slowdown the test would catch with ``POWER`` probability:
  ``exp((t(1 - alpha/2) + t(POWER)) · se) - 1``;
* **occasions** (:func:`occasion_ratio`): a check against a baseline measured on several occasions (a baseline file
  and the check that reads it run minutes or days apart), with the spread between them in its standard error and
  ``K - 1`` degrees of freedom.

:mod:`harness.analysis.comparison` picks the level both sides allow and judges the ratio; the summaries of one
timing are :mod:`harness.analysis.stats` (samples, rounds) and :mod:`harness.analysis.process_stats` (processes).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.analysis.process_stats import N_BOOT, hierarchical_log_means, process_se
from harness.analysis.stats import round_medians, t_interval_log

__all__ = ["POWER", "OccasionRatio", "PairedRatio", "ProcessRatio", "TRatio", "occasion_ratio", "paired_process_ratio",
           "paired_ratio", "process_ratio"]

POWER = 0.8
"""The minimum detectable effect is the change caught with this probability."""


@dataclass(frozen=True)
class PairedRatio:
    """A over B from timings taken in the same rounds: per round the ratio of the round medians, then their
    geometric mean with a Student-t interval over rounds (so drift shared by both sides cancels, and drift
    that is not shows up as spread)."""

    ratio: float
    ci_low: float
    ci_high: float
    n_rounds: int
    per_round: tuple[float, ...]


def paired_ratio(a_samples: Sequence[float], a_rounds: Sequence[int], b_samples: Sequence[float],
                 b_rounds: Sequence[int], confidence: float = 0.95) -> PairedRatio:
    """median(A)/median(B), round by round (rounds aligned by index: round i of A and of B ran side by side).
    Needs at least two common rounds; raises ValueError otherwise."""
    ra, rb = round_medians(a_samples, a_rounds), round_medians(b_samples, b_rounds)
    if len(a_rounds) != len(b_rounds):
        raise ValueError(f"A has {len(a_rounds)} rounds, B has {len(b_rounds)}: not measured side by side")
    per = [x / y for x, y in zip(ra, rb) if x > 0 and y > 0]
    if len(per) < 2:
        raise ValueError("a paired ratio needs at least two rounds with positive times on both sides")
    centre, lo, hi = t_interval_log(per, confidence)
    return PairedRatio(centre, lo, hi, len(per), tuple(per))


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
    vb, vc = process_se(rb, pb) ** 2, process_se(rc, pc) ** 2
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
    se = process_se(reps, p)
    log_r = float(np.mean([math.log(np.median(c) / np.median(b)) for b, c in zip(base, cand)]))
    df = float(p - 1)
    return ProcessRatio(*_t_test(log_r, se, df, alpha, confidence), p, p)



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
