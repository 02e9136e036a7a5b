"""Every line of a run against its reference line, side by side at each sweep point the lines share (torch-free).

This is the answer to a suite whose lines are different models (or variants of one): per point, one row per line
with its median time and that time's ratio to the reference's (with its 95 % interval, from
:mod:`reports.findings`' comparison of the two cases' samples), throughput, peak memory, MACs and parameters with
their ratios to the reference, % of the measured peak, energy where measured and the quoted top-1 with its source
where the case carries one (:mod:`harness.contract.quoted`). Rows are sorted by time; the best figure of each column
is marked; lines Pareto-dominated (:mod:`reports.pareto`) in time and peak memory — or, where every line has a
quoted top-1, in time and top-1 — are named with the line that dominates them.

The reference is the suite's ``reference`` line (stored with the run in ``run.spec``), else the first line.
``bench run``, ``bench show``, the HTML report, the exports and ``bench compare`` all read :func:`side_by_side`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.contract.quoted import sources
from harness.contract.records import CaseRecord, RunRecord
from reports.findings import Ratio, _ratio, _time_ratio, interval_note
from reports.frames import rates, sweep_axis
from reports.pareto import Point, pareto

TOP1 = "quoted_top1"

BEST: dict[str, bool] = {"median_ms": False, "throughput_per_s": True, "peak_bytes": False, "macs": False,
                         "params": False, "peak_pct": True, "energy_j": False, TOP1: True}
"""The columns whose best figure is marked → whether higher is better."""

RATIO_METRICS = ("median_ms", "peak_bytes", "macs", "params")
"""The figures given as a ratio to the reference's (line ÷ reference), time with its interval."""


@dataclass(frozen=True)
class Row:
    """One line at one point: its figures (None where not measured), its ratios to the reference (line ÷
    reference; None where either figure is missing), the columns where it is best, and the line dominating it."""

    line: str
    arch: str
    status: str
    case_key: str
    figures: dict[str, float | None]
    ratios: dict[str, Ratio | None]
    top1_source: str = ""
    reference: bool = False
    best: frozenset[str] = frozenset()
    dominated_by: str = ""
    dominated_clearly: bool = True       # its time against the dominating line's is decided: slower, or the same
    message: str = ""
    ranks_share_cpu: bool = False        # ranks of one case on the CPU: its times are not speed

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class PointTable:
    """The lines at one sweep point (``point``: the swept keys and their values), sorted by time, failed last."""

    point: tuple[tuple[str, Any], ...]
    reference: str
    rows: tuple[Row, ...]
    dominance: str                       # what the Pareto domination is over: "time and peak memory" / ...
    reference_ok: bool = True

    def where(self) -> str:
        """``batch_size=8`` (``""`` for a run that sweeps nothing)."""
        return ", ".join(f"{k}={v}" for k, v in self.point)

    def row(self, line: str) -> Row | None:
        return next((r for r in self.rows if r.line == line), None)

    def columns(self) -> list[str]:
        """The figure columns some row has: time, throughput, memory, MACs, params always; % peak, energy and
        quoted top-1 only where some line has them."""
        always = ["median_ms", "throughput_per_s", "peak_bytes", "macs", "params"]
        optional = [m for m in ("peak_pct", "energy_j", TOP1) if any(r.figures.get(m) is not None for r in self.rows)]
        return always + optional


@dataclass(frozen=True)
class SideBySide:
    """A run's side-by-side tables: the reference, why it is the reference, one table per shared sweep point,
    and what the time intervals cover."""

    reference: str
    why: str
    points: tuple[PointTable, ...]
    intervals: str = ""
    keys: tuple[str, ...] = field(default_factory=tuple)

    def table(self, **point: Any) -> PointTable | None:
        """The table at ``point`` (``sbs.table(batch_size=8)``)."""
        want = {k: repr(v) for k, v in point.items()}
        return next((t for t in self.points if {k: repr(v) for k, v in t.point if k in want} == want), None)


