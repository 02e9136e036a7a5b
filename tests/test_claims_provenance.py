"""Figures carry their provenance as data, and it governs the verdict: a quoted or structural figure can neither
be a measured claim's headline nor make a verdict "supported" on its own; context rules never decide; the
verdict's reason names the figures that decided it with their provenance."""
from __future__ import annotations

from dataclasses import replace

import pytest

from claims.catalog import load_catalog
from claims.model import Claim, Evidence, Figure, Rule
from claims.verdicts import decide

SRC = "Someone et al. 2020, Table 1"


def _claim(*rules: Rule, evidence: str = "measured") -> Claim:
    return Claim("CX", "t", "q", "w", "s", "p", rules, evidence=evidence)


def test_provenance_is_data_with_a_default_and_a_source_for_quotes():
    assert Figure(1.0).kind == "measured" and Figure(1.0).here
    assert Figure(1.0, quoted=SRC).kind == "quoted" and not Figure(1.0, quoted=SRC).here
    assert Figure(1.0, provenance="counted").here and Figure(1.0, provenance="derived").here
    assert not Figure(1.0, provenance="structural").here
    assert Figure(1.0, quoted=SRC).as_dict()["provenance"] == "quoted"
    with pytest.raises(ValueError, match="needs its source"):
        Figure(1.0, provenance="quoted")
    with pytest.raises(ValueError, match="is quoted, not measured"):
        Figure(1.0, quoted=SRC, provenance="measured")
    with pytest.raises(ValueError, match="not one of"):
        Figure(1.0, provenance="guessed")


@pytest.mark.parametrize("kind", ["quoted", "structural"])
def test_a_rule_over_a_quoted_or_structural_figure_alone_cannot_make_supported(kind):
    fig = Figure(5.0, quoted=SRC) if kind == "quoted" else Figure(5.0, provenance="structural")
    rule = Rule("x", "at_least", "x is large", lo=1.0, central=True)
    for evidence in ("measured", "quoted"):
        v = decide(_claim(rule, evidence=evidence), Evidence(figures={"x": fig}))
        assert v.verdict != "supported", (evidence, v.reason)
        assert (f"decided by: x ({kind})" in v.reason if evidence == "quoted"
                else f"a {kind} figure" in v.reason and "cannot decide a measured claim" in v.reason)
    # a measured claim: the central quoted figure decides nothing, even when it would fail
    v = decide(_claim(rule), Evidence(figures={"x": Figure(0.0, quoted=SRC)}))
    assert v.verdict == "inconclusive" and "cannot decide a measured claim" in v.reason
    # a quoted claim (out of reach here): its central quoted figure may contradict, never support
    v = decide(_claim(rule, evidence="quoted"), Evidence(figures={"x": Figure(0.0, quoted=SRC)}))
    assert v.verdict == "contradicted"
    v = decide(_claim(rule, evidence="quoted"), Evidence(figures={"x": fig}))
    assert v.verdict == "partly supported" and "nothing measured here supports it" in v.reason


def test_a_measured_central_rule_with_quoted_side_rules_can_be_supported_and_names_its_figures():
    rules = (Rule("m", "at_least", "measured part", lo=1.0, central=True),
             Rule("q", "at_least", "quoted part", lo=1.0))
    ev = Evidence(figures={"m": Figure(2.0, 1.5, 2.5, provenance="measured"), "q": Figure(3.0, quoted=SRC)})
    v = decide(_claim(*rules), ev)
    assert v.verdict == "supported"
    assert "decided by: m (measured), q (quoted)" in v.reason and SRC in v.reason
    # the quoted side rule failing leaves the measured headline standing: partly supported, never contradicted
    v = decide(_claim(*rules), Evidence(figures={**ev.figures, "q": Figure(0.0, quoted=SRC)}))
    assert v.verdict == "partly supported"


def test_context_rules_are_shown_and_never_decide():
    rules = (Rule("m", "at_least", "measured part", lo=1.0, central=True),
             Rule("c", "at_least", "published context", lo=1.0, context=True))
    for c in (3.0, 0.0):
        v = decide(_claim(*rules), Evidence(figures={"m": Figure(2.0), "c": Figure(c, quoted=SRC)}))
        assert v.verdict == "supported", v.reason
        assert "context (does not decide): published context" in v.reason
        assert "decided by: m (measured)" in v.reason and "c (quoted)" not in v.reason.split("decided by:")[1]


def test_the_catalog_holds_context_and_evidence_keys_to_their_meaning(tmp_path):
    from claims.catalog import load_catalog as load
    from harness.contract.errors import BenchInputError
    base = ('[C99]\nsection = "s"\ntitle = "t"\nquote = "q"\nwhere = "w"\nprobe = "named_sizes"\n')
    bad = tmp_path / "c.toml"
    bad.write_text(base + 'rules = [{ figure = "params_gpt3", test = "at_least", lo = 1, says = "x", '
                          'central = true, context = true }]\n')
    with pytest.raises(BenchInputError, match="cannot be context"):
        load(bad)
    bad.write_text(base + 'evidence = "hearsay"\nrules = [{ figure = "params_gpt3", test = "at_least", lo = 1, '
                          'says = "x", central = true }]\n')
    with pytest.raises(BenchInputError, match="evidence 'hearsay'"):
        load(bad)


