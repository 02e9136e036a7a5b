"""Claims: the decision rules (results that should pass pass, results that should fail fail), the verdict
logic, the catalog's validation, and the command on cheap claims."""
from __future__ import annotations

import json
import math
import sys
import types

import pytest
import torch

from claims.catalog import load_catalog, select_claims
from claims.model import Evidence, Figure, Rule, mean_ci
from claims.rules import check, combine, evaluate
from claims import evidence as evidence_module
from claims import verdicts as verdicts_module
from claims.evidence import Context
from harness.store.db import Store
from claims.probes import load_all
from claims.verdicts import decide
from harness.contract.errors import BenchInputError
from tests.helpers import invoke

WITHIN = Rule("k", "within", "exponent ≈ 2", lo=1.6, hi=2.2)


@pytest.mark.parametrize("fig, expected", [
    (Figure(1.93, 1.88, 1.98), "pass"),            # eager latency exponent with a tight interval
    (Figure(1.02, 0.97, 1.07), "fail"),            # linear: the whole interval below the bound
    (Figure(1.9, 1.2, 2.6), "unsure"),             # straddles: never a pass
    (Figure(2.0), "pass"), (Figure(2.3), "fail"),  # point figures
])
def test_within_rule(fig, expected):
    assert check(WITHIN, fig).status == expected


@pytest.mark.parametrize("value, expected", [(0.25, "pass"), (0.125, "fail"), (0.2500001, "fail")])
def test_equals_is_exact_without_tolerance(value, expected):
    # kv_bytes(GQA-8) / kv_bytes(MHA-32) equals 0.25 exactly
    assert check(Rule("kv_ratio", "equals", "1/4", value=0.25), Figure(value)).status == expected


def test_equals_with_tolerance_and_one_sided_rules():
    assert check(Rule("p", "equals", "25M", value=25.6, rel_tol=0.05), Figure(25.557)).status == "pass"
    assert check(Rule("p", "equals", "25M", value=25.6, rel_tol=0.05), Figure(27.0)).status == "fail"
    alibi = Rule("r", "at_most", "ALiBi within 5%", hi=1.05)        # loss(4×)/loss(1×)
    assert check(alibi, Figure(1.01, 0.99, 1.03)).status == "pass"
    assert check(alibi, Figure(1.40, 1.30, 1.50)).status == "fail"
    assert check(alibi, Figure(1.04, 1.00, 1.08)).status == "unsure"
    gap = Rule("g", "at_least", "CNN better", lo=0.0)
    assert check(gap, Figure(0.2, 0.1, 0.3)).status == "pass"
    assert check(gap, Figure(-0.2, -0.3, -0.1)).status == "fail"
    assert check(Rule("t", "is_true", "clear error"), Figure(True)).status == "pass"
    assert check(Rule("t", "is_true", "clear error"), Figure(False)).status == "fail"
    assert check(gap, Figure(float("nan"))).status == "unavailable"


HEAD = Rule("a", "at_least", "the headline", lo=1, central=True)
SIDE = Rule("b", "at_least", "a side rule", lo=1)
YES, NO, MAYBE = Figure(2.0), Figure(0.0), Figure(1.0, 0.5, 1.5)


def verdict_of(a: Figure | None, b: Figure | None, missing: str = "needs a GPU") -> str:
    ev = Evidence(figures={k: f for k, f in (("a", a), ("b", b)) if f is not None},
                  unavailable={k: missing for k, f in (("a", a), ("b", b)) if f is None})
    return combine(evaluate((HEAD, SIDE), ev))[0]


@pytest.mark.parametrize("head, side, expected", [
    (YES, YES, "supported"),                   # every rule measured and passing
    (NO, YES, "contradicted"), (NO, NO, "contradicted"), (NO, None, "contradicted"),   # the headline fails
    (MAYBE, YES, "inconclusive"), (None, YES, "inconclusive"), (None, None, "inconclusive"),
    (YES, NO, "partly supported"), (YES, MAYBE, "partly supported"),
    (YES, None, "partly supported"),           # an unmeasured rule never lets the verdict read supported
])
def test_verdict_table(head, side, expected):
    assert verdict_of(head, side) == expected


