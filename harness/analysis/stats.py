"""Summary statistics for timing samples: robust summaries and rounds (a ratio of two timings is
:mod:`harness.analysis.ratios`, their comparison :mod:`harness.analysis.comparison`; the fits of cost against size
are :mod:`harness.analysis.fits`).

Inputs are raw per-call times in seconds; summaries are reported in milliseconds.
Pure Python + numpy + scipy, no torch. A bench worker summarizes every case it times (:func:`summarize_rounds`)
with two of ``scipy.special``'s functions, imported with this module (0.2 s, before the worker says it is ready, so
no case's timeout pays for it); ``scipy.stats`` (about 0.6 s more at every worker start) is imported only by the
functions that use it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import _ufuncs, stdtrit

NOISY_REL_IQR = 0.10
"""A summary is flagged ``noisy`` when IQR / median is at least this."""

def median_ci_indices(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based order-statistic indices (lo, hi) of a distribution-free CI for the median.

    With B ~ Binomial(n, 1/2), ``P(x_(lo) <= median <= x_(hi)) >= 1 - 2 * P(B <= lo)`` for the
    symmetric pair ``hi = n - 1 - lo``; ``lo`` is the largest index keeping that coverage
    at ``confidence``. When no such index exists (n <= 5 at 95%) this falls back to
    (0, n - 1), i.e. min/max, whose coverage is then only ``1 - 2**(1-n)``.
    """
    if n < 1:
        raise ValueError("need at least one sample")
    alpha = (1.0 - confidence) / 2.0
    cdf = _binom_cdf_half(n)
    lo = int(np.searchsorted(cdf, alpha, side="right")) - 1  # largest k with cdf[k] <= alpha
    lo = max(lo, 0)
    return lo, n - 1 - lo


def _binom_cdf_half(n: int) -> np.ndarray:
    """``scipy.stats.binom.cdf(np.arange(n), n, 0.5)``, the same values from the same special function
    (``binom.cdf`` calls it), without importing ``scipy.stats`` (tests/test_stats.py checks they are equal)."""
    return _ufuncs._binom_cdf(np.arange(n), n, 0.5)


def _t_ppf(q: float, dof: float) -> float:
    """``scipy.stats.t.ppf(q, dof)``: the same value from ``scipy.special.stdtrit``, which ``t.ppf`` calls,
    without importing ``scipy.stats`` (tests/test_stats.py checks they are equal)."""
    return float(stdtrit(dof, q))


def summarize(samples_s: Sequence[float]) -> dict[str, float]:
    """Summarize per-call times (seconds) into a dict of floats, times in milliseconds.

    Keys: median_ms, mean_ms, stdev_ms (sample stdev, ddof=1; 0 for one sample), min_ms,
    max_ms, q1_ms, q3_ms, iqr_ms, p90_ms, p99_ms (numpy linear percentiles), ci_low_ms,
    ci_high_ms (95% distribution-free CI of the median, see ``median_ci_indices``),
    n_samples, rel_iqr (iqr / median) and noisy (1.0 if rel_iqr >= NOISY_REL_IQR else 0.0).
    """
    x = np.sort(np.asarray(samples_s, dtype=np.float64)) * 1e3
    n = x.size
    if n == 0:
        raise ValueError("summarize() needs at least one sample")
    q1, median, q3, p90, p99 = np.percentile(x, [25, 50, 75, 90, 99])
    lo, hi = median_ci_indices(n)
    iqr = q3 - q1
    if median > 0:
        rel_iqr = iqr / median
    else:
        rel_iqr = math.inf if iqr > 0 else 0.0
    return {
        "median_ms": float(median),
        "mean_ms": float(x.mean()),
        "stdev_ms": float(x.std(ddof=1)) if n > 1 else 0.0,
        "min_ms": float(x[0]),
        "max_ms": float(x[-1]),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "iqr_ms": float(iqr),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "ci_low_ms": float(x[lo]),
        "ci_high_ms": float(x[hi]),
        "n_samples": float(n),
        "rel_iqr": float(rel_iqr),
        "noisy": 1.0 if rel_iqr >= NOISY_REL_IQR else 0.0,
    }


def round_medians(samples_s: Sequence[float], rounds: Sequence[int]) -> list[float]:
    """The median of each round: ``rounds`` gives how many consecutive samples of ``samples_s`` each round holds."""
    if sum(rounds) != len(samples_s):
        raise ValueError(f"rounds hold {sum(rounds)} samples, the series has {len(samples_s)}")
    out, i = [], 0
    for n in rounds:
        if n > 0:
            out.append(float(np.median(samples_s[i:i + n])))
        i += n
    return out


def t_halfwidth(values: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """Half-width of the Student-t interval of the mean along the last axis (``t(n-1) · sd / √n``), n ≥ 2."""
    n = values.shape[-1]
    return _t_ppf(0.5 + confidence / 2.0, n - 1) * values.std(axis=-1, ddof=1) / math.sqrt(n)


def t_interval_log(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """Geometric mean of positive ``values`` with a Student-t interval on their logs: (centre, lo, hi)."""
    logs = np.log(np.asarray(values, dtype=np.float64))
    m = float(logs.mean())
    if logs.size < 2:
        return math.exp(m), math.nan, math.nan
    half = float(t_halfwidth(logs, confidence))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def round_summary(samples_s: Sequence[float], rounds: Sequence[int], confidence: float = 0.95) -> dict[str, float]:
    """The between-round view of one timing (milliseconds): ``n_rounds``, ``round_cv`` (standard deviation of
    the round medians over their mean: the drift a rerun would see) and ``round_ci_low_ms``/``round_ci_high_ms``
    (a Student-t interval on the log round medians: where this case's typical time lies across rounds).
    Empty with fewer than two rounds."""
    meds = [m for m in round_medians(samples_s, rounds) if m > 0]
    if len(meds) < 2:
        return {}
    arr = np.asarray(meds) * 1e3
    _, lo, hi = t_interval_log(arr, confidence)
    return {"n_rounds": float(len(meds)), "round_cv": float(arr.std(ddof=1) / arr.mean()),
            "round_ci_low_ms": lo, "round_ci_high_ms": hi}


def summarize_rounds(samples_s: Sequence[float], rounds: Sequence[int] = ()) -> dict[str, float]:
    """:func:`summarize` plus :func:`round_summary`; ``ci_low_ms``/``ci_high_ms`` become the wider of the
    sample interval and the between-round interval, so the stored interval covers drift, not only noise."""
    out = summarize(samples_s)
    if rounds:
        out.update(round_summary(samples_s, rounds))
    if "round_ci_low_ms" in out:
        out["ci_low_ms"] = min(out["ci_low_ms"], out["round_ci_low_ms"])
        out["ci_high_ms"] = max(out["ci_high_ms"], out["round_ci_high_ms"])
    return out
