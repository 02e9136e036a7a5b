"""Decision rules: a figure with its interval against the claim's bounds → pass / fail / unsure; the rules'
outcomes → one verdict. An interval that straddles a bound is ``unsure``: never a pass."""
from __future__ import annotations

import math
from dataclasses import replace

from claims.model import Evidence, Figure, Outcome, Rule, quoted_part

TESTS = ("within", "at_least", "at_most", "equals", "is_true")
HEADLINE_PROCESSES = 3
"""The fresh worker processes a timing's interval must cover before it decides a claim's central rule (the process
is the unit of replication: harness.analysis.process_stats), whether or not the rule says ``processes``."""


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:,.4g}"


def check(rule: Rule, fig: Figure, force: bool = False) -> Outcome:
    """Apply one rule to one figure. A timing measured while other processes loaded the machine
    (``fig.busy``) decides nothing: the rule is undecided ("machine busy") unless ``force``. A timing decides only
    over an interval covering the processes the rule asks (``processes``), and a central rule's over at least
    :data:`HEADLINE_PROCESSES`."""
    if fig.value is None or (isinstance(fig.value, float) and math.isnan(fig.value)):
        return Outcome(rule, "unavailable", f"{rule.figure}: no value ({fig.note or 'not measured'})", fig)
    if fig.busy and not force:
        return Outcome(rule, "unsure", f"{rule.figure} {fig.text()}: {fig.busy} — not decided (--force decides it)",
                       fig)
    level = (f" (interval over {fig.processes} process{'es' if fig.processes > 1 else ''})" if fig.processes
             else "")
    need = max(rule.processes, HEADLINE_PROCESSES if rule.central and fig.processes else 0)
    if need and fig.processes < need:
        return Outcome(rule, "unsure", f"{rule.figure} {fig.text()}{level or ' (a timing of unknown level)'}: this "
                                       f"rule decides only over ≥ {need} processes (bench claims "
                                       f"--processes {need}) — not decided", fig)
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
    return Outcome(rule, status, f"{rule.figure} {fig.text()}{level} {word}{target}", fig)


def evaluate(rules: tuple[Rule, ...], evidence: Evidence, device: str = "cpu", force: bool = False,
             claim_evidence: str = "measured") -> list[Outcome]:
    """Each rule's outcome on ``evidence``; a rule for another device (``device = "cuda"`` on a CPU run) is
    unavailable, whatever the probe produced; a timing measured on a busy machine is undecided unless ``force``.
    A rule that states its power (``Rule.power``) shows it in its detail, and a fail it had no power to see
    reads undecided (:func:`powered`). A measured claim's central rule over a figure this run did not produce
    (quoted or structural: :attr:`claims.model.Figure.here`) decides nothing: it reads undecided
    (:func:`not_here`)."""
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
            o = o if o.status == "unavailable" else powered(replace(o, device=device, mode=fig.mode or "eager"),
                                                            evidence)
            out.append(not_here(o) if rule.central and claim_evidence == "measured" else o)
    return out


def not_here(o: Outcome) -> Outcome:
    """A measured claim's central outcome: unchanged when its figure was produced here (measured, counted,
    derived); a quoted or structural one reads undecided, with the reason — a published number or a shape
    cannot be a measured claim's headline."""
    if o.status not in ("pass", "fail") or o.figure is None or o.figure.here:
        return o
    src = f" ({o.figure.quoted})" if o.figure.quoted else ""
    return replace(o, status="unsure", detail=f"{o.detail} — a {o.figure.kind} figure{src} cannot decide a measured "
                                              "claim's central rule")


def powered(o: Outcome, evidence: Evidence) -> Outcome:
    """``o`` with its rule's power: the smallest effect the test could have detected (``Rule.power`` names the
    figure, in the rule's units, measured from 0 = no effect) appended to the detail. A test that FAILS without
    the power to see the claimed effect decides nothing: it reads ``unsure`` with ``unpowered`` saying why —
    when the probe reports it had no power (the power figure unavailable with a reason, or not finite), or when
    the measured effect is below the detectable one (|value| < power). A fail with an effect at least as large as
    the detectable one (e.g. the opposite effect, clearly seen) stays a fail. No ``Rule.power``: ``o`` unchanged."""
    rule = o.rule
    if not rule.power:
        return o
    pf = evidence.figures.get(rule.power)
    value = None if o.figure is None else o.figure.value
    if pf is None or pf.value is None or not math.isfinite(float(pf.value)):
        why = (evidence.unavailable.get(rule.power, "not measured") if pf is None
               else f"{pf.text()}{': ' + pf.note if pf.note else ''}")
        detail, why = f"{o.detail}; smallest detectable effect: none ({why})", f"the test had no power ({why})"
    else:
        detail = f"{o.detail}; smallest detectable effect {pf.text()}" + (f" ({pf.note})" if pf.note else "")
        why = (f"the measured effect {_fmt(value)} is below the smallest the test could detect, {pf.text()}"
               if value is not None and abs(float(value)) < float(pf.value) else "")
    if o.status != "fail" or not why:
        return replace(o, detail=detail, power=pf)
    return replace(o, status="unsure", detail=f"{detail} — no power, decides nothing: {why}", power=pf, unpowered=why)


def decided_modes(outcomes: list[Outcome]) -> str:
    """How the models executed for the decided rules ("eager", "eager, compiled (default)"); "eager" when none."""
    modes = dict.fromkeys(m for o in outcomes if o.status != "unavailable"
                          for m in (o.mode, *(x.mode for x in o.others)) if m)
    return ", ".join(modes) or "eager"