def test_reason_names_the_central_rule_what_failed_and_what_was_not_tested():
    v, reason = combine(evaluate((HEAD, SIDE), Evidence(figures={"a": YES}, unavailable={"b": "needs ImageNet"})))
    assert v == "partly supported"
    assert reason.startswith("central: the headline") and "not tested: b: needs ImageNet" in reason
    v, reason = combine(evaluate((HEAD, SIDE), Evidence(unavailable={"a": "needs a GPU", "b": "needs ImageNet"})))
    assert v == "inconclusive" and "needs a GPU" in reason and "needs ImageNet" in reason


def test_a_rule_for_another_device_is_unmeasured_whatever_the_probe_gave():
    gpu = Rule("b", "at_least", "on a GPU too", lo=1, device="cuda")
    ev = Evidence(figures={"a": YES, "b": YES})            # a CPU figure under the GPU rule's name
    out = evaluate((HEAD, gpu), ev, device="cpu")
    assert out[1].status == "unavailable" and "needs a CUDA device" in out[1].detail
    assert combine(out)[0] == "partly supported"
    assert combine(evaluate((HEAD, gpu), ev, device="cuda:0"))[0] == "supported"


def test_mean_ci_is_a_t_interval():
    f = mean_ci([1.0, 2.0, 3.0])
    assert f.value == 2.0 and math.isclose(f.hi - f.value, 4.302653 * 1 / math.sqrt(3), rel_tol=1e-5)
    assert not mean_ci([5.0]).has_interval and math.isnan(mean_ci([]).value)


def test_catalog_has_every_claim_of_claims_md_with_rules_over_produced_figures():
    claims = load_catalog()
    assert [c.id for c in claims][:30] == [f"C{i:02d}" for i in range(1, 31)]
    assert all(c.rules and c.quote and c.where for c in claims)
    assert not any(c.added for c in claims[:30]) and all(c.added for c in claims[30:])   # ours, marked
    assert [c.id for c in select_claims(claims, "c07, C16")] == ["C07", "C16"]
    with pytest.raises(BenchInputError, match="C99"):
        select_claims(claims, "C07,C99")


@pytest.mark.parametrize("broken, message", [
    ('[C01]\ntitle = "x"\n', "missing"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="nope"\nrules=[]\n', "unknown probe"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="qk_macs_n1000", test="near", says="x"}]\n', "not one of"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="made_up", test="is_true", says="x"}]\n', "not produced"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="qk_macs_n1000", test="within", lo=1, says="x"}]\n', "needs hi"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="qk_macs_n1000", test="is_true", says="x"}]\n', "exactly one rule must be central"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="qk_macs_n1000", test="is_true", says="x", central=true},'
     ' {figure="core_macs_n1000", test="is_true", says="y", central=true}]\n', "found 2"),
    ('[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\n'
     'rules=[{figure="qk_macs_n1000", test="is_true", says="x", central=true, device="tpu"}]\n', "rule device"),
])
def test_catalog_validation(tmp_path, broken, message):
    path = tmp_path / "claims.toml"
    path.write_text(broken)
    with pytest.raises(BenchInputError, match=message):
        load_catalog(path)


def test_decide_on_a_real_probe_document_arithmetic():
    from claims.probes.vision import attention_arithmetic
    claim = next(c for c in load_catalog() if c.id == "C26")
    assert decide(claim, attention_arithmetic(None)).verdict == "supported"   # type: ignore[arg-type]
    # round 3 (issue 29): the central rule reads the real ViT-B/16's score tensor (kib_vit_b16_model); the
    # document's 14⁴ arithmetic (entries_vit_b16) became a side rule, so 197² there no longer contradicts
    wrong = Evidence(figures={**attention_arithmetic(None).figures,            # type: ignore[arg-type]
                              "kib_vit_b16_model": Figure(600.0)})             # a model writing 4× the scores
    assert decide(claim, wrong).verdict == "contradicted"                       # the central rule
    cls = Evidence(figures={**attention_arithmetic(None).figures,              # type: ignore[arg-type]
                            "entries_vit_b16": Figure(197.0 ** 2)})            # with [CLS]: not 14⁴
    assert decide(claim, cls).verdict == "partly supported"
    off = Evidence(figures={**attention_arithmetic(None).figures,              # type: ignore[arg-type]
                            "mib_48x16": Figure(150.0)})
    assert decide(claim, off).verdict == "partly supported"                    # a side rule


