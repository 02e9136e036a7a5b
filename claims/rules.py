"""Decision rules: a figure with its interval against the claim's bounds → pass / fail / unsure; the rules'
outcomes → one verdict. An interval that straddles a bound is ``unsure``: never a pass."""
from __future__ import annotations

import math
from dataclasses import replace

from claims.model import Evidence, Figure, Outcome, Rule, quoted_part

TESTS = ("within", "at_least", "at_most", "equals", "is_true")


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:,.4g}"


def check(rule: Rule, fig: Figure, force: bool = False) -> Outcome:
    """Apply one rule to one figure. A timing measured while other processes loaded the machine
    (``fig.busy``) decides nothing: the rule is undecided ("machine busy") unless ``force``."""
    if fig.value is None or (isinstance(fig.value, float) and math.isnan(fig.value)):
        return Outcome(rule, "unavailable", f"{rule.figure}: no value ({fig.note or 'not measured'})", fig)
    if fig.busy and not force:
        return Outcome(rule, "unsure", f"{rule.figure} {fig.text()}: {fig.busy} — not decided (--force decides it)",
                       fig)
    if rule.test == "is_true":
        # a yes/no read at both ends of an interval (e.g. dominance with each latency at either end of its 95%
        # interval): yes at both passes, no at both fails, yes at one end only is undecided
        if fig.has_interval and bool(fig.lo) != bool(fig.hi):
            return Outcome(rule, "unsure", f"{rule.figure} {fig.text()}: interval straddles (true at one end only)",
                           fig)
        ok = bool(fig.lo) if fig.has_interval else bool(fig.value)
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


def evaluate(rules: tuple[Rule, ...], evidence: Evidence, device: str = "cpu", force: bool = False
             ) -> list[Outcome]:
    """Each rule's outcome on ``evidence``; a rule for another device (``device = "cuda"`` on a CPU run) is
    unavailable, whatever the probe produced; a timing measured on a busy machine is undecided unless ``force``."""
    out = []
    for rule in rules:
        fig = evidence.figures.get(rule.figure)
        if rule.device and rule.device != device.split(":")[0]:
            out.append(Outcome(rule, "unavailable", f"{rule.figure}: needs a {rule.device.upper()} device "
                                                    f"(this run measured on {device})"))
        elif fig is None:
            reason = evidence.unavailable.get(rule.figure, "not measured")
            out.append(Outcome(rule, "unavailable", f"{rule.figure}: {reason}"))
        else:
            o = check(rule, fig, force)
            out.append(o if o.status == "unavailable" else replace(o, device=device, mode=fig.mode or "eager"))
    return out


def decided_modes(outcomes: list[Outcome]) -> str:
    """How the models executed for the decided rules ("eager", "eager, compiled (default)"); "eager" when none."""
    modes = dict.fromkeys(m for o in outcomes if o.status != "unavailable"
                          for m in (o.mode, *(x.mode for x in o.others)) if m)
    return ", ".join(modes) or "eager"


def central(outcomes: list[Outcome]) -> Outcome:
    """The outcome of the claim's one central rule (its headline)."""
    heads = [o for o in outcomes if o.rule.central]
    if len(heads) != 1:
        raise ValueError(f"a claim needs exactly one central rule, got {len(heads)}")
    return heads[0]


def combine(outcomes: list[Outcome]) -> tuple[str, str]:
    """The verdict and its reason. Every rule measured and passing → supported; the central rule failing →
    contradicted; the central rule unmeasured or undecided → inconclusive; otherwise (the central rule holds,
    some other rule fails, straddles or was not measured) → partly supported. The reason names the central
    rule's outcome, then what held, what failed, what was undecided and what was not tested."""
    head = central(outcomes)
    by = {s: [o for o in outcomes if o.status == s] for s in ("pass", "fail", "unsure", "unavailable")}
    parts = [f"central: {head.rule.says} — {head.detail}"]
    for status, label in (("pass", "holds"), ("fail", "does not hold"),
                          ("unsure", "undecided (interval straddles the bound, or machine busy)")):
        says = [o.rule.says for o in by[status] if o is not head]
        if says:
            parts.append(f"{label}: " + "; ".join(says))
    missing = [o.detail for o in by["unavailable"] if o is not head]
    if missing:
        parts.append("not tested: " + "; ".join(missing))
    torn = [o.rule.says for o in outcomes if o.conflict]
    if torn:
        parts.append("devices disagree (shown as undecided): " + "; ".join(torn))
    if quoted_part(outcomes):                            # a verdict resting on a published figure says so
        parts.append(quoted_part(outcomes))
    reason = " | ".join(parts)
    if len(by["pass"]) == len(outcomes):
        return "supported", reason
    if head.status == "fail":
        return "contradicted", reason
    if head.status in ("unsure", "unavailable"):
        return "inconclusive", reason
    return "partly supported", reason
