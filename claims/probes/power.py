"""The smallest effect a rule could have seen: from a figure's 95% interval, how far from the rule's bar the
true value must lie for the rule to decide (pass or fail) rather than straddle.

A rule "x ≥ bar" decides only when the whole interval lies on one side of the bar; an interval of half-width
h centred on the bar straddles, so an effect smaller than h (a difference) or than the factor √(hi/lo)
(a ratio, judged on the log scale) cannot be told from no effect. These figures are named ``power_<figure>``
so a rule can point at them (claims/rules.py's optional ``power`` field); a figure with no interval (an exact
count, one memory pass) has no resolution figure: it decides any effect above its rounding.
"""
from __future__ import annotations

import math

from claims.model import Figure


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
