"""Rich tables for the terminal: a run's cases and findings, its lines side by side against the reference, the stored
runs, a comparison of two runs, and the claims' verdicts (from their JSON record). Their words are
:mod:`reports.sentences`, which every view shares.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from harness.analysis.fits import ScalingFit
from harness.contract.records import CaseRecord, RunRecord
from reports import side_by_side as sbs_view
from reports.compare import Comparison
from reports.findings import FIT_METRICS, Findings
from reports.frames import sdpa_backend
from reports.sentences import OVER_PEAK, fit_text, over_peak, pct_peak, symbol
from reports.side_by_side import BEST_MARK, PointTable, SideBySide

STATUS_STYLE = {"ok": "green", "oom": "red", "timeout": "yellow", "error": "bold red", "crashed": "bold magenta", "skipped": "dim"}
VERDICT_STYLE = {"supported": "green", "partly supported": "yellow", "contradicted": "red", "inconclusive": "dim"}
MiB = 1024 * 1024


def _num(value: float | None, scale: float = 1.0, fmt: str = "{:,.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value / scale)


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
