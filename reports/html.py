"""One self-contained HTML report of stored runs (Jinja2, autoescaped, inline CSS and SVG), made from the
store alone: the records, and the suite as it was run (``run.spec``), never the suite file.

Per suite, it opens on what each run shows (where its lines are different models: every line against the
reference side by side at each sweep point; then the sentences ``bench run`` prints, the fitted exponents with
their scaling regime and floor, and the lead figure), then the runs of that suite side by side (only the
cases they share), then per run a figure per metric, the roofline (points above the roof flagged), the
cases, the raw statistics; then the environment fingerprints; then the claims, when given.

Every string from results reaches the page through the template's autoescaping; the only markup inserted
verbatim is the SVG that matplotlib writes (which escapes its own text). The page loads nothing.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from reports import generation as gen
from reports import energy_view, frontier
from reports import side_by_side as sbs_view
from reports.claims_view import claims_section
from reports.findings import FIT_METRICS, Findings, run_findings
from reports.jinja import template_env
from reports.labels import case_labels
from reports.plots import PlotSpec, figure_metrics, figure_svg, metric_figure, metric_view, resolve_plot_spec
from reports.report_tables import case_table, env_table, findings_rows, headline, num, raw_stats, side_by_side
from reports.roofline import ABOVE_ROOF_MEANING, roofline_data, roofline_figure
from reports.sentences import symbol
from reports.training_view import memory_figure, size_figure, training_rows
from reports.ranks_view import rank_rows, scaling_figure

__all__ = ["render_report", "write_report", "template_env"]

TEMPLATE = "report.html.j2"
Run = tuple[RunRecord, Sequence[CaseRecord]]


def render_report(runs: Sequence[Run], claims: Mapping[str, Any] | None = None,
                  history: Mapping[str, Any] | None = None) -> str:
    """The self-contained HTML page of ``runs`` (each a stored run and its case records), grouped by suite
    in the order given; with ``claims`` (a checked ``bench claims`` JSON document), the claims section; with
    ``history`` (:func:`reports.history_page.history_context`'s ``history``), the history section."""
    groups: dict[str, list[tuple[int, RunRecord, Sequence[CaseRecord]]]] = {}
    for i, (run, records) in enumerate(runs):
        groups.setdefault(run.suite, []).append((i, run, records))
    contexts = [_group_context(g, members) for g, members in enumerate(groups.values())]
    title = f"bench report · {', '.join([*groups, *(['claims'] if claims else [])]) or 'no runs'}"
    section = claims_section(dict(claims), heading=3) if claims else {"claims": None}
    return template_env().get_template(TEMPLATE).render(
        title=title, groups=contexts, n_runs=len(runs),
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), history=history, **section)


def write_report(path: str | Path, runs: Sequence[Run], claims: Mapping[str, Any] | None = None,
                 history: Mapping[str, Any] | None = None) -> None:
    """Render the report of ``runs`` into ``path`` (its folder is made if missing); BenchInputError for a
    directory or a path that cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise BenchInputError(f"{path} is a directory, not an HTML file to write")
    html = render_report(runs, claims, history)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {path}: {exc.strerror}") from None


def _group_context(g: int, members: list[tuple[int, RunRecord, Sequence[CaseRecord]]]) -> dict[str, Any]:
    """One suite: its runs' contexts and, with several runs, the cases they share side by side."""
    runs = [_run_context(i, run, records) for i, run, records in members]
    described = next((run for _, run, _ in members if run.spec is not None), None)
    axis = runs[0]["axis"]
    many = len(members) > 1
    return {"index": g, "suite": members[0][1].suite, "runs": runs, "many": many,
            "description": described.description if described else "",
            "aligned": side_by_side([(run, records) for _, run, records in members], axis) if many else None,
            "env": env_table([run for _, run, _ in members])}


