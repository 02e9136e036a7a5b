"""One self-contained HTML report of one or more stored runs (Jinja2, autoescaped, inline CSS and SVG).

Every string that comes from results or suite files reaches the page through the template's
autoescaping; the only markup inserted verbatim is the SVG that matplotlib writes (which escapes
its own text). The page loads nothing: no scripts, stylesheets, fonts or images from anywhere.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.errors import BenchInputError
from harness.stats import Fit, summarize
from harness.suite import find_suite
from reports.export import run_peak
from reports.frames import EXPONENT_METRICS, exponents, value
from reports.plots import figure_svg, resolve_plot_spec, roofline_data, roofline_figure, suite_figure

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"
MiB = 1024 * 1024
GiB = 1024 * MiB

Run = dict[str, Any]
Rows = list[dict[str, Any]]


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def suite_info(run: Run) -> tuple[str, dict[str, Any]]:
    """The suite's description and ``plot`` table, read from its TOML if the file still exists.

    The stored path may be relative to wherever ``bench run`` was started; it is looked up as given,
    then as a built-in suite. A file that is gone or unreadable gives ``("", {})``: the caller falls
    back to the sweep axis and ``median_ms``.
    """
    ref = run.get("suite_path")
    try:
        data = tomllib.loads(find_suite(ref).read_text()) if ref else {}
    except (BenchInputError, OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        data = {}
    description = data.get("description", "")
    plot = data.get("plot", {})
    return (description if isinstance(description, str) else "", plot if isinstance(plot, dict) else {})


def _num(v: Any, scale: float = 1.0, fmt: str = "{:,.3f}") -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return "–"
    return fmt.format(v / scale)


def _env_value(key: str, v: Any) -> str:
    if v is None:
        return "–"
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / GiB:,.1f} GiB ({v:,} bytes)"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str) if v else "none"
    return str(v)


def _fit(f: Fit | None) -> str:
    return "–" if f is None else str(f)


def _axis_value(r: dict[str, Any], axis: str | None) -> str:
    return str(value(r, axis)) if axis else r["case_key"][:8]


def _case_row(r: dict[str, Any], axis: str | None) -> dict[str, Any]:
    m = r["metrics"]
    ci = f"{m['ci_low_ms']:,.3f} – {m['ci_high_ms']:,.3f}" if "ci_low_ms" in m and "ci_high_ms" in m else "–"
    note = r["message"] or ("noisy (IQR/median ≥ 0.10)" if m.get("noisy") else "")
    return {"case_key": r["case_key"], "line": r["line"], "arch": r["arch"], "x": _axis_value(r, axis),
            "status": r["status"], "median": _num(m.get("median_ms")), "ci": ci,
            "macs": _num(m.get("macs"), 1e9, "{:,.3f}"), "params": _num(m.get("params"), 1e6, "{:,.2f}"),
            "peak": _num(m.get("peak_bytes"), MiB, "{:,.1f}"),
            "est_peak": _num(m.get("est_peak_bytes"), MiB, "{:,.1f}"),
            "message": note}


def _raw_stats(r: dict[str, Any], axis: str | None) -> dict[str, Any]:
    samples = [float(s) for s in r.get("samples_s") or []]
    stats = summarize(samples) if samples else {}
    keys = ("n_samples", "min_ms", "q1_ms", "median_ms", "q3_ms", "max_ms", "p90_ms", "p99_ms", "mean_ms",
            "stdev_ms", "iqr_ms", "rel_iqr", "ci_low_ms", "ci_high_ms")
    table = [(k, f"{int(stats[k])}" if k == "n_samples" else f"{stats[k]:.6g}") for k in keys if k in stats]
    other = sorted((k, _num(v, 1.0, "{:.6g}")) for k, v in r["metrics"].items() if k not in stats)
    return {"case_key": r["case_key"],
            "summary": f"{r['line']} · {r['arch']} · {_axis_value(r, axis)} · {r['status']}",
            "stats": table, "metrics": other, "samples_ms": ", ".join(f"{s * 1e3:.6g}" for s in samples),
            "n": len(samples), "config": json.dumps(r["config"], sort_keys=True, default=str),
            "workload": json.dumps(r["workload"], sort_keys=True, default=str)}


def _run_context(index: int, run: Run, rows: Rows) -> dict[str, Any]:
    description, plot = suite_info(run)
    spec = resolve_plot_spec(plot, rows)
    axis = spec["x"]
    svg = roofline = None
    if rows:
        svg = Markup(figure_svg(suite_figure(rows, plot)))  # matplotlib's SVG; its text is XML-escaped by matplotlib
        peak = run_peak(run)
        data = roofline_data(rows, peak)
        roofline = {"figure": Markup(figure_svg(roofline_figure(rows, peak, data))), "n_points": data["n_points"],
                    "left_out": data["left_out"], "not_ok": data["not_ok"],
                    "roofs": [{"device": r["device"], "dtype": r["dtype"],
                               "gflops": _num(r["flops_per_s"], 1e9, "{:,.1f}"),
                               "gbps": _num(r["bytes_per_s"], 1e9, "{:,.1f}"),
                               "ridge": _num(r["ridge"], 1.0, "{:,.1f}")} for r in data["roofs"]]}
    fits = []
    numeric = axis is not None and rows and all(isinstance(value(r, axis), (int, float)) for r in rows)
    if numeric and any(r["status"] == "ok" for r in rows):
        fits = [{"line": line, "fits": [_fit(per[m]) for m in EXPONENT_METRICS]}
                for line, per in exponents(rows, axis).items()]
    env = run.get("env") or {}
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {
        "index": index, "id": run["id"], "suite": run["suite"], "suite_path": run.get("suite_path") or "",
        "quick": bool(run.get("quick")), "status": run.get("status", ""), "started_at": run.get("started_at", ""),
        "finished_at": run.get("finished_at") or "", "n_cases": run.get("n_cases", len(rows)), "stored": len(rows),
        "counts": sorted(counts.items()), "description": description, "axis": axis or "case", "y": spec["y"],
        "options": json.dumps(run.get("options") or {}, default=str),
        "hard": [(k, _env_value(k, v)) for k, v in (env.get("hard") or {}).items()],
        "soft": [(k, _env_value(k, v)) for k, v in (env.get("soft") or {}).items()],
        "cases": [_case_row(r, axis) for r in rows], "show_arch": len({r["arch"] for r in rows}) > 1,
        "figure": svg, "roofline": roofline, "fit_labels": list(EXPONENT_METRICS.values()), "fits": fits,
        "raw": [_raw_stats(r, axis) for r in rows],
    }


def aligned_table(runs: list[tuple[Run, Rows]]) -> dict[str, Any]:
    """Cases of several runs aligned on their case keys: median ms per run and its ratio to the first run.

    One row per case key (in order of first appearance); a run that lacks a case, or whose case has
    no median (oom, skipped, ...), shows its status instead of a number.
    """
    by_run = [{r["case_key"]: r for r in rows} for _, rows in runs]
    keys = list(dict.fromkeys(k for index in by_run for k in index))
    axes = [resolve_plot_spec(suite_info(run)[1], rows)["x"] for run, rows in runs]
    out_rows = []
    for key in keys:
        first = next(index[key] for index in by_run if key in index)
        axis = next((a for a, index in zip(axes, by_run) if key in index), None)
        base = by_run[0].get(key, {}).get("metrics", {}).get("median_ms")
        cells = []
        for i, index in enumerate(by_run):
            r = index.get(key)
            median = r["metrics"].get("median_ms") if r else None
            shown = _num(median) if median is not None else (r["status"] if r else "absent")
            ratio = "" if i == 0 else (f"{median / base:.3f}×" if median and base else "–")
            cells.append({"median": shown, "ratio": ratio, "status": r["status"] if r else "absent"})
        out_rows.append({"case_key": key, "line": first["line"], "arch": first["arch"],
                         "x": _axis_value(first, axis), "cells": cells})
    shared = len(set.intersection(*(set(index) for index in by_run))) if by_run else 0
    return {"runs": [run["id"] for run, _ in runs], "rows": out_rows, "shared": shared, "total": len(keys)}


def render_report(runs: list[tuple[Run, Rows]], claims: dict[str, Any] | None = None) -> str:
    """One self-contained HTML page: per run its fingerprint, cases, figure and raw statistics;
    with several runs, a side-by-side table aligned on case keys (median and ratio to the first run);
    with ``claims`` (bench claims' JSON record), the claims section: each verdict with its evidence."""
    contexts = [_run_context(i, run, rows) for i, (run, rows) in enumerate(runs)]
    suites = list(dict.fromkeys(run["suite"] for run, _ in runs))
    title = f"bench report · {', '.join(suites + (['claims'] if claims else [])) or 'no runs'}"
    section: dict[str, Any] = {}
    if claims:
        from reports.claims_view import claims_section
        section = claims_section(claims, heading=3)
    html = _env().get_template(TEMPLATE).render(
        title=title, runs=contexts, aligned=aligned_table(runs) if len(runs) > 1 else None,
        generated=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **({"claims": None} | section))
    return html
