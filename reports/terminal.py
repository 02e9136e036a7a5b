"""Rich tables and plain sentences for the terminal: a run's headline, its lines side by side against the
reference, findings and cases, the stored runs, a comparison of two runs, and the claims' verdicts (from their
JSON record)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from harness.contract.records import CaseRecord, RunRecord
from harness.analysis.fits import AffineFit, ScalingFit
from reports.compare import Comparison
from reports.findings import FIT_METRICS, Contrast, Findings, LineFinding, Ratio
from reports.frames import rates, sdpa_backend
from reports import side_by_side as sbs_view
from reports.side_by_side import BEST_MARK, PointTable, SideBySide

STATUS_STYLE = {"ok": "green", "oom": "red", "timeout": "yellow", "error": "bold red", "crashed": "bold magenta", "skipped": "dim"}
VERDICT_STYLE = {"supported": "green", "partly supported": "yellow", "contradicted": "red", "inconclusive": "dim"}
MiB = 1024 * 1024
AXIS_SYMBOL = {"seq_len": "n", "img_size": "s", "batch_size": "b", "n_layers": "L", "n_heads": "h"}
HEADLINE_LINES = 8
"""A run with more lines than this lists, in its headline, only the lines of the contrasts it shows."""


def _num(value: float | None, scale: float = 1.0, fmt: str = "{:,.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value / scale)


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


OVER_PEAK = "⚠"
"""Marks a ``% peak`` above 100: a stale calibration or a count above the work done, shown, never clipped."""


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


def cases_table(records: Sequence[CaseRecord], axis: str | None, title: str = "",
                peak: dict[str, Any] | None = None) -> Table:
    """One row per case: size, status, median latency with its 95% CI, MACs, % of peak, params, peak memory,
    and the SDPA backend that ran where some case recorded one.

    ``% peak`` is the case's executed FLOP/s over the measured matmul peak of its dtype (:func:`peak_percent`),
    blank where either is missing, flagged ``⚠`` above 100 (the caption says what that means). Columns that
    would say the same thing on every row (one architecture, no notes, no SDPA) are left out.
    """
    archs = sorted({r.arch for r in records})
    show_arch = len(archs) > 1
    def note(r: CaseRecord) -> str:
        flags = [f for f, on in (("noisy", r.metric("noisy")),
                                 (f"busy machine ({r.metric('load_others_cores') or 0:.1f} cores)", r.metric("load_busy")))
                 if on]
        return r.message.splitlines()[0][:90] if r.message else ", ".join(flags)
    notes = [note(r) for r in records]
    backends = [sdpa_backend(r) for r in records]
    flagged = any(over_peak(r, peak) for r in records)
    caption = (f"{OVER_PEAK} % peak above 100: a stale calibration (re-run it under the cases' conditions) or a "
               "FLOP count above the work the kernels did" if flagged else None)
    table = Table(title=title if show_arch else f"{title} · {archs[0] if archs else ''}", header_style="bold",
                  caption=caption)
    cols = [("line", "left")] + ([("arch", "left")] if show_arch else []) + [
        (axis or "case", "right"), ("status", "left"), ("median ms", "right"), ("95% CI ms", "right"),
        ("GMACs", "right"), ("% peak", "right"), ("params M", "right"), ("peak MiB", "right"), ("est. MiB", "right")]
    energy = any(r.metric("energy_j") is not None for r in records)
    cols += [("J/call", "right"), ("avg W", "right")] if energy else []
    cols += [("sdpa", "left")] if any(backends) else []
    cols += [("note", "left")] if any(notes) else []
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=col not in ("line", "arch", "note"), overflow="fold")
    for r, note, backend in zip(records, notes, backends):
        lo, hi = r.metric("ci_low_ms"), r.metric("ci_high_ms")
        ci = f"{lo:,.1f}–{hi:,.1f}" if lo is not None and hi is not None else "-"
        cells = [r.line] + ([r.arch] if show_arch else []) + [
            str(r.value(axis)) if axis else r.case_key[:8],
            f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            _num(r.metric("median_ms")), ci, _num(r.metric("macs"), 1e9, "{:,.2f}"), pct_peak(r, peak),
            _num(r.metric("params"), 1e6, "{:,.1f}"),
            _num(r.metric("peak_bytes"), MiB, "{:,.0f}"), _num(r.metric("est_peak_bytes"), MiB, "{:,.0f}")]
        if energy:     # energy beside time (harness.instruments.energy); "-" where absent, its reason in the note
            cells += [_num(r.metric("energy_j"), 1.0, "{:.4g}"), _num(r.metric("avg_power_w"), 1.0, "{:,.1f}")]
        table.add_row(*cells, *([backend] if any(backends) else []), *([note] if any(notes) else []))
    return table


def findings_table(f: Findings) -> Table:
    """Per line: the fitted exponent (95% CI) of time, memory and MACs vs the axis over the scaling
    regime, and the time floor below it."""
    table = Table(title=f"scaling exponents vs {f.axis} (95% CI; fitted where {symbol(f.axis)} scales, "
                        "the floor apart)", header_style="bold")
    table.add_column("line")
    for name in FIT_METRICS.values():
        table.add_column(name, justify="right")
    table.add_column("time floor", justify="right")
    for lf in f.lines:
        t = lf.fits.get("median_ms")
        floor = (f"{t.floor_y:,.2f} ms for {symbol(f.axis)} ≤ {t.floor[-1][0]:g}"
                 if isinstance(t, ScalingFit) and t.floor else "")
        table.add_row(lf.line, *(fit_text(lf.fits.get(m), f.axis, metric=m) for m in FIT_METRICS), floor)
    return table


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


VERDICT_CELL = {"faster": "green", "slower": "red", "same": "dim"}
"""A time ratio's style by its comparison's verdict (the line against the reference)."""


def side_by_side_table(t: PointTable) -> Table:
    """One sweep point's lines against the reference (:mod:`reports.side_by_side`): a row per line, sorted by
    time, ★ on the best figure of each column, † on a line another Pareto-dominates (the notes name which)."""
    table = Table(title=sbs_view.title(t), header_style="bold", box=box.SIMPLE_HEAD)
    cols = sbs_view.table_columns(t)
    table.add_column("line", no_wrap=True)
    for kind, metric in cols:
        table.add_column(sbs_view.header(t, kind, metric), justify="right", no_wrap=True)
    for r in t.rows:
        name = r.line + (f" {sbs_view.DOMINATED_MARK}" if r.dominated_by else "")
        cells: list[RenderableType] = [Text(name, style="bold" if r.reference else ("dim" if r.dominated_by else ""))]
        for kind, metric in cols:
            if kind == "ratio":
                verdict = sbs_view.time_verdict(r) if metric == "median_ms" else ""
                cells.append(Text(sbs_view.ratio_cell(r, metric), style=VERDICT_CELL.get(verdict, "")))
            elif metric in r.best:
                cells.append(Text(f"{sbs_view.figure_cell(r, metric)} {BEST_MARK}", style="bold green"))
            else:
                cells.append(Text(sbs_view.figure_cell(r, metric)))
        if not r.ok:
            cells[1] = Text(r.status, style=STATUS_STYLE.get(r.status, ""))
        table.add_row(*cells)
    return table


def side_by_side_view(sbs: SideBySide, points: int | None = None, run_id: str = "") -> list[RenderableType]:
    """The side-by-side tables with their notes; ``points``: at most that many sweep points — the first and the
    last (the smallest and largest size) — saying how many more ``bench show`` has."""
    shown = list(sbs.points)
    if points is not None and len(shown) > points:
        shown = [shown[0], shown[-1]] if points >= 2 else shown[-1:]
    out: list[RenderableType] = []
    for t in shown:
        out.append(side_by_side_table(t))
        out += [Text("  " + n) for n in sbs_view.notes(sbs, t)]
    sources = sbs_view.quoted_sources(sbs)
    if sources:
        out.append(Text("  " + sbs_view.QUOTED_NOTE))
        out += [Text("    " + s) for s in sources]
    if len(shown) < len(sbs.points):
        out.append(Text(f"  {len(shown)} of {len(sbs.points)} sweep points shown (the smallest and the largest); "
                        f"bench show {run_id or 'RUN'} has every one"))
    return out


def runs_table(runs: Sequence[RunRecord]) -> Table:
    table = Table(title="stored runs, newest first", header_style="bold")
    for col in ("run", "suite", "quick", "status", "cases", "started", "commit"):
        table.add_column(col)
    for r in runs:
        table.add_row(r.id, r.suite, "yes" if r.quick else "", r.status, f"{r.stored}/{r.n_cases}", r.started_at,
                      r.commit[:10])
    return table


def compare_table(result: Comparison, a_id: str, b_id: str) -> Table:
    """Per case shared by two runs: A's and B's median, B/A with its 95% interval, what the interval is over, and
    the verdict (same only when the whole interval lies within the floor; inconclusive with what it could see)."""
    table = Table(title=f"B {b_id} vs A {a_id} (ratio = B/A median, 95% interval)", header_style="bold")
    for col in ("line", "arch", result.axis or "case", "A ms", "B ms", "ratio [95% CI]", "over", "verdict"):
        table.add_column(col, justify="right" if col in ("A ms", "B ms", "ratio [95% CI]") else "left")
    style = {"faster": "green", "slower": "red", "same": "dim", "inconclusive": "yellow"}
    for r in result.rows:
        table.add_row(r["line"], r["arch"], str(r["axis_value"]) if result.axis else r["case_key"][:8],
                      f"{r['a_median_ms']:,.3f}", f"{r['b_median_ms']:,.3f}",
                      f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]", r["over"],
                      f"[{style[r['verdict']]}]{r['verdict']}[/]"
                      + (f" (could see ≥ {100 * r['mde']:.0f} %)" if r["verdict"] == "inconclusive" else ""))
    return table


def interleaved_table(rows: list[dict[str, Any]], a_id: str, b_id: str) -> Table:
    """Pairs re-measured side by side: A's and B's median, B/A over the rounds with its 95% interval, verdict."""
    table = Table(title=f"B {b_id} vs A {a_id}, measured again side by side (ratio = B/A per round, 95% interval "
                        "over rounds)", header_style="bold")
    for col in ("line", "case", "A ms", "B ms", "ratio [95% CI]", "rounds", "verdict"):
        table.add_column(col, justify="right" if col in ("A ms", "B ms", "ratio [95% CI]", "rounds") else "left")
    style = {"faster": "green", "slower": "red", "same": "dim", "inconclusive": "yellow", "failed": "bold red"}
    for r in rows:
        if r["verdict"] == "failed":
            table.add_row(r["line"], r["label"], "-", "-", r.get("message", "")[:60], "-",
                          f"[{style['failed']}]failed[/]")
            continue
        table.add_row(r["line"], r["label"], f"{r['a_median_ms']:,.3f}", f"{r['b_median_ms']:,.3f}",
                      f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]", str(r["rounds"]),
                      f"[{style[r['verdict']]}]{r['verdict']}[/]")
    return table


_MARK = {"pass": "✓", "fail": "✗"}


def verdict_table(doc: dict[str, Any]) -> Table:
    """The claims' verdicts with the figures that decided them, from a checked claims document."""
    t = Table(title="claims: verdicts (figures with 95% intervals)", header_style="bold", show_lines=False)
    for col in ("id", "claim", "verdict", "deciding figures (★ central)"):
        t.add_column(col, overflow="fold")
    for c in doc["claims"]:
        figs = "; ".join(f"{'★ ' if o.get('central') else '(context) ' if o.get('context') else ''}"
                         f"{o['figure']} {o['measured']['text']} "
                         f"{_MARK.get(o['status'], '?')}"
                         + (f" @{o['decided_on']}" if "+" in str(c.get("device")) and o.get("decided_on") else "")
                         + (" ⚠" if o.get("conflict") else "")
                         for o in c["rules"] if o["measured"] is not None and o["status"] != "unavailable")
        missing = [o["detail"] for o in c["rules"] if o["status"] == "unavailable"]
        if missing:
            figs += ("; " if figs else "") + "not tested: " + "; ".join(missing)
        where = f"{c.get('device', '?')}, {c.get('mode', '?')}" + (", probe failed" if c.get("probe_failed") else "")
        t.add_row(c["id"], c["title"], f"[{VERDICT_STYLE[c['verdict']]}]{c['verdict']}[/]\n[dim]({where})[/]", figs)
    return t
