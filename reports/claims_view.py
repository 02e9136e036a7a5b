"""Views of claim verdicts: a rich table for the terminal, a chart per claim, the HTML claims report,
and a JSON record of every verdict with its figures."""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from markupsafe import Markup
from rich.table import Table

from harness.claims.model import Chart, Verdict

STYLE = {"supported": "green", "partly supported": "yellow", "contradicted": "red", "inconclusive": "dim"}

_MARK = {"pass": "✓", "fail": "✗"}


def verdict_table(verdicts: list[Verdict]) -> Table:
    t = Table(title="claims: verdicts (figures with 95% intervals)", header_style="bold", show_lines=False)
    for col in ("id", "claim", "verdict", "deciding figures"):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        figs = "; ".join(f"{o.rule.figure} {o.figure.text()} {_MARK.get(o.status, '?')}"
                         for o in v.outcomes if o.figure is not None and o.status != "unavailable")
        missing = [o.detail for o in v.outcomes if o.status == "unavailable"]
        if missing:
            figs += ("; " if figs else "") + "not tested: " + "; ".join(missing)
        t.add_row(v.claim.id, v.claim.title, f"[{STYLE[v.verdict]}]{v.verdict}[/]", figs)
    return t


def to_record(v: Verdict) -> dict[str, Any]:
    """JSON-ready: the claim, its verdict and reason, each rule's outcome and figure, notes, the chart's data."""
    c = v.claim
    return {"id": c.id, "title": c.title, "section": c.section, "quote": c.quote, "where": c.where, "added": c.added,
            "verdict": v.verdict, "reason": v.reason,
            "rules": [{"says": o.rule.says, "figure": o.rule.figure, "test": o.rule.test, "status": o.status,
                       "detail": o.detail, "measured": o.figure.as_dict() if o.figure else None}
                      for o in v.outcomes],
            "document_figure": c.document_figure, "published": [vars(p) for p in c.published],
            "units": c.units, "sources": v.evidence.sources, "notes": [n for n in v.evidence.notes if n],
            "figures": {k: f.as_dict() for k, f in v.evidence.figures.items()},
            "chart": dataclasses.asdict(chart) if (chart := v.evidence.chart or rules_chart(v)) else None}


def _reference(rule: Any) -> float | None:
    """The number a rule holds its figure to: the claimed value, the one bound, or the band's middle."""
    ref = {"equals": rule.value, "at_least": rule.lo, "at_most": rule.hi,
           "within": (rule.lo + rule.hi) / 2 if rule.lo is not None and rule.hi is not None else None}.get(rule.test)
    return ref if ref else None


def rules_chart(v: Verdict) -> Chart | None:
    """For a claim whose probe draws no plot: each rule's measured figure ÷ the number the claim gives
    (1 = exactly the claim's figure or bound), with its interval; is_true rules and zero targets left out."""
    series: dict[str, list[tuple[Any, float, float | None, float | None]]] = {}
    for o in v.outcomes:
        ref = _reference(o.rule)
        if o.figure is None or ref is None or o.status == "unavailable" or o.rule.test == "is_true":
            continue
        f = o.figure
        label = o.rule.says if len(o.rule.says) <= 48 else o.rule.says[:47] + "…"
        lo, hi = (f.lo / ref, f.hi / ref) if f.has_interval else (None, None)
        series[label] = [(label, f.value / ref, lo, hi)]
    if not series:
        return None
    return Chart("measured ÷ the claim's figure (or bound)", "", "ratio", series, kind="bar",
                 hlines={"the claim's figure": 1.0})


RECORD_KEYS = {"id", "title", "section", "quote", "where", "added", "verdict", "reason", "rules", "document_figure",
               "published", "units", "sources", "notes", "figures", "chart"}
"""What ``to_record`` writes: the claims section needs every one of them."""


def claims_document(verdicts: list[Verdict], env: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """What ``bench claims`` writes as JSON and what both HTML views render from."""
    return {"kind": "bench-claims", "context": context, "env": env, "claims": [to_record(v) for v in verdicts]}


def check_document(doc: Any) -> None:
    """ValueError unless ``doc`` is a claims document of this version (what :func:`claims_document` writes)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list) or not {"context", "env"} <= set(doc):
        raise ValueError("is not a claims record written by `bench claims`")
    for r in doc["claims"]:
        r = r if isinstance(r, dict) else {}
        missing = RECORD_KEYS - set(r)
        if missing:
            raise ValueError(f"is not a claims record of this version ({r.get('id', '?')} lacks "
                             f"{', '.join(sorted(missing))}); run bench claims again")


def claims_section(doc: dict[str, Any], heading: int) -> dict[str, Any]:
    """Template variables of the claims section (_claims.html.j2) from a checked claims document."""
    records = [dict(r, svg=Markup(chart_svg(Chart(**r["chart"]) if r["chart"] else None))) for r in doc["claims"]]
    sections: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        sections.setdefault(r["section"], []).append(r)
    counts = {k: sum(r["verdict"] == k for r in records) for k in STYLE}
    return {"claims": records, "sections": sections, "counts": counts, "context": doc["context"], "env": doc["env"],
            "h": heading}


def chart_svg(chart: Chart | None) -> str:
    """The claim's chart as inline SVG (empty string when there is none)."""
    if chart is None or not any(chart.series.values()):
        return ""
    from matplotlib.figure import Figure       # not pyplot: no global figure registry to leak into
    from reports.plots import _tex_safe, figure_svg
    fig = Figure(figsize=(6.4, 3.4), dpi=100)
    ax = fig.subplots()
    if chart.kind == "bar":
        labels, heights, errs = [], [], []
        for name, pts in chart.series.items():
            for x, y, lo, hi in pts:
                labels.append(_tex_safe(str(name)))
                heights.append(y)
                errs.append((y - lo, hi - y) if lo is not None and hi is not None else (0.0, 0.0))
        ax.bar(range(len(heights)), heights, yerr=list(zip(*errs)) if errs else None, color="#4c72b0", capsize=3)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    else:
        for name, pts in chart.series.items():
            pts = [p for p in pts if p[1] is not None and not (isinstance(p[1], float) and math.isnan(p[1]))]
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            line, = ax.plot(xs, ys, marker="o", ms=4, label=_tex_safe(str(name)))
            if any(p[2] is not None for p in pts):
                ax.fill_between(xs, [p[2] if p[2] is not None else p[1] for p in pts],
                                [p[3] if p[3] is not None else p[1] for p in pts], color=line.get_color(), alpha=.15)
        ax.legend(fontsize=7, loc="best")
        if chart.x_log:
            ax.set_xscale("log")
    for label, y in chart.hlines.items():
        ax.axhline(y, color="#c0392b", ls="--", lw=1)
        ax.text(0.01, y, _tex_safe(label), transform=ax.get_yaxis_transform(), fontsize=7, color="#c0392b",
                va="bottom")
    if chart.y_log:
        ax.set_yscale("log")
    ax.set_title(_tex_safe(chart.title), fontsize=10)
    ax.set_xlabel(_tex_safe(chart.x_label), fontsize=9)
    ax.set_ylabel(_tex_safe(chart.y_label), fontsize=9)
    ax.grid(True, alpha=.3)
    fig.tight_layout()
    return figure_svg(fig)


def render_claims(doc: dict[str, Any]) -> str:
    """The self-contained HTML claims page (Jinja2, autoescaped; only matplotlib's SVG is inserted raw)."""
    from reports.html import _env
    return _env().get_template("claims.html.j2").render(
        title="bench claims: the documents' trade-offs, measured", **claims_section(doc, heading=2),
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
