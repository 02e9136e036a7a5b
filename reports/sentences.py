"""The plain text every view of a run shares (the terminal, the HTML report, the plots' legends): numbers with SI
prefixes, a fit in words, the ``% peak`` cell, a contrast and a line's finding in a sentence, and the run's
headline — which contrasts it shows, chosen by rule (:func:`headline_contrasts`) — as ``bench run`` prints it.
"""
from __future__ import annotations

import math
from typing import Any

from harness.analysis.fits import AffineFit, ScalingFit
from harness.contract.records import CaseRecord
from reports.findings import FIT_METRICS, Contrast, Findings, LineFinding, Ratio
from reports.frames import rates
from reports.side_by_side import OVER_PEAK, SideBySide

__all__ = ["AXIS_SYMBOL", "AXIS_UNIT", "HEADLINE_LINES", "OVER_PEAK", "affine_text", "against", "contrast_text",
           "fit_text", "headline_contrasts", "headline_lines", "line_text", "over_peak", "pct_peak", "peak_percent",
           "si", "symbol"]

AXIS_SYMBOL = {"seq_len": "n", "img_size": "s", "batch_size": "b", "n_layers": "L", "n_heads": "h"}
HEADLINE_LINES = 8
"""A run with more lines than this lists, in its headline, only the lines of the contrasts it shows."""


def symbol(axis: str | None) -> str:
    return AXIS_SYMBOL.get(axis or "", axis or "x")


AXIS_UNIT = {"seq_len": "token", "batch_size": "sample", "img_size": "px", "n_layers": "layer", "n_heads": "head"}
"""What one unit of a swept axis is, for a marginal cost (``0.86 µs/token``)."""

_METRIC_UNIT = {"median_ms": ("s", 1e-3), "peak_bytes": ("B", 1.0), "activation_peak_bytes": ("B", 1.0),
                "bytes_moved": ("B", 1.0), "macs": ("", 1.0), "flops": ("", 1.0)}
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix: ``si(2.3e-6, "s") == "2.3 µs"``, ``si(6144) == "6.14 k"``."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}".strip()
    scale, prefix = next(((f, p) for f, p in _SI if abs(value) >= f * 0.9995), _SI[-1])
    return f"{value / scale:.{digits}g} {prefix}{unit}".strip()


def affine_text(fit: AffineFit, axis: str | None, metric: str = "") -> str:
    """``0.54 ms + 75.1 ns/token [57.4, 92.8]`` (a measured cost: the marginal cost per unit of the axis with its
    95 % interval), ``23.1 M + 6.14 k/token (exact)`` (an exact count: no noise interval), then the exponent of
    the cost above the floor, ``; n^0.97 [0.93, 1.01] above the floor`` (``n^1.00`` for an exact count), or
    ``(no exponent above the floor: the fit did not converge)``."""
    unit, scale = _METRIC_UNIT.get(metric, ("", 1.0))
    per = AXIS_UNIT.get(axis or "", symbol(axis))
    slope = fit.slope * scale
    text = f"{si(fit.base * scale, unit)} + {si(slope, unit)}/{per}"
    notes = []
    if fit.exact:
        notes.append("exact")
    elif math.isfinite(fit.slope_lo):
        lo, hi = fit.slope_lo * scale, fit.slope_hi * scale
        factor = next((f for f, _ in _SI if abs(slope) >= f * 0.9995), _SI[-1][0])
        text += f" [{lo / factor:.3g}, {hi / factor:.3g}]"
    if fit.power is None:
        notes.append("no exponent above the floor: the fit did not converge")
    if notes:
        text += f" ({'; '.join(notes)})"
    if fit.power is not None:
        text += f"; {symbol(axis)}^{fit.power} above the floor"
    return text


def fit_text(fit: ScalingFit | AffineFit | None, axis: str | None, regime: bool = True, metric: str = "") -> str:
    """``n^2.02 [1.98, 2.05]`` (with ``for n ≥ 1024`` when the fit leaves a floor below); an affine fit as
    :func:`affine_text` (``metric`` names its unit); ``-`` for no fit."""
    if fit is None:
        return "-"
    if isinstance(fit, AffineFit):
        return affine_text(fit, axis, metric)
    text = f"{symbol(axis)}^{fit}"
    if regime and fit.floor:
        text += f" for {symbol(axis)} ≥ {fit.x_min:g}"
    return text


