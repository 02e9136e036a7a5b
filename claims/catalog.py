"""Load and validate claims.toml: every key known, every probe registered, every rule's figure produced. A claim
names its probe (whose declared reads are the claim's ``needs``), or declares its figures as data over one suite
(:mod:`claims.figures`): then the entry is all there is to the claim."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from claims.figures import parse_chart, parse_figure
from claims.model import Claim, Published, Rule
from claims.probes import PROBE_READS, load_all
from claims.rules import TESTS
from harness.contract.errors import BenchInputError


CATALOG = Path(__file__).with_name("claims.toml")
CLAIM_KEYS = {"section", "title", "quote", "where", "probe", "rules", "document_figure", "published", "units",
              "added", "own_question", "evidence", "suite", "figures", "chart"}
RULE_KEYS = {"figure", "test", "says", "lo", "hi", "value", "rel_tol", "central", "device", "power", "context",
             "processes"}
DEVICES = ("", "cpu", "cuda")          # a rule only a run on that device decides ("" = any)
EVIDENCE = ("measured", "quoted")     # what a claim's central rule may read (claims.model.Claim.evidence)
NEEDS = {"within": ("lo", "hi"), "at_least": ("lo",), "at_most": ("hi",), "equals": ("value",), "is_true": ()}


def _rule(cid: str, raw: dict[str, Any], figures: tuple[str, ...]) -> Rule:
    where = f"{cid}.rules"
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise BenchInputError(f"unknown rule key(s) {sorted(unknown)}", where=where)
    test = raw.get("test")
    if test not in TESTS:
        raise BenchInputError(f"rule test {test!r} is not one of {', '.join(TESTS)}", where=where)
    missing = [k for k in ("figure", "says", *NEEDS[test]) if raw.get(k) is None]
    if missing:
        raise BenchInputError(f"a {test} rule needs {', '.join(missing)}", where=where)
    if raw.get("device", "") not in DEVICES:
        raise BenchInputError(f"rule device {raw['device']!r} is not one of {', '.join(map(repr, DEVICES))}",
                              where=where)
    for key in ("central", "context"):
        if not isinstance(raw.get(key, False), bool):
            raise BenchInputError(f"{key} must be true or false", where=where)
    if raw.get("central") and raw.get("context"):
        raise BenchInputError("a central rule decides the claim: it cannot be context too", where=where)
    if not isinstance(raw.get("processes", 0), int) or raw.get("processes", 0) < 0:
        raise BenchInputError("processes must be a whole number ≥ 1 (the worker processes the timing must cover)",
                              where=where)
    if raw["figure"] not in figures:
        raise BenchInputError(f"figure {raw['figure']!r} is not produced by the probe "
                              f"(it makes {', '.join(figures)})", where=where)
    if "power" in raw and (not isinstance(raw["power"], str) or raw["power"] not in figures):
        raise BenchInputError(f"power {raw['power']!r} (the figure giving the smallest detectable effect) is not "
                              f"produced by the probe (it makes {', '.join(figures)})", where=where)
    return Rule(**{k: (float(v) if k in ("lo", "hi", "value", "rel_tol") else v) for k, v in raw.items()})


def load_catalog(path: Path = CATALOG) -> list[Claim]:
    """All claims, in id order; a malformed entry is a BenchInputError naming the claim and key."""
    probes = load_all()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BenchInputError(f"cannot read {path}: {exc}", where="claims") from None
    claims = []
    for cid, raw in data.items():
        unknown = set(raw) - CLAIM_KEYS
        if unknown:
            raise BenchInputError(f"unknown key(s) {sorted(unknown)}", where=cid)
        for key in ("section", "title", "quote", "where", "rules"):
            if key not in raw:
                raise BenchInputError(f"missing {key!r}", where=cid)
        declared, chart = (), None
        if ("probe" in raw) == ("figures" in raw or "suite" in raw):
            raise BenchInputError("give either a probe, or a suite and the figures declared over it", where=cid)
        if "probe" in raw:
            if raw["probe"] not in probes:
                raise BenchInputError(f"unknown probe {raw['probe']!r}", where=cid)
            if "chart" in raw:
                raise BenchInputError("chart belongs to declared figures (a probe draws its own)", where=cid)
            figures, needs = probes[raw["probe"]][1], PROBE_READS[raw["probe"]]
        else:
            if not isinstance(raw.get("suite"), str) or not isinstance(raw.get("figures"), list) or not raw["figures"]:
                raise BenchInputError("declared figures need suite = \"NAME\" and a non-empty list figures = [...]",
                                      where=cid)
            declared = tuple(parse_figure(f, f"{cid}.figures") for f in raw["figures"])
            figures, needs = tuple(f.name for f in declared), (f"suite {raw['suite']}",)
            if len(set(figures)) != len(figures):
                raise BenchInputError("a declared figure's name is given twice", where=f"{cid}.figures")
            chart = parse_chart(raw["chart"], f"{cid}.chart") if "chart" in raw else None
        rules = tuple(_rule(cid, r, figures) for r in raw["rules"])
        heads = [r.device for r in rules if r.central]
        if not heads:
            raise BenchInputError("exactly one rule must be central = true (the claim's headline), found 0 "
                                  "(or one per device: device = \"cpu\" / \"cuda\")", where=f"{cid}.rules")
        twice = sorted({d for d in heads if heads.count(d) > 1})
        if twice:
            raise BenchInputError(f"exactly one rule must be central = true (the claim's headline) per device, "
                                  f"found {heads.count(twice[0])} for {twice[0] or 'any device'}", where=f"{cid}.rules")
        if raw.get("evidence", "measured") not in EVIDENCE:
            raise BenchInputError(f"evidence {raw['evidence']!r} is not one of {', '.join(EVIDENCE)}", where=cid)
        claims.append(Claim(
            id=cid, title=raw["title"], quote=raw["quote"], where=raw["where"], section=raw["section"],
            probe=raw.get("probe", ""), rules=rules,
            document_figure=raw.get("document_figure", ""),
            published=tuple(Published(p["label"], p["value"]) for p in raw.get("published", [])),
            units=raw.get("units", ""), needs=needs,
            added=bool(raw.get("added", False)), own_question=raw.get("own_question", ""),
            evidence=raw.get("evidence", "measured"), suite=raw.get("suite", ""), declared=declared, chart=chart))
    return sorted(claims, key=lambda c: c.id)


def select_claims(claims: list[Claim], only: str | None) -> list[Claim]:
    """``--only C07,C16``: those claims (unknown ids are an error)."""
    if not only:
        return claims
    wanted = [s.strip().upper() for s in only.split(",") if s.strip()]
    known = {c.id for c in claims}
    bad = [w for w in wanted if w not in known]
    if bad:
        raise BenchInputError(f"unknown claim id(s) {', '.join(bad)}; known: {min(known)}…{max(known)}",
                              where="--only")
    return [c for c in claims if c.id in wanted]