def _base(device: str) -> str:
    return device.split(":")[0].strip()


def centrals(outcomes: list[Outcome], device: str = "") -> list[Outcome]:
    """The central outcomes that decide a verdict on ``device`` ("cpu", "cuda:0"; "cpu + cuda" after a merge;
    "" = the devices the central rules were decided on). A claim has at most one central rule per device
    (``Rule.device``: "cpu", "cuda", or "" for any): per device, its own central rule, else the any-device one;
    a device with neither (a claim decided only on a GPU, run on the CPU) reads its first central rule, which
    is then unavailable there."""
    heads = [o for o in outcomes if o.rule.central]
    if not heads:
        raise ValueError("a claim needs a central rule")
    for d in {o.rule.device for o in heads}:
        if sum(o.rule.device == d for o in heads) > 1:
            raise ValueError(f"a claim needs at most one central rule per device, got several for {d or 'any device'}")
    devices = ([_base(d) for d in device.split("+") if d.strip()]
               or list(dict.fromkeys(_base(o.device) for o in heads if o.device)) or [""])
    out: list[Outcome] = []
    for d in devices:
        head = (next((o for o in heads if d and o.rule.device == d), None)
                or next((o for o in heads if not o.rule.device), None) or heads[0])
        if all(head is not o for o in out):
            out.append(head)
    return out


def central(outcomes: list[Outcome], device: str = "") -> Outcome:
    """The outcome of the claim's central rule (its headline) for ``device`` (the first, after a merge)."""
    return centrals(outcomes, device)[0]


def _central_part(head: Outcome) -> str:
    """The reason's part for one central rule; a device-bound one names the device that decided it."""
    where = f" on {head.device or head.rule.device}" if head.rule.device else ""
    return f"central{where}: {head.rule.says} — {head.detail}"


def decided_by(outcomes: list[Outcome]) -> str:
    """The reason's part naming the figures that decided the verdict (the deciding rules that passed or failed),
    each with its provenance; "" when none did."""
    figs = dict.fromkeys(f"{o.rule.figure} ({o.figure.kind})" for o in outcomes
                         if not o.rule.context and o.status in ("pass", "fail") and o.figure is not None)
    return ("decided by: " + ", ".join(figs)) if figs else ""


def combine(outcomes: list[Outcome], device: str = "") -> tuple[str, str]:
    """The verdict and its reason. Every deciding rule measured and passing, at least one of them over a figure
    produced here (:attr:`claims.model.Figure.here`) → supported; the central rule failing → contradicted; the
    central rule unmeasured or undecided (a fail it had no power to see, or a measured claim's central rule over
    a quoted figure, included) → inconclusive; otherwise (the central rule holds, some other rule fails,
    straddles or was not measured; or only quoted and structural figures hold) → partly supported. Context
    rules (``Rule.context``) are shown and never decide. The central rule is the one of ``device``
    (:func:`centrals`); after a merge, the central rules of both devices decide together: one holding where the
    other fails → partly supported. The reason names the central rule's outcome (and its device, when it has
    one), then what held, what failed, what was undecided, what was not tested, the context, and the figures
    that decided it with their provenance."""
    heads = centrals(outcomes, device)
    is_head = lambda o: any(o is h for h in heads)  # noqa: E731
    context = [o for o in outcomes if o.rule.context and not is_head(o)]
    outcomes = [o for o in outcomes if not o.rule.context or is_head(o)]
    by = {s: [o for o in outcomes if o.status == s] for s in ("pass", "fail", "unsure", "unavailable")}
    parts = [_central_part(h) for h in heads]
    statuses = {h.status for h in heads}
    if {"pass", "fail"} <= statuses:
        parts.append("the devices' central rules disagree: holds on "
                     + ", ".join(h.device for h in heads if h.status == "pass") + ", not on "
                     + ", ".join(h.device for h in heads if h.status == "fail"))
    for status, label in (("pass", "holds"), ("fail", "does not hold"),
                          ("unsure", "undecided (interval straddles the bound, machine busy, or no power)")):
        says = [o.rule.says for o in by[status] if not is_head(o)]
        if says:
            parts.append(f"{label}: " + "; ".join(says))
    missing = [o.detail for o in by["unavailable"] if not is_head(o)]
    if missing:
        parts.append("not tested: " + "; ".join(missing))
    torn = [o.rule.says for o in outcomes if o.conflict]
    if torn:
        parts.append("devices disagree (shown as undecided): " + "; ".join(torn))
    if quoted_part(outcomes):                            # a verdict resting on a published figure says so
        parts.append(quoted_part(outcomes))
    if context:
        parts.append("context (does not decide): " + "; ".join(f"{o.rule.says} — {o.detail}" for o in context))
    if decided_by(outcomes):
        parts.append(decided_by(outcomes))
    here = [o for o in by["pass"] if o.figure is not None and o.figure.here]
    if len(by["pass"]) == len(outcomes) and not here:
        parts.append("only quoted or structural figures hold: nothing measured here supports it")
    reason = " | ".join(parts)
    if len(by["pass"]) == len(outcomes) and here:
        return "supported", reason
    if "fail" in statuses and "pass" not in statuses:
        return "contradicted", reason
    if "pass" not in statuses:
        return "inconclusive", reason
    return "partly supported", reason
