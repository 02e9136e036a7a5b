"""Run the probes the chosen claims need (each once) and decide every claim, with its provenance."""
from __future__ import annotations

import time
import traceback
from functools import partial
from typing import Any, Callable

from claims.evidence import Context
from claims.figures import declared_evidence
from claims.model import Claim, Evidence, Verdict
from claims.probes import ProbeFn, load_all
from claims.rules import combine, decided_modes, evaluate


class ProbeContractError(RuntimeError):
    """A probe returned without a figure it declares, and without saying why it could not measure it."""


def decide(claim: Claim, evidence: Evidence, device: str = "cpu",
           provenance: list[dict[str, Any]] | None = None, force: bool = False) -> Verdict:
    outcomes = evaluate(claim.rules, evidence, device, force, claim.evidence)
    verdict, reason = combine(outcomes, device)
    return Verdict(claim, verdict, reason, outcomes, evidence, device=device, mode=decided_modes(outcomes),
                   provenance=list(provenance or []))


def checked(name: str, fn: ProbeFn, declared: tuple[str, ...], ctx: Context) -> Evidence:
    """Run probe ``name``; every figure it declares must be produced or marked unavailable with a reason."""
    ev = fn(ctx)
    silent = [f for f in declared if f not in ev.figures and not str(ev.unavailable.get(f) or "").strip()]
    if silent:
        raise ProbeContractError(f"probe {name} neither produced nor gave a reason for: {', '.join(silent)}")
    return ev


def run_claims(claims: list[Claim], ctx: Context, on_verdict: Callable[[Verdict], None] | None = None
               ) -> list[Verdict]:
    """Probe and decide each claim; a probe that fails makes its claims inconclusive with the error (and
    ``Evidence.failed`` set, so the command can exit non-zero). A claim with declared figures is its own probe
    (:func:`claims.figures.declared_evidence` over its suite). A probe may read only what it declares."""
    probes = load_all()
    here = ctx.here()
    cache: dict[str, tuple[Evidence, list[dict[str, Any]]]] = {}
    verdicts = []
    for claim in claims:
        name = claim.source
        if name not in cache:
            t0 = time.perf_counter()
            start = len(ctx.provenance)
            before = set(ctx.pieces)
            fn, declared = probe_of(claim, probes)
            ctx.reading = (name, claim.needs)
            try:
                ev = checked(name, fn, declared, ctx)
            except Exception as exc:  # noqa: BLE001 — one broken probe must not cost the other claims
                ev = Evidence(notes=[traceback.format_exc(limit=3)], failed=f"{type(exc).__name__}: {exc}")
                ev.unavailable = {r.figure: f"probe {name} failed: {type(exc).__name__}: {exc}"
                                  for c in claims if c.source == name for r in c.rules}
            finally:
                ctx.reading = None
            total = time.perf_counter() - t0
            inside = {k: v for k, v in ctx.pieces.items() if k not in before}
            own = max(0.0, total - sum(v["seconds"] for v in inside.values()))
            ctx.pieces[f"probe {name}"] = {"seconds": own, "reused": False}
            ev.notes.append(f"probe {name}: {total:,.1f} s" + "".join(
                f"; {k} {'reused' if v['reused'] else 'measured'} in {v['seconds']:,.1f} s" for k, v in inside.items())
                + (f"; its own computation {own:,.1f} s" if inside else ""))
            sources = {p["source"]: p for p in ctx.provenance[start:]}        # each source once, in order
            cache[name] = (ev, [here, *sources.values()])
        ev, provenance = cache[name]
        v = decide(claim, ev, ctx.device, provenance, ctx.force)
        verdicts.append(v)
        if on_verdict:
            on_verdict(v)
    return verdicts


def probe_of(claim: Claim, probes: dict[str, tuple[ProbeFn, tuple[str, ...]]]) -> tuple[ProbeFn, tuple[str, ...]]:
    """The function that produces ``claim``'s figures and the figures it declares: its probe, or the evaluation of
    the figures its catalog entry declares."""
    if claim.probe:
        return probes[claim.probe]
    return (partial(declared_evidence, suite=claim.suite, specs=claim.declared, chart=claim.chart),
            tuple(f.name for f in claim.declared))
