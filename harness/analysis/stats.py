"""Summary statistics for timing samples: robust summaries, log-log scaling fits, rounds (the comparison of two
timings is :mod:`harness.analysis.comparison`).

Inputs are raw per-call times in seconds; summaries are reported in milliseconds.
Pure Python + numpy + scipy, no torch. A bench worker summarizes every case it times (:func:`summarize_rounds`)
with two of ``scipy.special``'s functions, imported with this module (0.2 s, before the worker says it is ready, so
no case's timeout pays for it); ``scipy.stats`` (about 0.6 s more at every worker start) is imported only by the
functions that use it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    from scipy import stats as sps

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


REGIME_MIN_POINTS = 3
"""The scaling regime always holds the largest ``REGIME_MIN_POINTS`` x values (fewer if the sweep has fewer).
Three, not more: a fourth would let the top of a floor decide the slope. A regime of only three points has one
degree of freedom, and its interval (t = 12.7) honestly says how little such a fit knows."""

REGIME_SLOPE_SHARE = 0.75
"""A smaller x joins the regime while the local log-log slope up to it is at least this share of the slope
fitted over the top points; below that the metric is held up by a floor (launch, call or fixed overhead)."""

FLAT_EXPONENT = 0.25
"""A metric whose top slope is below this does not scale with x at all: every point is in the regime."""


@dataclass(frozen=True)
class ScalingFit:
    """A log-log fit over the scaling regime of a sweep, with the floor below it reported apart.

    ``fit`` covers the points with x in [``x_min``, ``x_max``]; ``floor`` holds the (x, y) points below
    ``x_min`` where y no longer follows the power law (e.g. a launch-bound 4.5 ms for every small n)."""

    fit: Fit
    x_min: float
    x_max: float
    floor: tuple[tuple[float, float], ...] = ()

    @property
    def exponent(self) -> float:
        return self.fit.exponent

    @property
    def floor_y(self) -> float | None:
        """The median y of the floor points (None when there is no floor)."""
        return float(np.median([p[1] for p in self.floor])) if self.floor else None

    def __str__(self) -> str:
        return str(self.fit)


def top_slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The local log-log slope between the two largest x (the asymptotic end of a curve that is not one power
    law, e.g. exact MACs of n·d² + n²·d); None with fewer than 2 usable points."""
    pts = sorted((float(a), float(b)) for a, b in zip(x, y, strict=True)
                 if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    if len(pts) < 2 or pts[-1][0] == pts[-2][0]:
        return None
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return math.log(y1 / y0) / math.log(x1 / x0)


def fit_scaling(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> ScalingFit | None:
    """The project's one fit-range rule: fit ``y ~ x**k`` over the scaling regime, the floor apart.

    Points are sorted by x (non-positive or non-finite ones dropped). The regime starts as the top
    :data:`REGIME_MIN_POINTS` points; with ``k_top`` their fitted slope, it extends to each smaller x in
    turn while the local slope between that point and the next is at least
    :data:`REGIME_SLOPE_SHARE` · ``k_top``, and stops at the first that is not (everything below is the
    floor). A metric with ``k_top`` < :data:`FLAT_EXPONENT` has no regime to find: all points are fitted.
    Returns None with fewer than 2 usable points (see :func:`fit_loglog`)."""
    pts = sorted((float(a), float(b)) for a, b in zip(x, y, strict=True)
                 if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    if len({p[0] for p in pts}) < 2:
        return None
    start = max(0, len(pts) - REGIME_MIN_POINTS)
    top = fit_loglog([p[0] for p in pts[start:]], [p[1] for p in pts[start:]], confidence)
    if top is None or top.exponent < FLAT_EXPONENT:
        start = 0
    else:
        while start > 0:
            (x0, y0), (x1, y1) = pts[start - 1], pts[start]
            if x1 == x0 or math.log(y1 / y0) / math.log(x1 / x0) < REGIME_SLOPE_SHARE * top.exponent:
                break
            start -= 1
    fit = fit_loglog([p[0] for p in pts[start:]], [p[1] for p in pts[start:]], confidence)
    if fit is None:
        return None
    return ScalingFit(fit, pts[start][0], pts[-1][0], tuple(pts[:start]))


# -- rounds: intervals that cover drift between runs, not only the noise inside one ---------------------
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


def _t_interval_log(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
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
    _, lo, hi = _t_interval_log(arr, confidence)
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
    centre, lo, hi = _t_interval_log(per, confidence)
    return PairedRatio(centre, lo, hi, len(per), tuple(per))


# -- affine costs: cost = floor + slope·x (issue 26 item 6) --------------------------------------------------
FLOOR_NEGLIGIBLE = 0.10
"""A point is past the floor when the fitted floor is at most this share of its cost: only such points may carry
a power-law exponent (below, the exponent of floor + slope·x measures the floor, not the scaling)."""

AFFINE_MIN_POINTS_MEASURED = 4
"""A measured (noisy) metric is called affine only with this many sizes: one degree of freedom beyond a
quadratic term, whose interval must hold 0 (fewer points cannot tell a line from a bend)."""


@dataclass(frozen=True)
class AffineFit:
    """``y = base + slope·x`` over x in [``x_min``, ``x_max``]: the floor (weights read once, a launch, a fixed
    overhead) and the marginal cost per unit of x (``slope``: MACs, bytes or ms per token / per image) with its
    95 % interval. ``exact``: an exact count fitted within its rounding (the interval is the rounding's, no
    noise). ``power``: the log-log exponent over the points where the floor is at most
    :data:`FLOOR_NEGLIGIBLE` of the cost (from ``power_x_min`` up), None when the floor is felt everywhere."""

    base: float                          # the floor: the cost at x → 0
    slope: float
    slope_lo: float
    slope_hi: float
    base_lo: float
    base_hi: float
    x_min: float
    x_max: float
    n: int
    exact: bool = False
    power: Fit | None = None
    power_x_min: float | None = None

    @property
    def exponent(self) -> float | None:
        """The power-law exponent where one may be claimed (see ``power``), else None."""
        return self.power.exponent if self.power is not None else None

    def floor_share(self, x: float) -> float:
        """The floor's share of the fitted cost at ``x``."""
        total = self.base + self.slope * x
        return self.base / total if total > 0 else math.nan


def _wls(x: np.ndarray, y: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Weighted least squares of ``y`` on ``1, x, …, x^degree`` with weights ``1/y`` (relative errors: a timing's
    noise grows with it): coefficients, their covariance, the residual degrees of freedom."""
    design = np.vander(x, degree + 1, increasing=True) / y[:, None]
    target = np.ones_like(y)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    dof = len(y) - (degree + 1)
    resid = target - design @ coef
    s2 = float(resid @ resid) / dof if dof > 0 else math.nan
    cov = s2 * np.linalg.pinv(design.T @ design)
    return coef, cov, dof


def fit_affine(x: Sequence[float], y: Sequence[float], *, exact: bool = False,
               confidence: float = 0.95) -> AffineFit | None:
    """``y = floor + slope·x`` when the data are affine with a floor, else None (use :func:`fit_scaling`).

    ``exact`` (a count: MACs, FLOPs, bytes, params): the line through the smallest and largest x must hit every
    point within the counts' rounding (±0.5 each, plus float precision); the slope's interval is then that
    rounding, ±1/(x_max − x_min), never a noise interval. Measured (times, peaks): at least
    :data:`AFFINE_MIN_POINTS_MEASURED` sizes, relative-error weighted least squares, and the quadratic term of
    a second fit must be indistinguishable from 0; intervals are Student-t. Either way the floor must be
    present (its interval above 0) and the slope positive (a measured slope's whole interval: a flat metric
    is left to the power law, whose exponent ≈ 0 says so); otherwise None."""
    from scipy import stats as sps

    pts = sorted((float(a), float(b)) for a, b in zip(x, y, strict=True)
                 if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    if len(set(xs.tolist())) < 2:
        return None
    t = lambda dof: float(sps.t.ppf(0.5 + confidence / 2.0, dof))  # noqa: E731
    if exact:
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        slope = (y1 - y0) / (x1 - x0)
        floor = y0 - slope * x0
        tol = 0.5 + 1e-12 * float(np.max(np.abs(ys)))
        if np.max(np.abs(floor + slope * xs - ys)) > 2 * tol:
            return None
        ds = 2 * tol / (x1 - x0)                         # each end count ±tol
        df = tol + ds * x0
        slope_lo, slope_hi, base_lo, base_hi = slope - ds, slope + ds, floor - df, floor + df
    else:
        if len(pts) < AFFINE_MIN_POINTS_MEASURED or len(set(xs.tolist())) < AFFINE_MIN_POINTS_MEASURED:
            return None
        scale = xs.max()                                  # x in units of its largest value: a well-conditioned fit
        coef, cov, dof = _wls(xs / scale, ys, 1)
        quad, qcov, qdof = _wls(xs / scale, ys, 2)
        qhalf = t(qdof) * math.sqrt(max(qcov[2, 2], 0.0))
        if not quad[2] - qhalf <= 0 <= quad[2] + qhalf:
            return None                                   # it bends: not affine
        floor, slope = float(coef[0]), float(coef[1]) / scale
        fh, sh = t(dof) * math.sqrt(max(cov[0, 0], 0.0)), t(dof) * math.sqrt(max(cov[1, 1], 0.0)) / scale
        slope_lo, slope_hi, base_lo, base_hi = slope - sh, slope + sh, floor - fh, floor + fh
    if not (base_lo > 0 and slope > 0 and (exact or slope_lo > 0)):
        return None                                       # no floor, or no marginal cost measurable: not affine
    past = [(a, b) for a, b in pts if floor / (floor + slope * a) <= FLOOR_NEGLIGIBLE]
    power = fit_loglog([p[0] for p in past], [p[1] for p in past], confidence) if len(past) >= 2 else None
    if exact and power is not None:                       # an exact count's exponent carries no noise interval
        power = Fit(power.exponent, power.exponent, power.exponent, power.intercept, power.r2, power.n)
    return AffineFit(float(floor), float(slope), float(slope_lo), float(slope_hi), float(base_lo), float(base_hi),
                     float(xs[0]), float(xs[-1]), len(pts), exact, power, past[0][0] if power is not None else None)


def fit_cost(x: Sequence[float], y: Sequence[float], *, exact: bool = False,
             confidence: float = 0.95) -> AffineFit | ScalingFit | None:
    """The fit a view shows for a cost vs a swept size: :func:`fit_affine` where the data are affine with a
    floor (the marginal cost per unit, a power law only past the floor), else :func:`fit_scaling`'s power law
    over the scaling regime."""
    return fit_affine(x, y, exact=exact, confidence=confidence) or fit_scaling(x, y, confidence)


@dataclass(frozen=True)
class FloorPowerFit:
    """``y = floor + slope·x^k`` fitted with all three free (relative-error least squares): ``k`` is the exponent of
    the cost above the floor, with its 95 % interval (Student-t, n − 3 degrees of freedom; none for 3 points)."""

    floor: float
    slope: float
    k: float
    k_lo: float
    k_hi: float
    n: int
    x_min: float
    x_max: float


def fit_floor_power(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> FloorPowerFit | None:
    """``y = floor + slope·x^k`` (floor ≥ 0), or None with fewer than 3 sizes or when the fit does not converge.
    Used where the data have a floor (:func:`fit_affine` found one): the exponent of what grows with x, which a
    log-log fit of the whole cost would bias towards 0."""
    from scipy import stats as sps

    from scipy.optimize import curve_fit

    pts = sorted((float(a), float(b)) for a, b in zip(x, y, strict=True)
                 if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    if len({p[0] for p in pts}) < 3:
        return None
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    u = xs / xs.max()                                      # x in units of its largest: well conditioned
    aff = fit_affine(xs, ys, exact=True) or fit_affine(xs, ys)
    p0 = ([aff.base, aff.slope * xs.max(), 1.0] if aff is not None
          else [float(ys.min()) / 2, float(ys.max()), 1.0])
    model = lambda v, a, b, k: a + b * v ** k  # noqa: E731
    try:
        popt, pcov = curve_fit(model, u, ys, p0=p0, sigma=ys, bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 8.0]),
                               maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    a, b, k = (float(v) for v in popt)
    dof = len(pts) - 3
    if dof > 0 and np.all(np.isfinite(pcov)):
        half = float(sps.t.ppf(0.5 + confidence / 2.0, dof)) * math.sqrt(max(float(pcov[2, 2]), 0.0))
        k_lo, k_hi = k - half, k + half
    else:
        k_lo = k_hi = math.nan
    return FloorPowerFit(a, b / xs.max() ** k, k, k_lo, k_hi, len(pts), float(xs[0]), float(xs[-1]))
