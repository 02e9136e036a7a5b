"""Figures declared as data in a claim's catalog entry, for a claim whose figures are all common readings of one
suite run — no probe code: the exponent of a metric over an axis, the ratio of a metric between two cases (at the
largest size both ran, when asked), a metric's spread over cases. :func:`declared_evidence` evaluates them with the
probes' own helpers (:func:`claims.probes.exponent`, the one paired comparison :func:`claims.probes.median_ratio`).

In claims.toml, instead of ``probe``::

    suite = "heads"
    figures = [
      { name = "macs_spread_heads", kind = "spread", metric = "macs", note = "max/min forward MACs over h" },
      { name = "latency_ratio_h8_h1", kind = "ratio", metric = "median_ms", a = { n_heads = 8 }, b = { n_heads = 1 } },
      { name = "latency_exp", kind = "exponent", metric = "median_ms", x = "seq_len", where = { attn_impl = "eager" } },
    ]
    chart = { title = "...", x = "n_heads", metric = "median_ms", y_label = "ms", x_log = true }

A ratio of ``median_ms`` is the paired comparison of the two cases' timed samples (its interval over rounds or
processes, flagged on a busy machine); any other metric's is the plain quotient of the two values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import exponent, median_ratio, one_dtype, ratio_figure, select, series
from harness.contract.errors import BenchInputError
from harness.contract.metrics import TIMINGS, lookup
from harness.contract.records import CaseRecord

KINDS = {"exponent": ("metric", "x"), "ratio": ("metric", "a", "b"), "spread": ("metric",)}
"""Each kind of declared figure and the keys it needs."""
FIGURE_KEYS = {"name", "kind", "metric", "x", "where", "a", "b", "at_largest", "unit", "note"}
CHART_KEYS = {"title", "x", "metric", "y_label", "x_log", "y_log"}
PAIRED = "median_ms"          # the timing whose ratio is the paired comparison of the cases' samples


@dataclass(frozen=True)
class FigureSpec:
    """One figure declared in the catalog: ``kind`` of ``metric`` over the suite's cases matching ``where``
    (exponent over ``x``; spread), or between case ``a`` and case ``b`` (ratio, at the largest ``at_largest`` both
    ran when given)."""

    name: str
    kind: str
    metric: str
    x: str = ""
    where: tuple[tuple[str, Any], ...] = ()
    a: tuple[tuple[str, Any], ...] = ()
    b: tuple[tuple[str, Any], ...] = ()
    at_largest: str = ""
    unit: str = ""
    note: str = ""


@dataclass(frozen=True)
class ChartSpec:
    """A line chart of ``metric`` over ``x``, one series per line of the suite."""

    title: str
    x: str
    metric: str
    y_label: str = ""
    x_log: bool = False
    y_log: bool = False


def _table(raw: Any, key: str, where: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(raw, dict):
        raise BenchInputError(f"{key} must be a table of case values, e.g. {{ n_heads = 8 }}", where=where)
    return tuple(sorted(raw.items()))


def parse_figure(raw: Any, where: str) -> FigureSpec:
    """One ``figures`` entry; a malformed one is a BenchInputError naming it."""
    if not isinstance(raw, dict):
        raise BenchInputError("a declared figure must be a table", where=where)
    where = f"{where} {raw.get('name', '?')}"
    unknown = set(raw) - FIGURE_KEYS
    if unknown:
        raise BenchInputError(f"unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(FIGURE_KEYS))}",
                              where=where)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise BenchInputError(f"kind {kind!r} is not one of {', '.join(KINDS)}", where=where)
    missing = [k for k in ("name", *KINDS[kind]) if raw.get(k) in (None, "")]
    if missing:
        raise BenchInputError(f"a figure of kind {kind} needs {', '.join(missing)}", where=where)
    if lookup(raw["metric"]) is None:
        raise BenchInputError(f"metric {raw['metric']!r} is not in the metric catalog", where=where)
    if kind == "ratio" and raw["metric"] in TIMINGS and raw["metric"] != PAIRED:
        raise BenchInputError(f"a ratio of timings compares the timed samples: metric = {PAIRED!r}", where=where)
    return FigureSpec(raw["name"], kind, raw["metric"], raw.get("x", ""), _table(raw.get("where", {}), "where", where),
                      _table(raw.get("a", {}), "a", where), _table(raw.get("b", {}), "b", where),
                      raw.get("at_largest", ""), raw.get("unit", ""), raw.get("note", ""))


def parse_chart(raw: Any, where: str) -> ChartSpec:
    if not isinstance(raw, dict) or set(raw) - CHART_KEYS or not all(raw.get(k) for k in ("title", "x", "metric")):
        raise BenchInputError(f"chart must be a table with title, x and metric (allowed keys: "
                              f"{', '.join(sorted(CHART_KEYS))})", where=where)
    return ChartSpec(**raw)


def _text(conds: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in conds) or "every case"


def _one(rows: list[CaseRecord], conds: tuple[tuple[str, Any], ...], suite: str) -> CaseRecord | str:
    """The one ok case matching ``conds``, or why there is none."""
    hits = select(rows, **dict(conds))
    if len(hits) == 1:
        return hits[0]
    return (f"the {suite} run has no ok case with {_text(conds)}" if not hits else
            f"{len(hits)} cases of the {suite} run match {_text(conds)}: a ratio reads one case a side")


def figure_of(spec: FigureSpec, rows: list[CaseRecord], suite: str) -> Figure | str:
    """``spec`` evaluated over a suite run's records (one dtype: :func:`claims.probes.one_dtype`): the figure, or
    the reason it cannot be read."""
    if spec.kind == "exponent":
        f = exponent(select(rows, **dict(spec.where)), spec.x, spec.metric, spec.unit)
        return f if f.value == f.value else f"{spec.metric} over {spec.x} ({_text(spec.where)}): {f.note}"
    if spec.kind == "spread":
        values = [v for r in select(rows, **dict(spec.where)) if (v := r.metric(spec.metric)) is not None]
        if len(values) < 2 or min(values) <= 0:
            return f"fewer than two positive values of {spec.metric} ({_text(spec.where)})"
        return Figure(max(values) / min(values), unit=spec.unit or "×",
                      note=spec.note or f"max/min {spec.metric} over {len(values)} cases ({_text(spec.where)})")
    a_rows, b_rows, at = rows, rows, ""
    if spec.at_largest:
        sides = [{r.value(spec.at_largest) for r in select(rows, **dict(c))} for c in (spec.a, spec.b)]
        common = sorted(sides[0] & sides[1])
        if not common:
            return f"no {spec.at_largest} at which both {_text(spec.a)} and {_text(spec.b)} ran ok in the {suite} run"
        a_rows = b_rows = select(rows, **{spec.at_largest: common[-1]})
        at = f" at {spec.at_largest} = {common[-1]}"
    a, b = _one(a_rows, spec.a, suite), _one(b_rows, spec.b, suite)
    if isinstance(a, str) or isinstance(b, str):
        return a if isinstance(a, str) else str(b)
    note = (spec.note or f"{spec.metric}, {_text(spec.a)} / {_text(spec.b)}") + at
    if spec.metric == PAIRED:
        return median_ratio(a, b, note)
    return ratio_figure(a.metric(spec.metric), b.metric(spec.metric), spec.unit or "×", note)


def declared_evidence(ctx: Context, suite: str, specs: tuple[FigureSpec, ...], chart: ChartSpec | None = None
                      ) -> Evidence:
    """The figures a catalog entry declares, read from one run of ``suite``; each it cannot read is unavailable
    with the reason."""
    run, records = ctx.suite(suite)
    rows = one_dtype(records)
    ev = Evidence(sources=[run.id])
    for spec in specs:
        got = figure_of(spec, rows, suite)
        if isinstance(got, Figure):
            ev.figures[spec.name] = got
        else:
            ev.unavailable[spec.name] = got
    if chart is not None:
        ev.chart = Chart(chart.title, chart.x, chart.y_label or chart.metric, series(rows, chart.x, chart.metric),
                         x_log=chart.x_log, y_log=chart.y_log)
    return ev
