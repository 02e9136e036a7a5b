"""The smallest effect a test could have seen: an exact paired-bootstrap interval for the difference of two
failure rates, and the smallest difference that interval would have detected (a rule's ``power`` figure).

C17 compares how often post-norm and pre-norm runs fail, paired (the same learning rate and seed trained with
each placement). Per pair the difference of the two yes/no outcomes is −1, 0 or +1; the gap is their mean.

- :func:`paired_gap` gives the gap with the percentile interval of its bootstrap distribution (resampling the
  pairs), computed exactly — the sum of ``n`` draws from {−1, 0, +1} is a trinomial difference — so the
  interval carries no Monte-Carlo noise.
- :func:`detectable_gap` gives the smallest true gap that interval would have found above ``bound`` with
  probability ``power`` (80 % by default), at the baseline failure rate seen (pre-norm's), the two
  placements failing independently: with few pairs and a rare failure nothing small can be seen, and a rule
  that failed on such a test decided nothing (:func:`claims.rules.powered`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import stats
from scipy.special import gammaln

from claims.model import Figure


def _trinomial(n: int, p_plus: float, p_minus: float) -> np.ndarray:
    """(n+1, n+1): P(x draws at +1, y at −1) over ``n`` independent draws from {−1, 0, +1} with P(+1) =
    ``p_plus`` and P(−1) = ``p_minus`` (0 where x + y > n)."""
    p0 = max(0.0, 1.0 - p_plus - p_minus)
    x = np.arange(n + 1)[:, None]                                   # (n+1, 1): count of +1
    y = np.arange(n + 1)[None, :]                                   # (1, n+1): count of −1
    z = n - x - y
    ok = z >= 0

    def term(k: np.ndarray, q: float) -> np.ndarray:               # k·log q, with 0·log 0 = 0 and k·log 0 = −inf
        return k * math.log(q) if q > 0 else np.where(k > 0, -np.inf, 0.0)
    logp = gammaln(n + 1) - gammaln(x + 1) - gammaln(y + 1) - gammaln(np.maximum(z, 0) + 1) \
        + term(x, p_plus) + term(y, p_minus) + term(np.maximum(z, 0), p0)
    return np.where(ok, np.exp(logp), 0.0)


def _diff_pmf(n: int, p_plus: float, p_minus: float) -> np.ndarray:
    """P(S = s), s = −n…n (index s + n), for S = (#+1) − (#−1) over ``n`` draws (:func:`_trinomial`)."""
    p = _trinomial(n, p_plus, p_minus)
    out = np.bincount(_DIAG(n).ravel(), weights=p.ravel(), minlength=2 * n + 1)   # summed along x − y = s
    return out / out.sum()


@lru_cache(maxsize=64)
def _DIAG(n: int) -> np.ndarray:
    """(n+1, n+1): x − y + n, the index of S for x draws at +1 and y at −1."""
    return np.arange(n + 1)[:, None] - np.arange(n + 1)[None, :] + n


def _quantiles(pmf: np.ndarray, n: int, confidence: float) -> tuple[float, float]:
    """The percentile interval of S / n (S = index − n) at ``confidence``."""
    cdf = np.cumsum(pmf)
    a = (1 - confidence) / 2
    lo = int(np.searchsorted(cdf, a - 1e-12)) - n
    hi = int(np.searchsorted(cdf, 1 - a - 1e-12)) - n
    return lo / n, hi / n


@lru_cache(maxsize=64)
def _lower_table(n: int, confidence: float) -> np.ndarray:
    """The exact bootstrap interval's lower end for every (b, c): b pairs at +1, c at −1 (b + c ≤ n)."""
    table = np.full((n + 1, n + 1), np.nan)
    for b in range(n + 1):
        for c in range(n + 1 - b):
            table[b, c] = _quantiles(_diff_pmf(n, b / n, c / n), n, confidence)[0]
    return table


def paired_gap(a: Sequence[bool], b: Sequence[bool], unit: str = "share of runs", note: str = "",
               confidence: float = 0.95) -> Figure:
    """The rate of ``a`` minus the rate of ``b`` over paired yes/no outcomes, with the exact percentile interval
    of its bootstrap over the pairs. All pairs agreeing gives a point interval: the resampled pairs are all the
    same (whether the test could have seen anything is :func:`detectable_gap`'s question)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired outcomes need the same, non-zero length: {len(a)} and {len(b)}")
    n = len(a)
    plus = sum(bool(x) and not bool(y) for x, y in zip(a, b))
    minus = sum(bool(y) and not bool(x) for x, y in zip(a, b))
    lo, hi = _quantiles(_diff_pmf(n, plus / n, minus / n), n, confidence)
    return Figure((plus - minus) / n, lo, hi, unit, note, n)


def detectable_gap(n: int, base: float, bound: float = 0.0, power: float = 0.8, confidence: float = 0.95,
                   step: float = 0.01) -> float:
    """The smallest true gap (on a grid of ``step``) that :func:`paired_gap`'s interval over ``n`` pairs would
    put wholly above ``bound`` with probability ≥ ``power``, when the baseline fails at rate ``base`` and the
    other at ``base + gap``, independently per pair. ``inf`` when not even the largest possible gap would be."""
    hit = np.nan_to_num(_lower_table(n, confidence), nan=-np.inf) > bound
    for k in range(1, int(round((1 - base) / step)) + 1):
        top = min(1.0, base + k * step)
        pmf = _trinomial(n, top * (1 - base), base * (1 - top))
        if float(pmf[hit].sum()) >= power:
            return round(k * step, 10)
    return math.inf


def exact_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper–Pearson (exact binomial) interval of a proportion k / n."""
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def clopper_pearson(k: int, n: int, unit: str = "share of runs", note: str = "", confidence: float = 0.95) -> Figure:
    """k of n with its exact (Clopper–Pearson) interval."""
    if n <= 0:
        return Figure(float("nan"), unit=unit, note=note or "no runs", n=0)
    lo, hi = exact_interval(k, n, confidence)
    return Figure(k / n, lo, hi, unit, note, n)


# The smallest effect a rule could have seen from a figure's 95% interval: a rule "x ≥ bar" decides only when
# the whole interval lies on one side of the bar, so an effect smaller than its half-width (a difference) or than
# the factor √(hi/lo) (a ratio, on the log scale) cannot be told from no effect. Probes name these figures
# ``power_<figure>`` so a rule can point at them (the ``power`` field); a figure with no interval (an exact count)
# has none: it decides any effect above its rounding.
def diff_resolution(fig: Figure, what: str = "") -> Figure:
    """Half the width of ``fig``'s interval, in its unit: an effect smaller than this could not be seen."""
    if not fig.has_interval or not math.isfinite(fig.lo) or not math.isfinite(fig.hi):  # type: ignore[arg-type]
        return Figure(float("nan"), unit=fig.unit, note=f"{what or 'the figure'} has no finite interval")
    half = (fig.hi - fig.lo) / 2                                                        # type: ignore[operator]
    return Figure(half, unit=fig.unit, n=fig.n,
                  note=f"smallest effect {what or 'the rule'} could have seen: ±{half:.3g} {fig.unit} "
                       f"(half the 95% interval {fig.text()})")


def ratio_resolution(fig: Figure, what: str = "") -> Figure:
    """√(hi/lo) of a positive ratio's interval: a true ratio within that factor of the bar could not be seen
    (the interval would straddle it)."""
    if (not fig.has_interval or not fig.lo or fig.lo <= 0 or not math.isfinite(fig.hi)  # type: ignore[operator]
            or fig.hi <= 0):                                                              # type: ignore[operator]
        return Figure(float("nan"), unit="×", note=f"{what or 'the ratio'} has no finite positive interval")
    factor = math.sqrt(fig.hi / fig.lo)                                                   # type: ignore[operator]
    return Figure(factor, unit="×", n=fig.n,
                  note=f"smallest effect {what or 'the rule'} could have seen: a ratio within ×/÷{factor:.3g} of "
                       f"the bar (from the 95% interval {fig.text()})")
