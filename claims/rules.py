"""Decision rules: a figure with its interval against the claim's bounds → pass / fail / unsure; the rules'
outcomes → one verdict. An interval that straddles a bound is ``unsure``: never a pass."""
from __future__ import annotations

import math

from claims.model import Evidence, Figure, Outcome, Rule

TESTS = ("within", "at_least", "at_most", "equals", "is_true")


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:,.4g}"


def check(rule: Rule, fig: Figure) -> Outcome:
    """Apply one rule to one figure."""
    if fig.value is None or (isinstance(fig.value, float) and math.isnan(fig.value)):
        return Outcome(rule, "unavailable", f"{rule.figure}: no value ({fig.note or 'not measured'})", fig)
    if rule.test == "is_true":
        ok = bool(fig.value)
        return Outcome(rule, "pass" if ok else "fail", f"{rule.figure} is {'true' if ok else 'false'}", fig)
    lo, hi = fig.bounds()
    if rule.test == "equals":
        tol = abs(rule.value) * rule.rel_tol          # type: ignore[arg-type]
        want_lo, want_hi = rule.value - tol, rule.value + tol   # type: ignore[operator]
        target = f"= {_fmt(rule.value)}" + (f" ± {rule.rel_tol:.0%}" if rule.rel_tol else " exactly")
    else:
        want_lo = rule.lo if rule.test in ("within", "at_least") else -math.inf
        want_hi = rule.hi if rule.test in ("within", "at_most") else math.inf
        want_lo = -math.inf if want_lo is None else want_lo
        want_hi = math.inf if want_hi is None else want_hi
        target = {"within": f"within [{_fmt(rule.lo)}, {_fmt(rule.hi)}]", "at_least": f"≥ {_fmt(rule.lo)}",
                  "at_most": f"≤ {_fmt(rule.hi)}"}[rule.test]
    if want_lo <= lo and hi <= want_hi:
        status = "pass"
    elif hi < want_lo or lo > want_hi:
        status = "fail"
    else:
        status = "unsure"
    word = {"pass": "", "fail": "not ", "unsure": "interval straddles: "}[status]
    return Outcome(rule, status, f"{rule.figure} {fig.text()} {word}{target}", fig)


def evaluate(rules: tuple[Rule, ...], evidence: Evidence) -> list[Outcome]:
    out = []
    for rule in rules:
        fig = evidence.figures.get(rule.figure)
        if fig is None:
            reason = evidence.unavailable.get(rule.figure, "not measured")
            out.append(Outcome(rule, "unavailable", f"{rule.figure}: {reason}"))
        else:
            out.append(check(rule, fig))
    return out


def combine(outcomes: list[Outcome]) -> tuple[str, str]:
    """The verdict and its reason. All pass → supported; all fail → contradicted; all unsure → inconclusive;
    some pass → partly supported; fail and unsure without a pass → contradicted. Rules that could not be
    measured do not count but are named; none measurable → inconclusive with their reasons."""
    measured = [o for o in outcomes if o.status != "unavailable"]
    missing = [o for o in outcomes if o.status == "unavailable"]
    gap = ("; not tested: " + "; ".join(o.detail for o in missing)) if missing else ""
    if not measured:
        return "inconclusive", "; ".join(o.detail for o in missing) or "no rule"
    statuses = {o.status for o in measured}
    held = [o.rule.says for o in measured if o.status == "pass"]
    broke = [o.rule.says for o in measured if o.status == "fail"]
    unsure = [o.rule.says for o in measured if o.status == "unsure"]
    parts = []
    if held:
        parts.append("holds: " + "; ".join(held))
    if broke:
        parts.append("does not hold: " + "; ".join(broke))
    if unsure:
        parts.append("undecided (interval straddles the bound): " + "; ".join(unsure))
    reason = " | ".join(parts) + gap
    if statuses == {"pass"}:
        return "supported", reason
    if statuses == {"fail"}:
        return "contradicted", reason
    if statuses == {"unsure"}:
        return "inconclusive", reason
    if "pass" in statuses:
        return "partly supported", reason
    return "contradicted", reason
