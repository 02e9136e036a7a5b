"""Rich tables for the terminal: a run's cases and its fitted exponents."""
from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from harness.stats import Fit
from reports.frames import EXPONENT_METRICS, rates, value

STATUS_STYLE = {"ok": "green", "oom": "red", "timeout": "yellow", "error": "bold red", "skipped": "dim"}
MiB = 1024 * 1024


def _num(value: float | None, scale: float = 1.0, fmt: str = "{:,.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value / scale)


def pct_peak(row: dict[str, Any], peak: dict[str, Any] | None) -> str:
    """A case's achieved FLOP/s (counted ``flops`` / median time) as a percentage of the measured matmul
    peak of its dtype on its device (``options["peak"]``), one decimal; ``""`` without a peak or flops."""
    share = rates(row, peak).get("peak_share") if peak else None
    return "" if share is None else f"{100.0 * share:.1f}"


def cases_table(rows: list[dict[str, Any]], axis: str | None, title: str = "",
                peak: dict[str, Any] | None = None) -> Table:
    """One row per case: size, status, median latency with its 95% CI, MACs, % of peak, params, peak memory.

    ``peak`` is the run's ``options["peak"]`` (:mod:`harness.calibrate`); ``% peak`` is the case's
    achieved FLOP/s over the measured matmul peak of its dtype, blank where either is missing.
    Columns that would say the same thing on every row (one architecture, no notes) are left out.
    """
    archs = sorted({r["arch"] for r in rows})
    show_arch = len(archs) > 1
    notes = [r["message"].splitlines()[0][:90] if r["message"] else ("noisy" if r["metrics"].get("noisy") else "")
             for r in rows]
    table = Table(title=title if show_arch else f"{title} · {archs[0] if archs else ''}", header_style="bold")
    cols = [("line", "left")] + ([("arch", "left")] if show_arch else []) + [
        (axis or "case", "right"), ("status", "left"), ("median ms", "right"), ("95% CI ms", "right"),
        ("GMACs", "right"), ("% peak", "right"), ("params M", "right"), ("peak MiB", "right"), ("est. MiB", "right")]
    cols += [("note", "left")] if any(notes) else []
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=col not in ("line", "arch", "note"), overflow="fold")
    for r, note in zip(rows, notes):
        m = r["metrics"]
        ci = f"{m['ci_low_ms']:,.1f}–{m['ci_high_ms']:,.1f}" if "ci_low_ms" in m else "-"
        cells = [r["line"]] + ([r["arch"]] if show_arch else []) + [
            str(value(r, axis)) if axis else r["case_key"][:8],
            f"[{STATUS_STYLE.get(r['status'], '')}]{r['status']}[/]",
            _num(m.get("median_ms")), ci, _num(m.get("macs"), 1e9, "{:,.2f}"), pct_peak(r, peak),
            _num(m.get("params"), 1e6, "{:,.1f}"),
            _num(m.get("peak_bytes"), MiB, "{:,.0f}"), _num(m.get("est_peak_bytes"), MiB, "{:,.0f}")]
        table.add_row(*cells, *([note] if any(notes) else []))
    return table


def _fit(f: Fit | None) -> str:
    return "-" if f is None else str(f)


def exponents_table(fits: dict[str, dict[str, Fit | None]], axis: str) -> Table:
    """Fitted log-log exponent (95% CI) of MACs, latency and memory vs ``axis``, per line."""
    table = Table(title=f"log-log exponent vs {axis} (95% CI)", header_style="bold")
    table.add_column("line")
    for label in EXPONENT_METRICS.values():
        table.add_column(label, justify="right")
    for line, per_metric in fits.items():
        table.add_row(line, *(_fit(per_metric[m]) for m in EXPONENT_METRICS))
    return table


def runs_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(title="stored runs, newest first", header_style="bold")
    for col in ("run", "suite", "quick", "status", "cases", "started", "commit"):
        table.add_column(col)
    for r in runs:
        commit = (r["env"].get("soft", {}).get("commit") or "")[:10]
        table.add_row(r["id"], r["suite"], "yes" if r["quick"] else "", r["status"],
                      f"{r['stored']}/{r['n_cases']}", r["started_at"], commit)
    return table
