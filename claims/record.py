"""Verdicts ↔ the JSON claims document that ``bench claims`` writes and both HTML views render from
(:mod:`reports.claims_view` reads it without importing the claims package); :func:`read_verdicts` reads a
document back into verdicts (``bench claims --merge``)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from claims.model import Chart, Claim, Evidence, Figure, Outcome, Rule, Verdict
from harness.contract.errors import BenchInputError

DOCUMENT_KIND = "bench-claims"


def to_record(v: Verdict) -> dict[str, Any]:
    """JSON-ready: the claim, its verdict and reason, each rule's outcome and figure, notes, the chart's data."""
    c = v.claim
    chart = v.evidence.chart or rules_chart(v)
    return {"id": c.id, "title": c.title, "section": c.section, "quote": c.quote, "where": c.where, "added": c.added,
            "own_question": c.own_question or None,
            "verdict": v.verdict, "reason": v.reason, "device": v.device, "mode": v.mode,
            "provenance": v.provenance, "probe_failed": v.evidence.failed or None,
            "rules": [_outcome_record(o) for o in v.outcomes],
            "document_figure": c.document_figure, "published": [vars(p) for p in c.published],
            "units": c.units, "sources": v.evidence.sources, "notes": [n for n in v.evidence.notes if n],
            "figures": {k: f.as_dict() for k, f in v.evidence.figures.items()},
            "chart": dataclasses.asdict(chart) if chart else None}


def _outcome_record(o: Outcome) -> dict[str, Any]:
    """One rule's outcome: ``device`` is the device the rule needs, ``decided_on`` where it was decided, with
    the ``mode`` its figure measured; ``others`` the same rule as another device decided it (after a merge)."""
    return {"says": o.rule.says, "figure": o.rule.figure, "test": o.rule.test, "status": o.status,
            "central": o.rule.central, "context": o.rule.context, "device": o.rule.device or None, "decided_on": o.device or None,
            "mode": o.mode or None, "conflict": o.conflict, "detail": o.detail,
            "measured": o.figure.as_dict() if o.figure else None,
            "power": o.power.as_dict() if o.power else None, "unpowered": o.unpowered or None,
            "others": [_outcome_record(x) for x in o.others]}


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
    doc = {"kind": DOCUMENT_KIND, "context": context, "env": env, "claims": [to_record(v) for v in verdicts]}
    dropped: list[dict[str, str]] = []
    doc = strict_json(doc, "", dropped)
    doc["not_finite"] = dropped
    return doc


def _not_finite(x: Any) -> str:
    """"NaN" / "Infinity" / "-Infinity" for a non-finite float, "" for anything else."""
    if isinstance(x, bool) or not isinstance(x, float) or math.isfinite(x):
        return ""
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def strict_json(obj: Any, path: str, dropped: list[dict[str, str]], why: str = "") -> Any:
    """``obj`` with every non-finite float replaced by ``None`` (strict JSON has no NaN or Infinity), each one
    listed in ``dropped`` with its path, what it was and why (the enclosing figure's note, or "not measured");
    in a dict the reason also stands beside the value as ``<key>_not_finite``. Tuples become lists."""
    if isinstance(obj, dict):
        here = str(obj.get("note") or obj.get("detail") or why)
        out: dict[str, Any] = {}
        for k, v in obj.items():
            was = _not_finite(v)
            if was:
                reason = f"{was}: {here or 'not measured'}"
                out[k] = None
                out[f"{k}_not_finite"] = reason
                dropped.append({"path": f"{path}.{k}".lstrip("."), "was": was, "why": here or "not measured"})
            else:
                out[k] = strict_json(v, f"{path}.{k}", dropped, here)
        return out
    if isinstance(obj, (list, tuple)):
        out_list = []
        for i, v in enumerate(obj):
            was = _not_finite(v)
            if was:
                dropped.append({"path": f"{path}[{i}]", "was": was, "why": why or "not measured"})
                out_list.append(None)
            else:
                out_list.append(strict_json(v, f"{path}[{i}]", dropped, why))
        return out_list
    return obj


# -- reading a document back ------------------------------------------------------------------
FIGURE_FIELDS = ("value", "lo", "hi", "unit", "note", "n", "busy", "mode", "quoted", "provenance", "processes")


def _figure(raw: dict[str, Any] | None) -> Figure | None:
    """A stored figure; a value written as null (it was not finite: strict JSON) reads back as NaN."""
    if raw is None:
        return None
    fields = {k: raw[k] for k in FIGURE_FIELDS if raw.get(k) is not None}
    fields.setdefault("value", float("nan"))
    return Figure(**fields)


def _outcome(raw: dict[str, Any], rule: Rule, device: str) -> Outcome:
    """A stored rule outcome; a document written before rules named their device was decided on its claim's."""
    decided = raw["status"] != "unavailable"
    return Outcome(rule, raw["status"], raw["detail"], _figure(raw.get("measured")),
                   device=raw.get("decided_on") or (device if decided else ""),
                   mode=raw.get("mode") or ("eager" if decided else ""),
                   others=tuple(_outcome(x, rule, device) for x in raw.get("others") or ()),
                   conflict=bool(raw.get("conflict")), power=_figure(raw.get("power")),
                   unpowered=raw.get("unpowered") or "")


def read_verdict(record: dict[str, Any], claim: Claim) -> Verdict:
    """One claim record of a document as a Verdict over ``claim`` (this checkout's catalog entry); a rule the
    catalog does not hold, or a catalog rule the record lacks, means another catalog wrote it: an error."""
    rules = {r.figure: r for r in claim.rules}
    stored = {r["figure"]: r for r in record["rules"]}
    if set(stored) != set(rules):
        odd = sorted(set(stored) ^ set(rules))
        raise BenchInputError(f"{claim.id}'s rules differ from this checkout's catalog ({', '.join(odd)}): "
                              "the document was written by other code; run bench claims again")
    outcomes = [_outcome(stored[r.figure], r, record["device"]) for r in claim.rules]
    chart = record.get("chart")
    ev = Evidence(figures={k: f for k, raw in (record.get("figures") or {}).items() if (f := _figure(raw))},
                  chart=Chart(**chart) if chart else None, notes=list(record.get("notes") or []),
                  sources=list(record.get("sources") or []), failed=record.get("probe_failed") or "")
    return Verdict(claim, record["verdict"], record["reason"], outcomes, ev, device=record["device"],
                   mode=record["mode"], provenance=list(record.get("provenance") or []))


def read_verdicts(doc: dict[str, Any], catalog: list[Claim]) -> list[Verdict]:
    """Every claim of a (checked) claims document as verdicts over this checkout's catalog."""
    by_id = {c.id: c for c in catalog}
    unknown = [r["id"] for r in doc["claims"] if r["id"] not in by_id]
    if unknown:
        raise BenchInputError(f"claim(s) {', '.join(unknown)} are not in this checkout's catalog")
    return [read_verdict(r, by_id[r["id"]]) for r in doc["claims"]]
