"""Run the probes the chosen claims need (each once) and decide every claim."""
from __future__ import annotations

import time
import traceback
from typing import Callable

from claims.evidence import Context
from claims.model import Claim, Evidence, Verdict
from claims.probes import load_all
from claims.rules import combine, evaluate


def decide(claim: Claim, evidence: Evidence) -> Verdict:
    outcomes = evaluate(claim.rules, evidence)
    verdict, reason = combine(outcomes)
    return Verdict(claim, verdict, reason, outcomes, evidence)


def run_claims(claims: list[Claim], ctx: Context, on_verdict: Callable[[Verdict], None] | None = None
               ) -> list[Verdict]:
    """Probe and decide each claim; a probe that fails makes its claims inconclusive with the error."""
    probes = load_all()
    cache: dict[str, Evidence] = {}
    verdicts = []
    for claim in claims:
        if claim.probe not in cache:
            t0 = time.perf_counter()
            try:
                cache[claim.probe] = probes[claim.probe][0](ctx)
            except Exception as exc:  # noqa: BLE001 — one broken probe must not cost the other claims
                ev = Evidence(notes=[traceback.format_exc(limit=3)])
                ev.unavailable = {r.figure: f"probe {claim.probe} failed: {type(exc).__name__}: {exc}"
                                  for c in claims if c.probe == claim.probe for r in c.rules}
                cache[claim.probe] = ev
            cache[claim.probe].notes.append(f"probe {claim.probe}: {time.perf_counter() - t0:,.1f} s")
        v = decide(claim, cache[claim.probe])
        verdicts.append(v)
        if on_verdict:
            on_verdict(v)
    return verdicts