def _run_context(index: int, run: RunRecord, records: Sequence[CaseRecord]) -> dict[str, Any]:
    f = run_findings(run, records)
    sbs = sbs_view.side_by_side(run, records)
    spec = resolve_plot_spec(run.plot, records, f.axis)
    figures = _figures(records, spec, f) if records else []
    return {
        "index": index, "id": run.id, "suite": run.suite, "quick": run.quick, "status": run.status,
        "started_at": run.started_at, "finished_at": run.finished_at, "n_cases": run.n_cases,
        "stored": len(records), "counts": _counts(f), "axis": f.axis, "symbol": symbol(f.axis),
        "has_spec": run.spec is not None, "suite_text": run.suite_text, "suite_path": run.suite_path,
        "sweep": _sweep(run), "command": _command(run), "commit": run.commit[:12], "devices": _devices(records),
        "side_by_side": _side_by_side(sbs), "headline": headline(f, sbs), "findings": findings_rows(f) if f.axis and spec.numeric else [],
        "fit_names": list(FIT_METRICS.values()), "spec": spec,
        "lead": figures[0] if figures else None, "figures": figures[1:],
        "not_measured": [metric_view(m).name for m in figure_metrics(spec)
                         if m not in {fig["metric"] for fig in figures}
                         and (m not in energy_view.ENERGY_FIGURES or energy_view.asked(run.options))]
                        if records else [],
        "roofline": _roofline(run, records) if records else None,
        "generation": _generation(records, run.peak),
        "energy": _energy(run, records, f.axis),
        "frontier": _frontier(run, records),
        "cases": case_table(records, f.axis, run.peak), "raw": raw_stats(records, f.axis),
        "training": _training(records),
        "ranks": _ranks(records),
    }


def _side_by_side(sbs: sbs_view.SideBySide | None) -> dict[str, Any] | None:
    """Every line against the reference (reports.side_by_side), per sweep point: the terminal's columns, cells and
    notes, each cell flagged ``best`` where it is the best of its column."""
    if sbs is None:
        return None
    points = []
    for t in sbs.points:
        cols = sbs_view.table_columns(t)
        rows = [{"line": r.line, "reference": r.reference, "dominated": bool(r.dominated_by), "status": r.status,
                 "cells": [{"text": r.status if not r.ok and (kind, metric) == cols[0]
                            else (sbs_view.ratio_cell(r, metric) if kind == "ratio" else sbs_view.figure_cell(r, metric)),
                            "best": kind == "figure" and metric in r.best,
                            "verdict": sbs_view.time_verdict(r) if (kind, metric) == ("ratio", "median_ms") else ""}
                           for kind, metric in cols]}
                for r in t.rows]
        points.append({"title": sbs_view.title(t), "headers": [sbs_view.header(t, k, m) for k, m in cols],
                       "rows": rows, "notes": sbs_view.notes(sbs, t)})
    return {"reference": sbs.reference, "points": points, "sources": sbs_view.quoted_sources(sbs),
            "quoted_note": sbs_view.QUOTED_NOTE, "best": sbs_view.BEST_MARK, "dominated": sbs_view.DOMINATED_MARK}


def _training(records: Sequence[CaseRecord]) -> dict[str, Any] | None:
    """The training-step section (reports.training_view): its table and two figures; None without such cases."""
    rows = training_rows(records)
    if not rows:
        return None
    figures = [fig for fig in (size_figure(records), memory_figure(records)) if fig is not None]
    return {"rows": rows, "figures": [Markup(figure_svg(fig)) for fig in figures]}


def _ranks(records: Sequence[CaseRecord]) -> dict[str, Any] | None:
    """The section of cases across ranks (reports.ranks_view): its table and figure; None without such cases."""
    rows = rank_rows(records)
    if not rows:
        return None
    fig = scaling_figure(records)
    return {"rows": rows, "figure": Markup(figure_svg(fig)) if fig is not None else None}


def _figures(records: Sequence[CaseRecord], spec: PlotSpec, f: Findings) -> list[dict[str, Any]]:
    """One figure per metric the run measured, the spec's ``y`` first (always drawn: its marks show failures)."""
    out = []
    for metric in figure_metrics(spec):
        if metric != spec.y and not any(r.metric(metric) is not None for r in records):
            continue
        fits = {lf.line: lf.fits.get(metric) for lf in f.lines} if metric in FIT_METRICS and spec.numeric else None
        fig = metric_figure(records, metric, spec, fits, title=spec.title if metric == spec.y else None)
        out.append({"metric": metric, "name": metric_view(metric).name,
                    "svg": Markup(figure_svg(fig))})       # matplotlib's SVG: its text is XML-escaped
    return out