def same_lines(records_a: Sequence[CaseRecord], records_b: Sequence[CaseRecord]) -> bool:
    """Whether two runs hold the same lines (``bench compare`` then shows each run's side-by-side tables)."""
    lines_a, lines_b = {r.line for r in records_a}, {r.line for r in records_b}
    return bool(lines_a) and lines_a == lines_b


def reference_line(run: RunRecord | None, records: Sequence[CaseRecord]) -> tuple[str, str]:
    """The reference line and why: the suite's ``reference`` (stored in ``run.spec``) where the run has that
    line, else the first line of the run."""
    lines = list(dict.fromkeys(r.line for r in records))
    named = run.spec.reference if run is not None and run.spec is not None else ""
    if named and named in lines:
        return named, "the suite's reference"
    if not lines:
        return "", ""
    return lines[0], "the first line: the suite names no reference" if not named else (
        f"the first line: the suite's reference {named!r} is not in this run")


def compares_models(records: Sequence[CaseRecord], keys: Sequence[str] | None = None) -> bool:
    """Whether the run's lines differ in the model or a model's variant: two lines whose architecture or
    configuration (the fields not mirrored from the workload) differ at a sweep point (``keys``) both have."""
    keys = _keys(records) if keys is None else keys
    seen: dict[tuple, set[tuple]] = {}
    for r in records:
        model = (r.arch, tuple(sorted((k, repr(v)) for k, v in r.config.items() if k not in r.workload)))
        seen.setdefault(_point_key(r, keys), set()).add((r.line, model))
    return any(len({model for _, model in members}) > 1 for members in seen.values())


def _keys(records: Sequence[CaseRecord], run: RunRecord | None = None) -> tuple[str, ...]:
    """The swept keys: the suite's sweep as run, else the run's sweep axis."""
    if run is not None and run.spec is not None and run.spec.sweep:
        return tuple(run.spec.sweep)
    axis = sweep_axis(records, run.plot.get("x") if run is not None else None)
    return (axis,) if axis else ()