def test_only_quoted_claims_are_out_of_reach_and_they_say_so():
    """A claim whose headline may rest on quotes declares it (evidence = "quoted") and says in its units text
    that its figures are published, not measured."""
    quoted = [c for c in load_catalog() if c.evidence == "quoted"]
    assert {c.id for c in quoted} == {"C48"}
    for c in quoted:
        assert "QUOTED" in c.units


# -- timing levels: how many processes a timing rule's interval covers ---------------------------------
def test_a_timing_rule_says_how_many_processes_its_interval_covers_and_can_demand_more():
    from claims.rules import check
    rule = Rule("t", "at_most", "no slower", hi=1.0)
    one = Figure(0.97, 0.95, 0.99, "×", processes=1)
    three = Figure(0.97, 0.95, 0.99, "×", processes=3)
    assert "(interval over 1 process)" in check(rule, one).detail
    assert "(interval over 3 processes)" in check(rule, three).detail
    strict = Rule("t", "at_most", "no slower", hi=1.0, processes=3)
    o = check(strict, one)
    assert o.status == "unsure" and "decides only over ≥ 3 processes" in o.detail
    assert check(strict, three).status == "pass"
    assert check(strict, Figure(0.97, 0.95, 0.99)).status == "unsure"        # a timing of unknown level
    assert check(rule, Figure(2.0)).detail == "t 2 not ≤ 1"                 # not a timing: no level said


def test_the_paired_ratio_figure_carries_its_level():
    from claims.probes import timed_ratio
    from harness.instruments.timing import TimingConfig, measure_interleaved
    a, b = measure_interleaved([lambda: sum(range(200)), lambda: sum(range(100))],
                               TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=5, min_time_s=0.0, max_time_s=0.5))
    f = timed_ratio(a, b, "two sums")
    assert f.processes == 1 and "one process" in f.note


def test_c28s_headline_demands_processes_and_its_suite_is_measured_so():
    from claims.reads import load_reads, parse
    from harness.contract.errors import BenchInputError
    head = next(r for r in load_catalog() if r.id == "C28").rules
    rule = next(r for r in head if r.central)
    assert rule.figure == "latency_ratio_convnext_vit_s" and rule.processes == 3
    assert load_reads()["vit_vs_cnn"].processes >= rule.processes
    with pytest.raises(BenchInputError, match="processes must be"):
        parse({"x": {"why": "w", "processes": 0}})


def test_a_central_timing_rule_decides_only_over_processes_even_when_it_does_not_say_so():
    """A headline read from a timing (a figure that says its level) needs an interval over ≥ 3 processes; a
    non-central rule over the same figure decides at the level it has, and says which."""
    from claims.rules import HEADLINE_PROCESSES, check
    one = Figure(0.97, 0.95, 0.99, "×", processes=1)
    head = Rule("t", "at_most", "no slower", hi=1.0, central=True)
    o = check(head, one)
    assert o.status == "unsure" and f"decides only over ≥ {HEADLINE_PROCESSES} processes" in o.detail
    assert "(interval over 1 process)" in o.detail
    assert check(head, replace(one, processes=HEADLINE_PROCESSES)).status == "pass"
    assert check(Rule("t", "at_most", "no slower", hi=1.0), one).status == "pass"
    assert check(head, Figure(0.97, 0.95, 0.99, "×")).status == "pass"          # not a timing: a count's ratio


# The suite whose cases each central timing rule reads (the others are timed in their probe's own code over
# claims.probes.PROCESSES fresh processes: C19's generation, C34's two attentions).
TIMED_HEADLINES = {"C05": "attention_vs_lstm", "C10": "kv_cache", "C23": "vit_vs_cnn", "C27": "vit_vs_cnn",
                   "C28": "vit_vs_cnn"}


def test_every_timing_rule_that_demands_processes_reads_a_suite_measured_over_them():
    from claims.probes import PROCESSES
    from claims.reads import load_reads
    reads = load_reads()
    demanding = {c.id: c for c in load_catalog() if any(r.processes for r in c.rules)}
    assert set(TIMED_HEADLINES) <= set(demanding)
    for cid, claim in demanding.items():
        need = max(r.processes for r in claim.rules)
        if cid in TIMED_HEADLINES:
            assert f"suite {TIMED_HEADLINES[cid]}" in claim.needs, cid
            assert reads[TIMED_HEADLINES[cid]].processes >= need, cid
        elif cid in ("C11",):                       # C10's figure, read from the same kv_cache run
            assert reads["kv_cache"].processes >= need
        else:
            assert cid in ("C19", "C34") and PROCESSES >= need, cid


def test_probe_modules_are_discovered_from_the_package_not_a_kept_list():
    import sys
    from pathlib import Path
    import claims.probes as probes
    on_disk = {p.stem for p in Path(probes.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert {m.rsplit(".", 1)[1] for m in probes.probe_modules()} == on_disk
    probes.load_all()
    assert all(f"claims.probes.{m}" in sys.modules for m in on_disk)
    assert not hasattr(probes, "MODULES")