def test_bench_claims_command_on_cheap_claims(tmp_path):
    store_url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    out = tmp_path / "c.html"
    md = tmp_path / "c.md"
    result = invoke("claims", "--quick", "--only", "C12,C20,C26", "--store", store_url, "-o", str(out),
                    "--markdown", str(md))
    assert result.exit_code == 0, result.output
    table = md.read_text().splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| C12 | LLaMA-2 70B") and "| contradicted | cpu, eager |" in table[2]
    assert "★ doc_over_gqa_70b 6.4 × ✗" in table[2]
    record = json.loads(out.with_suffix(".json").read_text())
    verdicts = {c["id"]: c["verdict"] for c in record["claims"]}
    assert verdicts == {"C12": "contradicted", "C20": "supported", "C26": "supported"}
    for c in record["claims"]:                 # provenance: the code, torch and device that measured it
        assert c["device"] == "cpu" and c["mode"] == "eager" and c["probe_failed"] is None
        here = c["provenance"][0]
        assert here["torch"] == torch.__version__ and here["device"] == "cpu" and len(here["commit"] or "x") == 40
        assert sum(o["central"] for o in c["rules"]) == 1
    page = out.read_text()
    assert "C12" in page and "<svg" in page and "contradicted" in page
    bad = invoke("claims", "--only", "C77", "--store", store_url, "-o", str(out))
    assert bad.exit_code == 2 and "C77" in bad.stderr


def _broken(monkeypatch: pytest.MonkeyPatch, fn) -> None:
    """Replace probe attention_arithmetic (C26's) with ``fn``, keeping its declared figures."""
    probes = dict(load_all())
    probes["attention_arithmetic"] = (fn, probes["attention_arithmetic"][1])
    monkeypatch.setattr(verdicts_module, "load_all", lambda: probes)


def _crash(ctx):
    raise RuntimeError("the probe broke")


def _silent(ctx):
    """Produces one of its declared figures and says nothing about the others."""
    return Evidence(figures={"entries_vit_b16": Figure(38416.0)})


@pytest.mark.parametrize("fn, message", [(_crash, "RuntimeError: the probe broke"),
                                         (_silent, "neither produced nor gave a reason for: kib_vit_b16")])
def test_a_failed_probe_gives_inconclusive_and_exit_1_after_the_table(tmp_path, monkeypatch, fn, message):
    _broken(monkeypatch, fn)
    out = tmp_path / "c.html"
    result = invoke("claims", "--quick", "--only", "C20,C26", "--store", f"sqlite:///{tmp_path / 'r.sqlite'}",
                    "-o", str(out))
    assert result.exit_code == 1
    assert "C26" in result.stdout and "probe failed" in result.stdout            # the table was printed
    assert message in result.stderr
    record = {c["id"]: c for c in json.loads(out.with_suffix(".json").read_text())["claims"]}
    assert record["C26"]["verdict"] == "inconclusive" and message in record["C26"]["probe_failed"]
    assert record["C20"]["verdict"] == "supported" and record["C20"]["probe_failed"] is None