def peak_percent(rec: CaseRecord, peak: dict[str, Any] | None) -> float | None:
    """A case's FLOP/s as a percentage of the measured matmul peak of its dtype on its device: the executed
    FLOPs where the record has ``executed_macs`` (fused causal attention skips half the scores), else the
    counted ``flops``, over the median time (:func:`reports.frames.rates`); None without a peak or flops."""
    share = rates(rec, peak).get("peak_share") if peak else None
    return None if share is None else 100.0 * share


def over_peak(rec: CaseRecord, peak: dict[str, Any] | None) -> bool:
    """Whether the case's ``% peak`` (:func:`peak_percent`) is above 100 — to its one decimal as shown."""
    pct = peak_percent(rec, peak)
    return pct is not None and round(pct, 1) > 100.0


def pct_peak(rec: CaseRecord, peak: dict[str, Any] | None, flag: bool = True) -> str:
    """:func:`peak_percent` with one decimal, ``"116.0 ⚠"`` above 100 (``flag=False``: the number alone,
    for a view that marks it otherwise); ``""`` without a peak or flops."""
    pct = peak_percent(rec, peak)
    if pct is None:
        return ""
    return f"{pct:.1f} {OVER_PEAK}" if flag and over_peak(rec, peak) else f"{pct:.1f}"


def _times(r: Ratio, faster: str, slower: str, same: str, tol: float = 0.03, what: str = "time") -> str:
    """``3.1× [2.9, 3.3] faster``; a ratio whose interval holds 1 (and is not within ``tol`` of it) gives no
    direction: ``time undecided (ratio 2.5, 95 % interval [0.35, 3] holds 1)``. A timing says what its comparison
    (:class:`harness.analysis.comparison.Comparison`) decided: the same time only within the floor, else undecided
    with what it could see, or the direction it showed."""
    interval = f" [{r.lo:.2g}, {r.hi:.2g}]" if r.lo is not None and r.hi is not None else ""
    c = r.comparison
    if c is not None and c.verdict == "unchanged":
        return f"{same} within {100 * c.floor:.0f} % ({r.value:.2f}×{interval}, {c.units_text})"
    if c is not None and c.verdict == "inconclusive":
        return f"{what} undecided (ratio {r.value:.2g}, 95 % interval{interval}, {c.units_text}; {c.mde_text})"
    if c is not None:
        tol = 0.0
    if interval and r.lo <= 1.0 <= r.hi and abs(r.value - 1) >= tol:
        return f"{what} undecided (ratio {r.value:.2g}, 95 % interval{interval} holds 1)"
    if abs(r.value - 1) < tol:
        return same + (f" ({r.value:.2f}×{interval})" if interval else "")
    if r.value > 1:
        return f"{r.value:.2g}×{interval} {faster}"
    return f"{1 / r.value:.2g}× {slower}" + (f" [{1 / r.hi:.2g}, {1 / r.lo:.2g}]" if interval else "")


def contrast_text(c: Contrast, axis: str | None) -> str:
    """``at n=4096, 'sdpa fwd' vs 'eager fwd' (attn_impl): 3.1× [2.9, 3.3] faster, 12× less memory``."""
    where = f"at {symbol(axis)}={c.x}, " if axis else ""
    parts = []
    if c.time:
        parts.append(_times(c.time, "faster", "slower", "the same time"))
    if c.memory:
        parts.append(_times(c.memory, "less memory", "more memory", "the same memory", what="memory"))
    if c.macs and abs(c.macs.value - 1) >= 0.03:
        parts.append(_times(c.macs, "fewer MACs", "more MACs", "the same MACs", what="MACs"))
    return f"{where}{c.b} vs {c.a} ({c.key} {c.b_value} vs {c.a_value}): " + ", ".join(parts or ["no figures"])


def line_text(lf: LineFinding, axis: str | None) -> str:
    """``eager fwd: time ∝ n^2.02 [1.98, 2.05], memory ∝ n^2.00 [...], MACs ∝ n^2.00; time floor 4.4 ms for n ≤ 512``;
    an affine cost reads ``MACs = 23.1 M + 6.14 k/token (exact); no power law (...)``."""
    parts = [f"{name} {'=' if isinstance(lf.fits[m], AffineFit) else '∝'} {fit_text(lf.fits[m], axis, metric=m)}"
             for m, name in FIT_METRICS.items() if lf.fits.get(m)]
    t = lf.fits.get("median_ms")
    if isinstance(t, ScalingFit) and t.floor:
        parts.append(f"time floor {t.floor_y:,.3g} ms for {symbol(axis)} ≤ {t.floor[-1][0]:g}")
    failed = {s: n for s, n in lf.statuses.items() if s != "ok"}
    if failed:
        parts.append(", ".join(f"{n} {s}" for s, n in failed.items()))
    return f"{lf.line}: " + ("; ".join(parts) if parts else "no fit (fewer than 2 ok sizes)")


