"""C28 reads the accuracy-vs-cost frontier (reports.pareto): quoted top-1 against counted MACs and measured
latency, dominance read at both ends of each latency interval — on synthetic records with a known answer."""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from claims.catalog import load_catalog
from claims.model import Figure, Rule
from claims.probes.vision import FRONTIER_FIGURES, convnext, edge, read_frontier
from claims.rules import check
from claims.verdicts import decide
from harness.contract.records import CaseRecord

TOP1 = {"convnext-tiny": 82.5, "vit-b16": 81.1, "resnet50": 76.1}
IS_TRUE = Rule("f", "is_true", "yes")


def test_is_true_on_an_interval_passes_only_when_true_at_both_ends():
    assert check(IS_TRUE, Figure(True, True, True)).status == "pass"
    assert check(IS_TRUE, Figure(False, False, False)).status == "fail"
    assert check(IS_TRUE, Figure(True, False, True)).status == "unsure"
    assert check(IS_TRUE, Figure(True)).status == "pass" and check(IS_TRUE, Figure(False)).status == "fail"


def test_frontier_on_counted_macs_is_a_plain_yes_or_no():
    macs = {"convnext-tiny": Figure(4.46e9), "vit-b16": Figure(17.6e9), "resnet50": Figure(4.1e9)}
    on, dom = read_frontier("convnext-tiny", "vit-b16", TOP1, macs)
    assert (on.value, on.lo, on.hi) == (True, True, True) and (dom.value, dom.lo, dom.hi) == (True, True, True)
    # a ViT as accurate with fewer MACs would dominate ConvNeXt-T: off the frontier, no dominance
    on, dom = read_frontier("convnext-tiny", "vit-b16", {**TOP1, "vit-b16": 83.0},
                            {**macs, "vit-b16": Figure(4.0e9)})
    assert not on.value and not on.hi and not dom.value


@pytest.mark.parametrize("vit_ratio, expected_dom, expected_on", [
    (Figure(1.8, 1.6, 2.0), "pass", "pass"),      # ViT-B/16 clearly slower: dominated
    (Figure(1.05, 0.9, 1.2), "unsure", "pass"),   # the interval straddles 1: undecided, never a pass
    (Figure(0.7, 0.6, 0.8), "fail", "pass"),      # ViT-B/16 clearly faster: no dominance; ConvNeXt-T stays on the
])                                                # frontier (the most accurate model is never dominated)
def test_latency_dominance_is_read_at_both_ends_of_the_interval(vit_ratio, expected_dom, expected_on):
    lat = {"convnext-tiny": Figure(1.0), "vit-b16": vit_ratio, "resnet50": Figure(0.5, 0.45, 0.55)}
    on, dom = read_frontier("convnext-tiny", "vit-b16", TOP1, lat)
    assert check(IS_TRUE, dom).status == expected_dom
    assert check(IS_TRUE, on).status == expected_on


def test_a_busy_timing_makes_the_frontier_figures_busy():
    lat = {"convnext-tiny": Figure(1.0), "vit-b16": Figure(1.8, 1.6, 2.0, busy="load 3"),
           "resnet50": Figure(0.5, 0.45, 0.55)}
    on, dom = read_frontier("convnext-tiny", "vit-b16", TOP1, lat)
    assert dom.busy == "load 3" and check(IS_TRUE, dom).status == "unsure"


def _case(arch: str, ms: float, macs: float, rng: random.Random) -> CaseRecord:
    rounds = (5,) * 8
    samples = tuple(ms / 1e3 * (1 + 0.02 * rng.random()) for _ in range(sum(rounds)))
    return CaseRecord(f"{arch}-b1", "vit_vs_cnn", arch, arch, "ok",
                      workload={"batch_size": 1, "img_size": 224, "dtype": "fp32", "device": "cpu"},
                      metrics={"median_ms": ms, "macs": macs, "params": 1e6}, samples_s=samples,
                      run_id="r1", rounds=rounds, group="g")


def _ctx(cases: list[CaseRecord]) -> SimpleNamespace:
    return SimpleNamespace(suite=lambda name, sets=None: (SimpleNamespace(id="r1"), cases))


