"""The claims' shared rule mechanisms, and C17/C23:

- a rule states the smallest effect it could have seen (``power``), shown in its detail; a central rule that
  fails without the power to see the claimed effect reads inconclusive, never contradicted;
- a claim may have one central rule per device; the verdict uses the one of the device measured on and names it;
- the exact paired-bootstrap gap and its detectable effect (claims.power) against a Monte-Carlo bootstrap and a
  simulation (outside truths);
- C17's probe on stored-experiment results (a powerless grid reads inconclusive), C23's CPU central rule.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from claims.catalog import load_catalog
from claims.merge import merge_runs
from claims.model import Evidence, Figure, Rule
from claims.power import clopper_pearson, detectable_gap, paired_gap
from claims.record import claims_document, read_verdicts
from claims.rules import centrals, combine, evaluate
from claims.verdicts import decide
from harness.contract.errors import BenchInputError

CATALOG = {c.id: c for c in load_catalog()}
GAP = Rule("gap", "at_least", "post fails more often", lo=0.01, central=True, power="gap_mde")


def verdict(gap: Figure, mde: Figure | None, why: str = "") -> tuple[str, str, object]:
    ev = Evidence(figures={"gap": gap, **({"gap_mde": mde} if mde else {})},
                  unavailable={} if mde else {"gap_mde": why})
    out = evaluate((GAP,), ev)
    return (*combine(out, "cpu"), out[0])


# -- the smallest detectable effect ---------------------------------------------------------------------
def test_a_rule_shows_its_power_in_the_detail():
    v, _, o = verdict(Figure(0.6, 0.4, 0.8), Figure(0.29, note="18 pairs"))
    assert v == "supported" and "smallest detectable effect 0.29 (18 pairs)" in o.detail
    assert o.power.value == 0.29 and not o.unpowered


def test_a_central_fail_without_power_is_inconclusive_not_contradicted():
    nothing = Figure(0.0, 0.0, 0.0)                     # no run of either placement failed: today's C17
    assert verdict(nothing, None, "")[0] == "inconclusive"
    v, reason, o = verdict(nothing, Figure(0.29))
    assert v == "inconclusive" and o.status == "unsure"
    assert "no power" in reason and "below the smallest the test could detect, 0.29" in reason
    # without a power the same figure contradicts (the old behaviour, still the rule for powerless rules)
    plain = Rule("gap", "at_least", "post fails more often", lo=0.01, central=True)
    assert combine(evaluate((plain,), Evidence(figures={"gap": nothing})))[0] == "contradicted"


def test_a_probe_that_reports_no_power_makes_the_fail_inconclusive_with_its_reason():
    v, reason, o = verdict(Figure(0.0, 0.0, 0.0), None, "2 pairs: no gap is detectable")
    assert v == "inconclusive" and "2 pairs: no gap is detectable" in reason and o.unpowered
    v, reason, _ = verdict(Figure(0.0, 0.0, 0.0), Figure(float("inf"), note="too few pairs"))
    assert v == "inconclusive" and "too few pairs" in reason


def test_an_effect_seen_clearly_the_other_way_still_contradicts():
    v, _, o = verdict(Figure(-0.5, -0.7, -0.3), Figure(0.29))         # pre-norm failed far more often
    assert v == "contradicted" and o.status == "fail" and "smallest detectable effect 0.29" in o.detail


def test_power_survives_the_json_document():
    rule_c17 = next(r for r in CATALOG["C17"].rules if r.central)
    ev = Evidence(figures={rule_c17.figure: Figure(0.0, 0.0, 0.0), rule_c17.power: Figure(0.29)})
    v = decide(CATALOG["C17"], ev)
    doc = json.loads(json.dumps(claims_document([v], {}, {}), allow_nan=False))
    head = next(r for r in doc["claims"][0]["rules"] if r["central"])
    assert head["power"]["value"] == 0.29 and "below the smallest" in head["unpowered"]
    (back,) = read_verdicts(doc, list(CATALOG.values()))
    assert back.outcomes[0].power.value == 0.29 and back.outcomes[0].unpowered == v.outcomes[0].unpowered


# -- one central rule per device ------------------------------------------------------------------------
CPU_HEAD = Rule("a", "at_least", "fast on the CPU", lo=1.2, central=True, device="cpu")
GPU_HEAD = Rule("b", "at_least", "fast on a GPU", lo=1.2, central=True, device="cuda")
SIDE = Rule("c", "at_least", "a side rule", lo=1.0)


def test_the_verdict_uses_the_central_rule_of_the_device_and_names_it():
    ev = Evidence(figures={"a": Figure(1.05, 1.0, 1.1), "b": Figure(2.0, 1.8, 2.2), "c": Figure(2.0)})
    cpu = evaluate((CPU_HEAD, GPU_HEAD, SIDE), ev, "cpu")
    assert [o.rule.figure for o in centrals(cpu, "cpu")] == ["a"]
    v, reason = combine(cpu, "cpu")
    assert v == "contradicted" and reason.startswith("central on cpu: fast on the CPU")
    gpu = evaluate((CPU_HEAD, GPU_HEAD, SIDE), ev, "cuda:0")
    v, reason = combine(gpu, "cuda:0")
    assert v == "partly supported" and reason.startswith("central on cuda:0: fast on a GPU")   # the CPU rule: n/a


def test_an_any_device_central_rule_serves_the_devices_without_their_own():
    anyd = Rule("a", "at_least", "anywhere", lo=1.0, central=True)
    ev = Evidence(figures={"a": Figure(2.0), "b": Figure(0.5)})
    assert combine(evaluate((anyd, GPU_HEAD), ev, "cpu"), "cpu")[0] == "partly supported"    # a decides on cpu
    v, reason = combine(evaluate((anyd, GPU_HEAD), ev, "cuda"), "cuda")
    assert v == "contradicted" and reason.startswith("central on cuda: fast on a GPU")
    with pytest.raises(ValueError, match="at most one central rule per device"):
        centrals(evaluate((CPU_HEAD, CPU_HEAD), ev, "cpu"), "cpu")


def test_merged_devices_whose_central_rules_disagree_read_partly_supported():
    claim = CATALOG["C23"]
    cpu_head = next(r for r in claim.rules if r.central and r.device == "cpu")
    gpu_head = next(r for r in claim.rules if r.central and r.device == "cuda")
    cpu = decide(claim, Evidence(figures={cpu_head.figure: Figure(1.02, 0.98, 1.06, processes=3)}), device="cpu")
    gpu = decide(claim, Evidence(figures={gpu_head.figure: Figure(2.0, 1.9, 2.1)}), device="cuda")
    assert cpu.verdict == "contradicted" and "central on cpu" in cpu.reason
    (m,) = merge_runs([cpu], [gpu])
    assert m.verdict == "partly supported" and "holds on cuda, not on cpu" in m.reason


@pytest.mark.parametrize("rules, ok", [
    ('{figure="qk_macs_n1000", test="is_true", says="x", central=true, device="cpu"},'
     '{figure="core_macs_n1000", test="is_true", says="y", central=true, device="cuda"}', None),
    ('{figure="qk_macs_n1000", test="is_true", says="x", central=true, device="cpu"},'
     '{figure="core_macs_n1000", test="is_true", says="y", central=true, device="cpu"}', "found 2 for cpu"),
    ('{figure="qk_macs_n1000", test="is_true", says="x", central=true, power="core_macs_n1000"}', None),
    ('{figure="qk_macs_n1000", test="is_true", says="x", central=true, power="made_up"}', "power 'made_up'"),
])
def test_catalog_accepts_one_central_rule_per_device_and_a_produced_power_figure(tmp_path, rules, ok):
    path = tmp_path / "claims.toml"
    path.write_text(f'[C01]\nsection="s"\ntitle="t"\nquote="q"\nwhere="w"\nprobe="qk_macs"\nrules=[{rules}]\n')
    if ok is None:
        assert load_catalog(path)[0].id == "C01"
    else:
        with pytest.raises(BenchInputError, match=ok):
            load_catalog(path)


# -- the exact paired bootstrap and its detectable effect -----------------------------------------------
def test_the_exact_bootstrap_interval_matches_resampling():
    a, b = [1] * 7 + [0] * 11, [0] * 16 + [1, 0]
    fig = paired_gap(a, b)
    diffs = np.array(a) - np.array(b)
    rng = np.random.default_rng(0)
    boot = diffs[rng.integers(0, len(diffs), (20_000, len(diffs)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    assert fig.value == pytest.approx(6 / 18) and fig.n == 18
    assert abs(fig.lo - lo) <= 1 / 18 + 1e-9 and abs(fig.hi - hi) <= 1 / 18 + 1e-9
    assert paired_gap([0] * 6, [0] * 6).bounds() == (0.0, 0.0)


def test_the_detectable_gap_is_what_a_simulation_of_the_test_detects():
    n = 18
    mde = detectable_gap(n, 0.0)
    assert 0.2 < mde < 0.4 and detectable_gap(30, 0.0) < mde < detectable_gap(n, 0.2)   # more pairs see less
    rng = np.random.default_rng(1)

    def detect_rate(gap: float) -> float:
        hits = [paired_gap(list(rng.random(n) < gap), [False] * n).lo > 0 for _ in range(400)]
        return sum(hits) / len(hits)
    assert detect_rate(mde) >= 0.72 and detect_rate(mde - 0.1) < 0.8             # 80 % power at the figure
    assert detectable_gap(2, 0.5) == float("inf")                                # two pairs see nothing


def test_clopper_pearson_is_the_exact_binomial_interval():
    f = clopper_pearson(0, 18)
    assert f.lo == 0 and f.hi == pytest.approx(1 - 0.025 ** (1 / 18))
    assert clopper_pearson(18, 18).lo == pytest.approx(0.025 ** (1 / 18))


# -- C17: the probe on stored results; a grid without power reads inconclusive --------------------------
class _Ctx:
    def __init__(self, result: dict) -> None:
        self.result = result

    def experiment(self, name: str) -> dict:
        return self.result


def _grid(post_fails: dict[float, int], runs: int = 6) -> dict:
    """A norm_placement grid: per learning rate, ``runs`` paired runs; post-norm fails in the first
    ``post_fails[lr]`` of them (never learned), pre-norm in none."""
    grid = {}
    for lr, k in post_fails.items():
        for placement, fails in (("post", k), ("pre", 0)):
            flags = [i < fails for i in range(runs)]
            grid[f"{placement}/lr{lr:g}"] = {"placement": placement, "lr": lr, "depth": 8, "warmup": 0.0,
                                             "diverged": [False] * runs, "never_learned": flags, "failed": flags}
    return grid


def test_c17_without_a_single_failure_reads_inconclusive_naming_its_power():
    from claims.probes.training import norm_placement
    ev = norm_placement(_Ctx({"grid": _grid({3e-3: 0, 1e-2: 0, 3e-2: 0})}))         # type: ignore[arg-type]
    assert ev.figures["failure_gap"].bounds() == (0.0, 0.0) and ev.figures["failure_gap"].n == 18
    assert ev.figures["failure_gap_detectable"].value == pytest.approx(detectable_gap(18, 0.0))
    v = decide(CATALOG["C17"], ev)
    assert v.verdict == "inconclusive"                      # today's code: "contradicted" from a powerless test
    assert "no power" in v.reason and "smallest the test could detect" in v.reason


def test_c17_post_norm_failing_at_high_learning_rates_passes_the_central_rule():
    from claims.probes.training import norm_placement
    ev = norm_placement(_Ctx({"grid": _grid({3e-3: 0, 1e-2: 6, 3e-2: 6})}))         # type: ignore[arg-type]
    gap = ev.figures["failure_gap"]
    assert gap.value == pytest.approx(12 / 18) and gap.lo > 0.3
    assert ev.figures["failure_rate_post"].value == pytest.approx(12 / 18) and ev.figures["failure_rate_pre"].hi < 0.2
    head = next(o for o in decide(CATALOG["C17"], ev).outcomes if o.rule.central)
    assert head.status == "pass" and "smallest detectable effect" in head.detail
    assert "lr 0.03: post 6/6" in " ".join(ev.notes)


# -- C23: a central rule on the CPU at matched MACs -----------------------------------------------------
def test_c23_has_a_central_rule_per_device_and_the_cpu_one_compares_same_macs():
    heads = {r.device: r for r in CATALOG["C23"].rules if r.central}
    assert set(heads) == {"cpu", "cuda"} and heads["cpu"].figure == "vits_over_resnet_rate"
    from harness.contract.suite import load_suite
    archs = {c.arch for c in load_suite("vit_vs_cnn", quick=True).cases}
    assert {"vit-s16", "resnet50"} <= archs                 # the run the CPU claims already measure has both


def test_c23_same_macs_figures_name_a_missing_model():
    from claims.probes.vision import same_macs_rates
    ev = Evidence()
    same_macs_rates(ev, {}, None, {})
    assert "vit-s16, resnet50" in ev.unavailable["vits_over_resnet_rate"]
    assert "batch > 1" in ev.unavailable["vits_over_resnet_rate_batch"]


def test_a_busy_reason_names_the_threads_that_shared_the_busy_core():
    from claims.probes import busy_reason
    from harness.contract.records import CaseRecord

    def rec(threads: float, busy: float) -> CaseRecord:
        return CaseRecord(f"k{threads}{busy}", "s", "l", "a", "ok", "",
                          metrics={"threads": threads, "load_busy": busy, "load_others_cores": 1.0 if busy else 0.1})
    assert busy_reason([rec(2, 0), rec(1, 0), None]) == ""
    two = busy_reason([rec(2, 1), rec(2, 0)])
    assert two.startswith("machine busy: other processes used up to 1.00 cores while 1 of the timed cases ran")
    assert "2 threads per case: --threads 1 keeps the timing off the busy core" in two
    assert "threads" not in busy_reason([rec(1, 1)])