def _point_key(r: CaseRecord, keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(repr(r.value(k)) for k in keys)


def side_by_side(run: RunRecord | None, records: Sequence[CaseRecord],
                 peak: dict[str, Any] | None = None) -> SideBySide | None:
    """Every line against the reference at each sweep point two or more lines share; None when the lines do
    not differ in the model or its variant (a run of one model along an axis: its exponents answer it)."""
    keys = _keys(records, run)
    if len({r.line for r in records}) < 2 or not compares_models(records, keys):
        return None
    reference, why = reference_line(run, records)
    peak = peak if peak is not None else (run.peak if run is not None else None)
    groups: dict[tuple[str, ...], list[CaseRecord]] = {}
    for r in records:
        members = groups.setdefault(_point_key(r, keys), [])
        if all(m.line != r.line for m in members):          # one case per line and point
            members.append(r)
    tables = [_table(tuple((k, recs[0].value(k)) for k in keys), recs, reference, peak)
              for recs in groups.values() if len(recs) >= 2]
    return SideBySide(reference, why, tuple(tables), interval_note(records), keys) if tables else None


def _figures(r: CaseRecord, peak: dict[str, Any] | None) -> dict[str, float | None]:
    share = rates(r, peak).get("peak_share") if peak and r.ok else None
    figs = {m: r.metric(m) if r.ok else None for m in ("median_ms", "throughput_per_s", "peak_bytes", "macs",
                                                         "params", "energy_j", TOP1)}
    figs["peak_pct"] = None if share is None else 100.0 * share
    return figs


def _ratios(r: CaseRecord, ref: CaseRecord | None) -> dict[str, Ratio | None]:
    """``r``'s figures ÷ the reference's: time by the comparison of the two cases' samples (with its interval),
    the others as plain quotients; the reference against itself is exactly 1."""
    if ref is None or not r.ok or not ref.ok:
        return {m: None for m in RATIO_METRICS}
    if r is ref:
        return {m: Ratio(1.0) if r.metric(m) else None for m in RATIO_METRICS}
    return {"median_ms": _time_ratio(r, ref),
            **{m: _ratio(r.metric(m), ref.metric(m)) for m in RATIO_METRICS if m != "median_ms"}}


def _table(point: tuple[tuple[str, Any], ...], recs: list[CaseRecord], reference: str,
           peak: dict[str, Any] | None) -> PointTable:
    ref = next((r for r in recs if r.line == reference and r.ok), None)
    rows = [Row(r.line, r.arch, r.status, r.case_key, _figures(r, peak), _ratios(r, ref),
                sources(r.message).get(TOP1, "") if r.metric(TOP1) is not None else "", r.line == reference,
                message=r.message.strip().splitlines()[0] if not r.ok and r.message.strip() else "",
                ranks_share_cpu=r.value("parallel") not in (None, "none") and r.value("device") == "cpu")
            for r in recs]
    ok = [row for row in rows if row.ok and row.figures["median_ms"] is not None]
    best = {m: _best(ok, m, higher) for m, higher in BEST.items()}
    with_top1 = len(ok) >= 2 and all(row.figures[TOP1] is not None for row in ok)
    dominance = "time and quoted top-1" if with_top1 else "time and peak memory"
    dominated = _dominated(ok, with_top1)
    by_line = {r.line: r for r in recs}
    out = []
    for row in rows:
        dom = dominated.get(row.line, "")
        clear = True
        if dom:        # the dominated line's time over the dominating one's: slower, or the same within the floor
            t = _time_ratio(by_line[row.line], by_line[dom])
            c = t.comparison if t is not None else None
            clear = c.verdict in ("regressed", "unchanged") if c is not None else True
        out.append(dataclasses.replace(row, best=frozenset(m for m, lines in best.items() if row.line in lines),
                                       dominated_by=dom, dominated_clearly=clear))
    out.sort(key=lambda row: (not row.ok or row.figures["median_ms"] is None, row.figures["median_ms"] or 0.0))
    return PointTable(point, reference, tuple(out), dominance, reference_ok=ref is not None)


def _best(rows: list[Row], metric: str, higher: bool) -> set[str]:
    """The lines with the best figure of ``metric`` (ties all marked); none when fewer than two lines have it. A
    % of peak above 100 (a stale calibration or a count above the work done) is never the best."""
    have = [(r.figures[metric], r.line) for r in rows if r.figures.get(metric) is not None
            and not (metric == "peak_pct" and round(r.figures[metric], 1) > 100.0)]   # above the peak: suspect
    if len(have) < 2:
        return set()
    top = max(v for v, _ in have) if higher else min(v for v, _ in have)
    return {line for v, line in have if v == top}


def _dominated(rows: list[Row], with_top1: bool) -> dict[str, str]:
    """Line → the line dominating it: at least as fast and as accurate (quoted top-1) or as light in peak memory,
    strictly better in one (:func:`reports.pareto.pareto`: the higher-is-better figure is the point's accuracy)."""
    if with_top1:
        points = [Point(r.line, r.figures[TOP1], r.figures["median_ms"]) for r in rows]
    else:
        points = [Point(r.line, -r.figures["peak_bytes"], r.figures["median_ms"]) for r in rows
                  if r.figures["peak_bytes"] is not None]
    return {name: p.name for name, p in pareto(points).dominated.items()}


# -- cells: the one text of each figure, for the terminal, the report and bench compare ----------------------------
MiB = 1024 * 1024
OVER_PEAK = "⚠"
"""Marks a ``% peak`` above 100: a stale calibration or a count above the work done, shown, never clipped."""
BEST_MARK = "★"
DOMINATED_MARK = "†"

COLUMNS: dict[str, tuple[str, float, str]] = {
    "median_ms": ("median ms", 1.0, "{:,.2f}"),
    "throughput_per_s": ("items/s", 1.0, "{:,.1f}"),
    "peak_bytes": ("peak MiB", MiB, "{:,.0f}"),
    "macs": ("GMACs", 1e9, "{:,.2f}"),
    "params": ("params M", 1e6, "{:,.1f}"),
    "peak_pct": ("% peak", 1.0, "{:.1f}"),
    "energy_j": ("J/call", 1.0, "{:.4g}"),
    TOP1: ("top-1 % (quoted)", 1.0, "{:.2f}"),
}
"""Figure column → its header (the cases table's), the divisor of its unit and its format."""

RATIO_HEADERS = {"median_ms": "time", "peak_bytes": "mem", "macs": "MACs", "params": "params"}


def figure_cell(row: Row, metric: str) -> str:
    """A figure as shown: ``2,169.00``; ``116.0 ⚠`` for a % of peak above 100; ``–`` where not measured."""
    v = row.figures.get(metric)
    if v is None:
        return "–"
    header, scale, fmt = COLUMNS[metric]
    text = fmt.format(v / scale)
    return f"{text} {OVER_PEAK}" if metric == "peak_pct" and round(v, 1) > 100.0 else text


def ratio_cell(row: Row, metric: str) -> str:
    """``0.632× [0.426, 1.36]`` (time, with its 95 % interval), ``1.8×``; ``1 (reference)`` on the reference's
    row; ``–`` where either figure is missing."""
    r = row.ratios.get(metric)
    if r is None:
        return "–"
    if row.reference:
        return "1 (reference)" if metric == "median_ms" else "1"
    text = f"{r.value:.3g}×"
    if r.lo is not None and r.hi is not None:
        text += f" [{r.lo:.2g}, {r.hi:.2g}]"
    return text


def ratio_header(metric: str) -> str:
    """``time ÷ ref [95% CI]``, ``memory ÷ ref`` (the table's title names the reference)."""
    return f"{RATIO_HEADERS[metric]} ÷ ref" + (" [95% CI]" if metric == "median_ms" else "")


def table_columns(t: PointTable) -> list[tuple[str, str]]:
    """The table's columns in order, each ``("figure", metric)`` or ``("ratio", metric)``: time and its ratio,
    throughput, memory, MACs and params each with its ratio, then % peak, energy and top-1 where some line has them."""
    shown = t.columns()
    cols: list[tuple[str, str]] = []
    for m in shown:
        cols.append(("figure", m))
        if m in RATIO_METRICS:
            cols.append(("ratio", m))
    return cols


def header(t: PointTable, kind: str, metric: str) -> str:
    return ratio_header(metric) if kind == "ratio" else COLUMNS[metric][0]


def title(t: PointTable) -> str:
    """``side by side at batch_size=8: every line ÷ ref = resnet50, sorted by time, ★ best of its column``."""
    where = f" at {t.where()}" if t.point else ""
    return f"side by side{where}: every line ÷ ref = {t.reference}, sorted by time, {BEST_MARK} best of its column"


def notes(sbs: SideBySide, t: PointTable) -> list[str]:
    """What the table's figures mean: the reference and why, what the time interval covers, the dominated lines
    and the lines that are not ok."""
    out = [f"reference: {t.reference} ({sbs.why})"
           + ("" if t.reference_ok else f"; it has no ok case at {t.where()}: no ratios here")]
    levels = time_levels(t)
    if levels:
        out.append(f"time ÷ {t.reference}: the comparison of each line's timing with the reference's "
                   f"(harness.analysis.comparison), its 95% interval over {levels}"
                   + (f"; {sbs.intervals}" if sbs.intervals else ""))
    dominated = [r for r in t.rows if r.dominated_by]
    if dominated:
        out.append(f"{DOMINATED_MARK} Pareto-dominated in {t.dominance} (another line at least as good in both, "
                   "better in one): "
                   + "; ".join(f"{r.line} by {r.dominated_by}"
                               + ("" if r.dominated_clearly else " (time undecided: within the noise)")
                               for r in dominated))
    else:
        out.append(f"no line is Pareto-dominated in {t.dominance}")
    shared = [r.line for r in t.rows if r.ok and r.ranks_share_cpu]
    if shared:
        out.append(f"{', '.join(shared)}: the ranks share this machine's CPU cores; their times are for correctness, "
                   "memory and communication bytes, not speed")
    failed = [r for r in t.rows if not r.ok]
    if failed:
        out.append("not ok: " + "; ".join(f"{r.line} {r.status}" + (f" ({r.message[:80]})" if r.message else "")
                                         for r in failed))
    return out


def time_levels(t: PointTable) -> str:
    """What the time intervals of a table are over, from their comparisons: ``3+3 rounds``, ``rounds (3–5 a
    side)``, or per level how many lines (``processes for 5 lines, one process for 1``)."""
    comps = [r.ratios["median_ms"].comparison for r in t.rows
             if not r.reference and r.ratios.get("median_ms") is not None and r.ratios["median_ms"].comparison]
    if not comps:
        return ""
    texts = {c.units_text for c in comps}
    levels: dict[str, int] = {}
    for c in comps:
        levels[c.level] = levels.get(c.level, 0) + 1
    if len(texts) == 1:
        return texts.pop()
    if len(levels) == 1:
        ns = sorted({n for c in comps for n in (c.n_a, c.n_b)})
        unit = "samples" if comps[0].level == "one process" else "a side"
        return f"{comps[0].level} ({ns[0]}–{ns[-1]} {unit})"
    return ", ".join(f"{level} for {n} line{'s' if n != 1 else ''}" for level, n in levels.items())


def time_verdict(row: Row) -> str:
    """The time comparison's verdict from the line's side: ``faster`` / ``slower`` than the reference beyond the
    floor and significant, ``same`` (the whole interval within the floor), ``undecided``; ``""`` without one."""
    r = row.ratios.get("median_ms")
    c = r.comparison if r is not None and not row.reference else None
    if c is None:
        return ""
    return {"improved": "faster", "regressed": "slower", "unchanged": "same"}.get(c.verdict, "undecided")


def quoted_sources(sbs: SideBySide) -> list[str]:
    """Per line with a quoted top-1 (once per run): ``line: SOURCE``; ``[]`` when no line has one."""
    found: dict[str, str] = {}
    for t in sbs.points:
        for r in t.rows:
            if r.figures.get(TOP1) is not None:
                found.setdefault(r.line, r.top1_source or "source not recorded")
    return [f"{line}: {src}" for line, src in found.items()]


QUOTED_NOTE = "top-1: quoted (published with the weights), not measured here; sources:"


def vs_reference(sbs: SideBySide | None) -> dict[str, dict[str, Any]]:
    """Per case key, its ratios to the reference at its point, as an export writes them: ``line`` (the
    reference), and per metric of :data:`RATIO_METRICS` ``{"ratio": r}`` (time: with ``ci_low``, ``ci_high``, the
    comparison's ``level`` and what it is ``over``, and the line's ``verdict``: faster, slower, same or undecided);
    None where a figure is missing."""
    out: dict[str, dict[str, Any]] = {}
    for t in sbs.points if sbs else ():
        for row in t.rows:
            entry: dict[str, Any] = {"line": t.reference}
            for m in RATIO_METRICS:
                r = row.ratios.get(m)
                c = r.comparison if r is not None and not row.reference else None
                entry[m] = None if r is None else (
                    {"ratio": r.value, "ci_low": r.lo, "ci_high": r.hi,
                     "level": c.level if c else ("reference" if row.reference else ""),
                     "over": c.units_text if c else "", "verdict": time_verdict(row)}
                    if m == "median_ms" else {"ratio": r.value})
            out[row.case_key] = entry
    return out


def flat_vs_reference(entry: dict[str, Any]) -> dict[str, Any]:
    """:func:`vs_reference`'s entry as flat columns: ``vs_ref.line``, ``vs_ref.median_ms``,
    ``vs_ref.median_ms_ci_low``, ``vs_ref.median_ms_ci_high``, ``vs_ref.median_ms_level``, ``vs_ref.median_ms_over``,
    ``vs_ref.median_ms_verdict``, ``vs_ref.peak_bytes``, ``vs_ref.macs``, ``vs_ref.params``."""
    flat: dict[str, Any] = {"vs_ref.line": entry["line"]}
    for m in RATIO_METRICS:
        v = entry.get(m) or {}
        flat[f"vs_ref.{m}"] = v.get("ratio")
        if m == "median_ms":
            flat.update({f"vs_ref.{m}_{k}": v.get(k) for k in ("ci_low", "ci_high", "level", "over", "verdict")})
    return flat