def test_c28_on_synthetic_records_reads_the_frontier_and_says_top1_is_quoted():
    rng = random.Random(0)
    cases = [_case("convnext-tiny", 60.0, 4.46e9, rng), _case("vit-b16", 120.0, 17.56e9, rng),
             _case("resnet50", 40.0, 4.09e9, rng), _case("vit-s16", 45.0, 4.6e9, rng)]
    ev = convnext(_ctx(cases))                                       # type: ignore[arg-type]
    for f in FRONTIER_FIGURES:
        assert ev.figures[f].value is True, f
    assert "QUOTED" in ev.figures["convnext_dominates_vit_latency"].note
    assert "vit-b16 dominated by" not in ev.figures["convnext_dominates_vit_macs"].note   # names, not keys
    assert "ViT-B/16 dominated by ConvNeXt-T" in ev.figures["convnext_dominates_vit_macs"].note
    claim = next(c for c in load_catalog() if c.id == "C28")
    v = decide(claim, ev)
    frontier = [o for o in v.outcomes if o.rule.figure in FRONTIER_FIGURES]
    assert len(frontier) == 4 and all(o.status == "pass" for o in frontier)
    assert all("quoted" in o.rule.says for o in frontier)
    # ViT-B/16 as fast as ConvNeXt-T: the latency dominance is not claimed (fail or undecided, never a pass)
    even = [_case("convnext-tiny", 60.0, 4.46e9, rng), _case("vit-b16", 60.0, 17.56e9, rng),
            _case("resnet50", 40.0, 4.09e9, rng), _case("vit-s16", 45.0, 4.6e9, rng)]
    out = {o.rule.figure: o.status for o in decide(claim, convnext(_ctx(even))).outcomes}   # type: ignore[arg-type]
    assert out["convnext_dominates_vit_latency"] in ("fail", "unsure")
    assert out["convnext_dominates_vit_macs"] == "pass"


def test_c28_frontier_figures_are_unavailable_without_a_model():
    rng = random.Random(1)
    ev = convnext(_ctx([_case("convnext-tiny", 60.0, 4.46e9, rng), _case("vit-b16", 120.0, 17.56e9, rng)]))  # type: ignore[arg-type]
    for f in FRONTIER_FIGURES:
        assert f not in ev.figures and "resnet50" in ev.unavailable[f]


def test_a_yes_no_interval_is_written_without_brackets():
    assert Figure(True, True, True).text() == "yes"
    assert Figure(True, False, True).text() == "yes (at the interval's ends: no, yes)"
    assert Figure(1.5, 1.0, 2.0).text() == "1.5 [1, 2]"


def test_c27_efficient_cnns_on_the_latency_frontier():
    rng = random.Random(2)
    fast = [_case("mobilenet-v3-large", 10.0, 0.22e9, rng), _case("efficientnet-b0", 20.0, 0.39e9, rng),
            _case("resnet50", 40.0, 4.09e9, rng), _case("convnext-tiny", 60.0, 4.46e9, rng),
            _case("vit-b16", 120.0, 17.56e9, rng), _case("swin-t", 70.0, 4.5e9, rng)]
    f = edge(_ctx(fast)).figures["efficient_cnns_on_frontier_latency"]     # type: ignore[arg-type]
    assert check(IS_TRUE, f).status == "pass" and "QUOTED" in f.note
    # EfficientNet-B0 slower than ResNet-50 (quoted 77.7 % > 76.1 %) stays on it; slower than ConvNeXt-T
    # (82.5 %) it is dominated
    slow = fast[:1] + [_case("efficientnet-b0", 90.0, 0.39e9, rng)] + fast[2:]
    f = edge(_ctx(slow)).figures["efficient_cnns_on_frontier_latency"]     # type: ignore[arg-type]
    assert check(IS_TRUE, f).status == "fail"
    ev = edge(_ctx(fast[:2]))                                                 # type: ignore[arg-type]
    assert "efficient_cnns_on_frontier_latency" in ev.unavailable


def test_c27s_latencies_carry_the_busy_guard_and_the_processes_they_cover():
    """C27's central rule reads a stored latency: on a busy machine it decides nothing, and it decides only over
    an interval that covers 3 worker processes (the vit_vs_cnn run is measured so: claims/reads.toml)."""
    rng = random.Random(3)
    cases = [_case("mobilenet-v3-large", 10.0, 0.22e9, rng), _case("efficientnet-b0", 20.0, 0.39e9, rng),
             _case("vit-b16", 120.0, 17.56e9, rng)]
    claim = next(c for c in load_catalog() if c.id == "C27")
    head = next(r for r in claim.rules if r.central)
    assert head.figure == "effnet_latency_ms"

    def outcome(rows):
        return next(o for o in decide(claim, edge(_ctx(rows))).outcomes if o.rule.central)   # type: ignore[arg-type]
    over3 = [replace(c, metrics={**c.metrics, "n_processes": 3.0}) for c in cases]
    o = outcome(over3)
    assert o.status == "pass" and "(interval over 3 processes)" in o.detail
    assert outcome(cases).status == "unsure"                                  # one process decides nothing
    busy = [replace(c, metrics={**c.metrics, "load_busy": 1.0, "load_others_cores": 1.4}) for c in over3]
    o = outcome(busy)
    assert o.status == "unsure" and "machine busy" in o.detail
