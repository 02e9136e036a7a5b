"""Join the verdicts of two devices: a CPU run's and a CUDA run's (``bench claims --device cuda --merge
cpu.json``). Each rule keeps the outcome of the device it belongs to, names that device, and carries the
other device's outcome beside it; a claim is then decided again over all its rules, from both devices.

Per rule: the outcomes that decided it (pass / fail / unsure) count, "unavailable" ones do not, so a rule a
CPU run could not decide reads what the GPU decided. When both devices decided it, the rule's own device
(``Rule.device``; the first verdict's device for a rule of any device) gives the outcome; when they disagree
(one pass, one fail) the rule reads ``unsure`` with both outcomes in its detail and ``conflict`` set:
shown, never resolved by picking one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from claims.model import Evidence, Outcome, Verdict
from claims.rules import central, combine, decided_modes


def base_device(device: str) -> str:
    """``cuda:1`` → ``cuda``: the kind of device a rule names."""
    return device.split(":")[0].strip()


def devices_of(v: Verdict) -> list[str]:
    """The devices a verdict was decided on (a merged one names several: ``cpu + cuda``)."""
    return [base_device(d) for d in v.device.split("+") if d.strip()]


def merge_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    """One rule's outcome from its outcomes on several devices (the first is the home of a rule of any device)."""
    rule = outcomes[0].rule
    decided = [o for o in outcomes if o.status != "unavailable"]
    if not decided:
        details = list(dict.fromkeys(o.detail for o in outcomes))
        return replace(outcomes[0], detail="; ".join(details))
    home = next((o for o in decided if rule.device and base_device(o.device) == rule.device), decided[0])
    rest = tuple(o for o in decided if o is not home)
    statuses = {o.status for o in decided}
    if {"pass", "fail"} <= statuses:
        detail = "devices disagree: " + "; ".join(f"on {o.device}: {o.detail} ({o.status})" for o in (home, *rest))
        return replace(home, status="unsure", detail=detail, others=rest, conflict=True)
    return replace(home, others=rest)


def _evidence(parts: Sequence[tuple[str, Evidence]], home: str) -> Evidence:
    """The evidence of several devices in one: the first's figures as they are, the others' renamed
    ``name@device``; notes prefixed by their device; the chart of ``home`` (the device that decided the
    central rule)."""
    out = Evidence()
    for i, (device, ev) in enumerate(parts):
        tag = "" if i == 0 else f"@{device}"
        out.figures.update({f"{k}{tag}": f for k, f in ev.figures.items()})
        out.unavailable.update({f"{k}{tag}": why for k, why in ev.unavailable.items()})
        out.notes.extend(f"{device}: {n}" for n in ev.notes if n)
        out.sources.extend(s for s in ev.sources if s not in out.sources)
        if ev.failed:
            out.failed = "; ".join(filter(None, (out.failed, f"{device}: {ev.failed}")))
    charts = [ev.chart for device, ev in parts if ev.chart and device == home] + [ev.chart for _, ev in parts if ev.chart]
    out.chart = charts[0] if charts else None
    return out


def merge_verdicts(first: Verdict, second: Verdict) -> Verdict:
    """One claim's verdict over the rules of both (the same claim, decided on different devices). A rule of
    any device is homed on the CPU verdict when one of them is (the catalog's bounds were set on it)."""
    if first.claim.id != second.claim.id:
        raise ValueError(f"cannot merge verdicts of {first.claim.id} and {second.claim.id}")
    if "cpu" in devices_of(second) and "cpu" not in devices_of(first):
        first, second = second, first
    by_rule = {o.rule.figure: o for o in second.outcomes}
    outcomes = []
    for o in first.outcomes:
        other = by_rule.get(o.rule.figure)
        outcomes.append(merge_outcome([o, other] if other is not None else [o]))
    known = {o.rule.figure for o in first.outcomes}
    outcomes += [o for o in second.outcomes if o.rule.figure not in known]
    verdict, reason = combine(outcomes)
    devices = list(dict.fromkeys([*devices_of(first), *devices_of(second)]))
    head = central(outcomes)
    home = base_device(head.device) if head.device else " + ".join(devices_of(first))
    parts = [(" + ".join(devices_of(v)), v.evidence) for v in (first, second)]
    return Verdict(first.claim, verdict, reason, outcomes, _evidence(parts, home), device=" + ".join(devices),
                   mode=decided_modes(outcomes), provenance=[*first.provenance, *second.provenance])


def merge_runs(first: Sequence[Verdict], second: Sequence[Verdict]) -> list[Verdict]:
    """Every claim of either run, in id order; a claim both decided is merged (:func:`merge_verdicts`)."""
    theirs = {v.claim.id: v for v in second}
    mine = {v.claim.id for v in first}
    out = [merge_verdicts(v, theirs[v.claim.id]) if v.claim.id in theirs else v for v in first]
    out += [v for v in second if v.claim.id not in mine]
    return sorted(out, key=lambda v: v.claim.id)
