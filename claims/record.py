"""Verdicts → the JSON claims document that ``bench claims`` writes and both HTML views render from
(:mod:`reports.claims_view` reads it without importing the claims package)."""
from __future__ import annotations

import dataclasses
from typing import Any

from claims.model import Chart, Rule, Verdict

DOCUMENT_KIND = "bench-claims"


def to_record(v: Verdict) -> dict[str, Any]:
    """JSON-ready: the claim, its verdict and reason, each rule's outcome and figure, notes, the chart's data."""
    c = v.claim
    chart = v.evidence.chart or rules_chart(v)
    return {"id": c.id, "title": c.title, "section": c.section, "quote": c.quote, "where": c.where, "added": c.added,
            "verdict": v.verdict, "reason": v.reason, "device": v.device, "mode": v.mode,
            "provenance": v.provenance, "probe_failed": v.evidence.failed or None,
            "rules": [{"says": o.rule.says, "figure": o.rule.figure, "test": o.rule.test, "status": o.status,
                       "central": o.rule.central, "device": o.rule.device or None,
                       "detail": o.detail, "measured": o.figure.as_dict() if o.figure else None}
                      for o in v.outcomes],
            "document_figure": c.document_figure, "published": [vars(p) for p in c.published],
            "units": c.units, "sources": v.evidence.sources, "notes": [n for n in v.evidence.notes if n],
            "figures": {k: f.as_dict() for k, f in v.evidence.figures.items()},
            "chart": dataclasses.asdict(chart) if chart else None}


def _reference(rule: Rule) -> float | None:
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


def claims_document(verdicts: list[Verdict], env: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """What ``bench claims`` writes as JSON and what both HTML views render from."""
    return {"kind": DOCUMENT_KIND, "context": context, "env": env, "claims": [to_record(v) for v in verdicts]}