def _generation(records: Sequence[CaseRecord], peak: dict[str, Any] | None) -> dict[str, Any] | None:
    """The generation section (reports.generation): slopes per line, tokens/s against batch, bounds per case."""
    if not any(gen.is_generation(r) for r in records):
        return None
    figures = []
    for series in gen.batch_series(records):
        spec = PlotSpec(x="batch_size", y="decode_tokens_per_s", x_log=True, y_log=True, numeric=True,
                        title=f"decode tokens/s vs batch · {series.label}")
        fig = metric_figure(gen.batch_records(records, series), "decode_tokens_per_s", spec, None, title=spec.title)
        figures.append(Markup(figure_svg(fig)))
    fmt = lambda v, f="{:,.3g}": "—" if v is None else f.format(v)   # noqa: E731
    return {
        "slopes": [{"line": s.line, "n": s.n, "ttft": fmt(s.ttft_us_per_token), "ttft0": fmt(s.ttft_intercept_ms),
                    "tpot": fmt(s.tpot_us_per_token), "tpot0": fmt(s.tpot_intercept_ms)} for s in gen.line_slopes(records)],
        "batches": [{"label": b.label, "knee": b.knee, "points": ", ".join(f"b={x}: {t:,.0f} tok/s ({p:.3g} ms)"
                                                                           for x, t, p in b.points)}
                    for b in gen.batch_series(records)],
        "figures": figures, "knee_ratio": gen.KNEE_TPOT_RATIO,
        "cases": [{k: (fmt(v) if isinstance(v, float) else v) for k, v in row.items()}
                  | {"bw_share": fmt(row["bw_share"] * 100 if row["bw_share"] is not None else None, "{:.1f} %"),
                     "prefill_peak": fmt(row["prefill_peak"] * 100 if row["prefill_peak"] is not None else None,
                                         "{:.1f} %")}
                  for row in gen.case_rows(records, peak)],
    }


def _roofline(run: RunRecord, records: Sequence[CaseRecord]) -> dict[str, Any]:
    data = roofline_data(records, run.peak)
    fig = roofline_figure(records, run.peak, data, title=f"roofline · {run.suite}")
    return {"figure": Markup(figure_svg(fig)), "n_points": data.n_points, "left_out": data.left_out,
            "power": energy_view.power_summary(records),
            "not_ok": data.not_ok, "meaning": ABOVE_ROOF_MEANING,
            "roofs": [{"device": r.device, "dtype": r.dtype, "gflops": num(r.flops_per_s, 1e9, "{:,.1f}"),
                       "gbps": num(r.bytes_per_s, 1e9, "{:,.1f}"), "ridge": num(r.ridge, 1.0, "{:,.1f}")}
                      for r in data.roofs],
            "above": [{"label": p.label, "achieved": num(p.achieved, 1e9, "{:,.1f}"),
                       "roof": num(p.roof, 1e9, "{:,.1f}"), "ratio": f"{p.achieved / p.roof:.2f}×"}
                      for p in data.above_roof if p.roof]}


def _energy(run: RunRecord, records: Sequence[CaseRecord], axis: str | None) -> dict[str, Any] | None:
    """Energy beside time (reports.energy_view): per-case rows where measured, the reasons where asked and not."""
    rows = energy_view.energy_rows(records, case_labels(records, axis))
    if not rows and not energy_view.asked(run.options):
        return None
    return {"rows": rows, "reasons": energy_view.reasons(records), "power": energy_view.power_summary(records)}


def _frontier(run: RunRecord, records: Sequence[CaseRecord]) -> dict[str, Any] | None:
    """The accuracy-vs-cost section (reports.frontier) of a run whose cases carry a quoted top-1; per workload
    point when the run sweeps one (a frontier compares models at one workload)."""
    with_top1 = frontier.frontier_records(records)
    if len(with_top1) < 2:
        return None
    groups: dict[tuple, list[CaseRecord]] = {}
    for r in with_top1:
        w = r.workload
        groups.setdefault((w.get("batch_size"), w.get("img_size"), w.get("device"), w.get("dtype")), []).append(r)
    out = []
    for recs in groups.values():
        fig = frontier.frontier_figure(recs, title=f"accuracy vs cost · {run.suite} · {frontier.workload_text(recs)}")
        out.append({"where": frontier.workload_text(recs), "figure": Markup(figure_svg(fig)),
                    "dominated": frontier.dominated_rows(recs),
                    "dominated_macs": frontier.dominated_rows(recs, "macs"),
                    "n": len(recs), "sources": frontier.quoted_sources(recs)})
    return {"groups": out}


def _counts(f: Findings) -> list[tuple[str, int]]:
    return sorted(f.statuses.items(), key=lambda kv: (kv[0] != "ok", kv[0]))


def _sweep(run: RunRecord) -> list[tuple[str, str]]:
    """The swept values as run (``run.spec``), e.g. ``("seq_len", "512, 1024, 2048")``."""
    if run.spec is None:
        return []
    return [(k, ", ".join(str(v) for v in values)) for k, values in run.spec.sweep.items()]


def _command(run: RunRecord) -> str:
    argv = run.options.get("argv")
    return "bench " + " ".join(str(a) for a in argv) if isinstance(argv, list) and argv else ""


def _devices(records: Sequence[CaseRecord]) -> str:
    found = dict.fromkeys(f"{r.workload.get('device', 'cpu')} {r.workload.get('dtype', '')}".strip()
                          for r in records)
    return ", ".join(found)