def _inverse(r: Ratio | None) -> Ratio | None:
    """The same comparison read the other way round (b ÷ a): ``1/value`` with the interval's ends swapped (and its
    :class:`~harness.analysis.comparison.Comparison` inverted)."""
    if r is None:
        return None
    lo, hi = (1 / r.hi, 1 / r.lo) if r.lo and r.hi else (None, None)
    return Ratio(1 / r.value, lo, hi, r.processes, r.comparison.inverse() if r.comparison is not None else None)


def against(c: Contrast, reference: str) -> Contrast:
    """``c`` with the reference as ``a`` (so its sentence reads "LINE vs REFERENCE")."""
    if c.a == reference:
        return c
    return Contrast(c.key, c.b, c.a, c.b_value, c.a_value, c.x, _inverse(c.time), _inverse(c.memory),
                    _inverse(c.macs))


def headline_contrasts(f: Findings, reference: str | None = None, side_by_side: bool = False) -> list[Contrast]:
    """The contrasts a run's summary prints, each chosen by a rule, at the largest size both lines reached.

    With a ``reference`` line: per differing parameter, the contrasts of the reference with the line that differs
    from it in that parameter alone ("GQA-2 vs MHA"); where several lines do (seven models differing in ``name``)
    and the run's side-by-side table shows them (``side_by_side``), none — the table has each against the
    reference; a parameter the reference has no such pair in is left to the table too when there is one.
    Without a table or a reference: per parameter, the pair whose other parameters are those of the first line
    that has one (e.g. eager vs sdpa at MHA fwd)."""
    if reference is not None:
        chosen: list[Contrast] = []
        keys = list(dict.fromkeys(c.key for c in f.contrasts))
        for key in keys:
            mine = [against(c, reference) for c in f.contrasts if c.key == key and reference in (c.a, c.b)]
            if mine and not (side_by_side and len(mine) > 1):
                chosen += mine
            elif not mine and not side_by_side:
                chosen += _anchored(f, [c for c in f.contrasts if c.key == key])
        return chosen
    return [c for key in dict.fromkeys(c.key for c in f.contrasts)
            for c in _anchored(f, [c for c in f.contrasts if c.key == key])]


def _anchored(f: Findings, rivals: list[Contrast]) -> list[Contrast]:
    """Of the contrasts in one parameter, the one whose other parameters are those of the first line that has one."""
    if not rivals:
        return []
    first = {lf.line: lf.params for lf in f.lines}
    anchor = next((lf.params for lf in f.lines if any(d.a == lf.line for d in rivals)), first[rivals[0].a])
    key = rivals[0].key
    return [next((d for d in rivals if all(first[d.a].get(k) == v for k, v in anchor.items() if k != key)),
                 rivals[0])]


def headline_lines(f: Findings, sbs: SideBySide | None = None) -> list[str]:
    """What the run shows, in a few sentences: how each line scales, and the one-parameter contrasts — with a
    side-by-side view (``sbs``), those against its reference that the table does not already show
    (:func:`headline_contrasts`)."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(f.statuses.items(), key=lambda kv: kv[0] != "ok"))
    out = [f"{f.suite} · run {f.run_id} · {sum(f.statuses.values())} cases: {counts}"
           + (f" · measured on a busy machine ({f.busy} ok case{'s' if f.busy != 1 else ''} timed while other "
              f"processes used up to {f.busy_cores:.1f} cores: its times are not reliable)" if f.busy else "")]
    contrasts = headline_contrasts(f, sbs.reference, True) if sbs else headline_contrasts(f)
    shown = f.lines
    if len(shown) > HEADLINE_LINES:
        named = {c.a for c in contrasts} | {c.b for c in contrasts}
        shown = [lf for lf in f.lines if lf.line in named][:HEADLINE_LINES]
    if f.axis and any(any(lf.fits.values()) for lf in shown):
        out += ["  " + line_text(lf, f.axis) for lf in shown]
    out += ["  " + contrast_text(c, f.axis) for c in contrasts]
    if f.intervals and (contrasts or f.axis):
        out.append("  " + f.intervals)
    return out