def test_stored_suite_run_is_reused_only_with_the_same_cases(tmp_path):
    """A stored run is evidence only for the cases it holds: a case it lacks (a changed suite file) is measured
    again; a run holding more cases than are needed serves (the cases are the same, key for key)."""
    from claims.evidence import Context
    from harness.engine.env import fingerprint
    from harness.store.db import Store
    from harness.contract.suite import load_suite
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    ctx = Context(store=store, quick=True, threads=1)
    suite = load_suite("heads", quick=True, sets={"threads": 1})
    cases = list(suite.cases)
    def stored(interleave: bool) -> str:
        run_id = store.create_run(suite.name, "suites/heads.toml", True, len(cases), fingerprint(threads=1),
                                  {"sets": {"threads": 1}, "interleave": interleave})
        for c in cases:
            store.add_record(run_id, c.record("ok"))
        store.finish_run(run_id)
        return run_id
    keys = {c.key for c in cases}
    stored(interleave=False)
    assert ctx.stored_suite("heads", {"threads": 1}, keys) is None                      # not timed side by side
    run_id = stored(interleave=True)
    assert ctx.stored_suite("heads", {"threads": 1}, keys).id == run_id
    assert ctx.stored_suite("heads", {"threads": 1}, keys - {cases[0].key}).id == run_id  # fewer cases: it holds them
    assert ctx.stored_suite("heads", {"threads": 1}, keys | {"new-case"}) is None        # a case added
    assert ctx.stored_suite("heads", {"threads": 2}, keys) is None                       # other --set


def test_a_stored_experiment_is_reused_only_when_its_code_is_this_checkouts(tmp_path, monkeypatch):
    """An experiment result trained by other experiment code is trained again; one reused keeps the
    provenance (commit, torch) of the run that trained it."""
    calls = []
    fake = types.ModuleType("claims.experiments.fake_exp")
    fake.run = lambda quick, seeds: calls.append(seeds) or {"value": len(calls)}     # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "claims.experiments.fake_exp", fake)
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    first = Context(store=store, quick=True, threads=1, seeds=(0,))
    assert first.experiment("fake_exp")["value"] == 1
    again = Context(store=store, quick=True, threads=1, seeds=(0,))
    assert again.experiment("fake_exp")["value"] == 1 and len(calls) == 1          # same code: reused
    assert again.provenance[-1]["torch"] == torch.__version__
    monkeypatch.setattr(evidence_module, "experiments_code_hash", lambda: "other-code")
    changed = Context(store=store, quick=True, threads=1, seeds=(0,))
    assert changed.experiment("fake_exp")["value"] == 2 and len(calls) == 2        # changed code: trained again


@pytest.mark.parametrize("arch", ["lstm-small", "conv1d-small"])
def test_one_layer_macs_grow_as_d_squared(arch):
    """C04's d-ratio is taken per layer (2 layers − 1 layer), so embedding and head (linear in d) cancel."""
    from claims.probes.cost import layer_macs
    ratio = layer_macs(arch, 512, 256) / layer_macs(arch, 256, 256)
    assert 3.9 <= ratio <= 4.0


def test_bench_report_claims_section_and_its_errors(tmp_path):
    store_url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    out = tmp_path / "c.html"
    assert invoke("claims", "--only", "C20,C33", "--store", store_url, "-o", str(out)).exit_code == 0
    report = tmp_path / "report.html"
    ok = invoke("report", "--claims", str(out.with_suffix(".json")), "-o", str(report))
    assert ok.exit_code == 0, ok.output
    page = report.read_text()
    assert 'id="claims"' in page and 'id="C20"' in page and 'id="C33"' in page and "<svg" in page
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    not_claims = tmp_path / "other.json"
    not_claims.write_text('{"runs": []}')
    old_version = tmp_path / "old.json"
    old_version.write_text('{"claims": [{"id": "C20", "verdict": "supported"}], "context": {}, "env": {}}')
    for args, message in ((("--claims", str(tmp_path / "missing.json")), "cannot read"),
                          (("--claims", str(bad_json)), "not JSON"),
                          (("--claims", str(not_claims)), "not a claims record"),
                          (("--claims", str(old_version)), "C20 lacks"),
                          ((), "at least one RUN")):
        r = invoke("report", *args, "-o", str(report))
        assert r.exit_code == 2 and message in r.stderr, (args, r.stderr)
