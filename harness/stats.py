"""Summary statistics for timing samples: robust summaries, log-log scaling fits, A/B comparison.

Inputs are raw per-call times in seconds; summaries are reported in milliseconds.
Pure Python + numpy + scipy, no torch.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

NOISY_REL_IQR = 0.10
"""A summary is flagged ``noisy`` when IQR / median is at least this."""

SAME_REL_TOL = 0.02
"""``compare`` calls two medians "same" when their ratio is within this of 1."""


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
    cdf = sps.binom.cdf(np.arange(n), n, 0.5)
    lo = int(np.searchsorted(cdf, alpha, side="right")) - 1  # largest k with cdf[k] <= alpha
    lo = max(lo, 0)
    return lo, n - 1 - lo


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


@dataclass(frozen=True)
class Fit:
    """Result of fitting ``log(y) = intercept + exponent * log(x)`` (natural logs)."""

    exponent: float
    ci_low: float
    ci_high: float
    intercept: float
    r2: float
    n: int

    def __str__(self) -> str:
        """``k [lo, hi]``, or just ``k`` when the interval is undefined (two points)."""
        if math.isnan(self.ci_low):
            return f"{self.exponent:.2f}"
        return f"{self.exponent:.2f} [{self.ci_low:.2f}, {self.ci_high:.2f}]"


def fit_loglog(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Fit | None:
    """Least-squares power-law fit ``y ~ exp(intercept) * x**exponent``.

    Points where x or y is non-positive or non-finite are dropped. Returns None when fewer
    than 2 usable points remain or all usable x are equal. The exponent's CI uses the t
    distribution with n - 2 degrees of freedom; with exactly 2 points there are no degrees
    of freedom and the CI is (nan, nan).
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape:
        raise ValueError("x and y must have the same length")
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0) & (ya > 0)
    lx, ly = np.log(xa[ok]), np.log(ya[ok])
    n = int(lx.size)
    if n < 2 or np.ptp(lx) == 0:
        return None
    res = sps.linregress(lx, ly)
    k = float(res.slope)
    if n > 2:
        half = float(sps.t.ppf(0.5 + confidence / 2.0, n - 2)) * float(res.stderr)
        ci_low, ci_high = k - half, k + half
    else:
        ci_low = ci_high = math.nan
    return Fit(
        exponent=k,
        ci_low=ci_low,
        ci_high=ci_high,
        intercept=float(res.intercept),
        r2=float(res.rvalue) ** 2,
        n=n,
    )


def _bootstrap_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``n_boot`` resamples of ``x``, drawn in chunks to bound memory."""
    out = np.empty(n_boot)
    chunk = max(1, 1_000_000 // x.size)
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        out[start:stop] = np.median(x[idx], axis=1)
    return out


def compare(
    a_samples: Sequence[float],
    b_samples: Sequence[float],
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Compare B against A (e.g. A = baseline, B = candidate) by the ratio of medians.

    ``ratio = median(b) / median(a)``; its interval is a percentile bootstrap (each sample
    set resampled independently, ``n_boot`` times, numpy generator seeded with ``seed`` so
    results are reproducible). ``verdict`` describes B relative to A: "same" when the
    interval contains 1 or ``|ratio - 1| < SAME_REL_TOL``, else "faster" (ratio < 1) or
    "slower" (ratio > 1). Returns ratio, ci_low, ci_high, verdict, a_median_ms, b_median_ms.
    """
    a = np.asarray(a_samples, dtype=np.float64)
    b = np.asarray(b_samples, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("compare() needs samples on both sides")
    med_a, med_b = float(np.median(a)), float(np.median(b))
    if med_a <= 0:
        raise ValueError("median of a_samples must be positive")
    ratio = med_b / med_a
    rng = np.random.default_rng(seed)
    boot = _bootstrap_medians(b, n_boot, rng) / _bootstrap_medians(a, n_boot, rng)
    alpha = (1.0 - confidence) / 2.0
    ci_low, ci_high = (float(v) for v in np.quantile(boot, [alpha, 1.0 - alpha]))
    if ci_low <= 1.0 <= ci_high or abs(ratio - 1.0) < SAME_REL_TOL:
        verdict = "same"
    else:
        verdict = "faster" if ratio < 1.0 else "slower"
    return {
        "ratio": ratio,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "verdict": verdict,
        "a_median_ms": med_a * 1e3,
        "b_median_ms": med_b * 1e3,
    }
