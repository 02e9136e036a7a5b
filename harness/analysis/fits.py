"""The one fit of a cost against a swept size (:func:`fit_cost`), which the run's headline, the report's plots, the
generation view and the claims all read; and the pieces it is made of.

- :func:`fit_cost`: where the data are affine with a floor (weights read once, a launch, a fixed allocation), the
  floor and the marginal cost per unit (:class:`AffineFit`) with the exponent of the cost above the floor, ``k`` of
  ``floor + slope·x^k`` (an exact count that is affine within rounding has k = 1 exactly); else the log-log
  exponent over the scaling regime (:class:`ScalingFit`, the floor points below it reported apart). A metric that
  falls with x (a throughput) is fitted through its reciprocal (the time it is the inverse of) and mirrored.
- :func:`fit_loglog` (a least-squares power law with its t interval), :func:`fit_scaling` (the fit-range rule),
  :func:`fit_affine`, :func:`fit_floor_power` and :func:`top_slope`: the parts, for what needs one alone.
- :func:`fit_line`: an ordinary least-squares line with its t interval (a slope per token, a gap per decade).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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
        """``k [lo, hi]``, or just ``k`` when the interval is undefined (two points) or nil (an exact count)."""
        if math.isnan(self.ci_low) or self.ci_low == self.ci_high == self.exponent:
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


# -- affine costs: cost = floor + slope·x -----------------------------------------------------------------
AFFINE_MIN_POINTS_MEASURED = 4
"""A measured (noisy) metric is called affine only with this many sizes: one degree of freedom beyond a
quadratic term, whose interval must hold 0 (fewer points cannot tell a line from a bend)."""


@dataclass(frozen=True)
class AffineFit:
    """``y = base + slope·x`` over x in [``x_min``, ``x_max``]: the floor (weights read once, a launch, a fixed
    overhead) and the marginal cost per unit of x (``slope``: MACs, bytes or ms per token / per image) with its
    95 % interval. ``exact``: an exact count fitted within its rounding (the interval is the rounding's, no
    noise). ``power``: the exponent of the cost above the floor over every point, ``k`` of ``floor + slope·x^k``
    (:func:`fit_floor_power`; exactly 1 for an exact count, affine within rounding), None when that fit does not
    converge."""

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

    @property
    def exponent(self) -> float | None:
        """The exponent of the cost above the floor (see ``power``), else None."""
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
    """``y = floor + slope·x`` when the data are affine with a floor, with the exponent of what grows above the
    floor (``power``), else None (use :func:`fit_scaling`).

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
    if exact:                                             # affine within rounding: k = 1, no noise interval
        power: Fit | None = Fit(1.0, 1.0, 1.0, math.log(slope), 1.0, len(pts))
    else:
        fp = _floor_power(xs, ys, [floor, slope * xs.max(), 1.0], confidence)
        power = (Fit(fp.k, fp.k_lo, fp.k_hi, math.log(fp.slope) if fp.slope > 0 else math.nan, math.nan, fp.n)
                 if fp is not None else None)
    return AffineFit(float(floor), float(slope), float(slope_lo), float(slope_hi), float(base_lo), float(base_hi),
                     float(xs[0]), float(xs[-1]), len(pts), exact, power)


def fit_cost(x: Sequence[float], y: Sequence[float], *, exact: bool = False,
             confidence: float = 0.95) -> AffineFit | ScalingFit | None:
    """The one fit of a cost against a swept size, which every view and the claims read: :func:`fit_affine` where
    the data are affine with a floor (the marginal cost per unit, and the exponent above the floor), else
    :func:`fit_scaling`'s power law over the scaling regime. A metric that falls with x (throughput: items per
    second) gets the scaling rule through its reciprocal (seconds per item, which rises out of a floor), the fit
    mirrored, so its regime and floor are those of the time it is the inverse of. None with fewer than 2 sizes."""
    slope = top_slope(x, y)
    if slope is not None and slope < 0:
        inv = fit_scaling(x, [1.0 / v if v else math.inf for v in y], confidence)
        if inv is None:
            return None
        f = inv.fit
        return ScalingFit(Fit(-f.exponent, -f.ci_high, -f.ci_low, -f.intercept, f.r2, f.n), inv.x_min, inv.x_max,
                          tuple((px, 1.0 / py) for px, py in inv.floor))
    return fit_affine(x, y, exact=exact, confidence=confidence) or fit_scaling(x, y, confidence)


def cost_exponent(fit: AffineFit | ScalingFit | None) -> Fit | None:
    """The exponent a :func:`fit_cost` result gives, with its interval: above the floor for an affine fit, over the
    scaling regime otherwise; None where there is none."""
    if fit is None:
        return None
    return fit.power if isinstance(fit, AffineFit) else fit.fit


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
    """``y = floor + slope·x^k`` (floor ≥ 0), or None with fewer than 3 sizes or when the fit does not converge: the
    exponent of what grows with x, which a log-log fit of the whole cost would bias towards 0 (an affine fit's
    ``power``)."""
    pts = sorted((float(a), float(b)) for a, b in zip(x, y, strict=True)
                 if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    if len({p[0] for p in pts}) < 3:
        return None
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    aff = fit_affine(xs, ys, exact=True) or fit_affine(xs, ys)
    p0 = ([aff.base, aff.slope * xs.max(), 1.0] if aff is not None
          else [float(ys.min()) / 2, float(ys.max()), 1.0])
    return _floor_power(xs, ys, p0, confidence)


def _floor_power(xs: np.ndarray, ys: np.ndarray, p0: list[float], confidence: float) -> FloorPowerFit | None:
    """:func:`fit_floor_power` of sorted positive points from the start ``p0`` = (floor, slope·x_max^k, k)."""
    from scipy import stats as sps
    from scipy.optimize import curve_fit

    if len(set(xs.tolist())) < 3:
        return None
    u = xs / xs.max()                                      # x in units of its largest: well conditioned
    model = lambda v, a, b, k: a + b * v ** k  # noqa: E731
    try:
        popt, pcov = curve_fit(model, u, ys, p0=p0, sigma=ys, bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 8.0]),
                               maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    a, b, k = (float(v) for v in popt)
    dof = len(xs) - 3
    if dof > 0 and np.all(np.isfinite(pcov)):
        half = float(sps.t.ppf(0.5 + confidence / 2.0, dof)) * math.sqrt(max(float(pcov[2, 2]), 0.0))
        k_lo, k_hi = k - half, k + half
    else:
        k_lo = k_hi = math.nan
    return FloorPowerFit(a, b / xs.max() ** k, k, k_lo, k_hi, len(xs), float(xs[0]), float(xs[-1]))


# -- straight lines ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LineFit:
    """``y = intercept + slope·x`` by ordinary least squares over ``n`` points, the slope's interval Student-t
    (n − 2 degrees of freedom; nan with two points)."""

    slope: float
    intercept: float
    slope_lo: float
    slope_hi: float
    n: int


def fit_line(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> LineFit | None:
    """The least-squares line through finite points; None with fewer than 2 distinct x."""
    from scipy import stats as sps

    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True) if math.isfinite(a) and math.isfinite(b)]
    if len({p[0] for p in pts}) < 2:
        return None
    res = sps.linregress([p[0] for p in pts], [p[1] for p in pts])
    n = len(pts)
    half = float(sps.t.ppf(0.5 + confidence / 2.0, n - 2)) * float(res.stderr) if n > 2 else math.nan
    return LineFit(float(res.slope), float(res.intercept), float(res.slope) - half, float(res.slope) + half, n)
