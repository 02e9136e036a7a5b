"""The accuracy-vs-cost frontier (reports.frontier) on a fixed table with a known answer, the quoted top-1 of
torchvision's models (a published figure, labelled quoted with its source), and the report's frontier section."""
from __future__ import annotations

import pytest

from harness.contract.quoted import Quoted, sources
from harness.contract.records import CaseRecord, RunRecord, SuiteSpec
from reports.frontier import Point, dominated_rows, dominates, pareto

# cost (ms), top-1 (%): a hand-checked table
TABLE = [Point("A", 70.0, 1.0), Point("B", 75.0, 2.0), Point("C", 74.0, 3.0), Point("D", 80.0, 5.0),
         Point("E", 79.0, 6.0), Point("F", 80.0, 5.0), Point("G", 60.0, 1.0)]


def test_pareto_on_a_known_table():
    f = pareto(TABLE)
    assert [p.name for p in f.front] == ["A", "B", "D", "F"]       # D and F tie exactly: neither dominates
    assert {k: v.name for k, v in f.dominated.items()} == {"C": "B", "E": "D", "G": "A"}


def test_dominance_is_strict_in_one_coordinate():
    a, b = Point("a", 80.0, 5.0), Point("b", 80.0, 5.0)
    assert not dominates(a, b) and not dominates(b, a)
    assert dominates(Point("c", 80.0, 4.0), a) and dominates(Point("d", 81.0, 5.0), a)
    # higher is better (throughput): more images/s at the same accuracy dominates
    assert dominates(Point("t", 80.0, 200.0), Point("u", 80.0, 100.0), lower_is_better=False)
    f = pareto([Point("fast", 70.0, 300.0), Point("slow", 69.0, 100.0), Point("good", 80.0, 50.0)], False)
    assert [p.name for p in f.front] == ["fast", "good"] and f.dominated["slow"].name == "fast"


def test_dominator_named_is_the_most_accurate_that_dominates():
    pts = [Point("x", 70.0, 10.0), Point("y", 72.0, 5.0), Point("z", 75.0, 8.0)]
    assert pareto(pts).dominated["x"].name == "z"


def _rec(line: str, top1: float, ms: float, macs: float, batch: int = 1, ci: float = 0.05) -> CaseRecord:
    q = Quoted("quoted_top1", top1, f"torchvision test {line} meta (published, not measured here, eval crop 224)")
    return CaseRecord(line, "vision_frontier", line, f"torchvision:{line}", "ok", q.note(),
                      workload={"batch_size": batch, "img_size": 224, "dtype": "fp32", "device": "cpu"},
                      metrics={"quoted_top1": top1, "median_ms": ms, "macs": macs, "ci_low_ms": ms * (1 - ci),
                               "ci_high_ms": ms * (1 + ci),
                               "throughput_per_s": batch / (ms / 1e3)})


def test_dominated_rows_name_the_model_and_say_why():
    records = [_rec("vit_b_16", 81.07, 120.0, 17.6e9), _rec("convnext_tiny", 82.52, 60.0, 4.5e9),
               _rec("resnet18", 69.76, 15.0, 1.8e9)]
    rows = dominated_rows(records)
    assert [r["model"] for r in rows] == ["vit_b_16"]
    assert rows[0]["sentence"] == ("vit_b_16: dominated by convnext_tiny — slower and less accurate at batch 1 "
                                   "on cpu")
    assert [r["model"] for r in dominated_rows(records, "macs")] == ["vit_b_16"]
    noisy = [_rec("vit_b_16", 81.07, 120.0, 17.6e9, ci=0.5), _rec("convnext_tiny", 82.52, 60.0, 4.5e9, ci=0.5)]
    (row,) = dominated_rows(noisy)
    assert not row["clear"] and row["sentence"].endswith("(within the timing noise: the two 95% intervals overlap)")
    with pytest.raises(ValueError, match="one workload"):
        dominated_rows(records + [_rec("resnet50", 80.9, 50.0, 4.1e9, batch=8)])


def test_quoted_figure_round_trips_through_the_note_and_needs_a_source():
    q = Quoted("quoted_top1", 80.858, "torchvision X meta (published)")
    assert sources("MACs not counted (x); " + q.note()) == {"quoted_top1": "torchvision X meta (published)"}
    with pytest.raises(ValueError):
        Quoted("top1", 80.0, "somewhere")            # not named quoted_
    with pytest.raises(ValueError):
        Quoted("quoted_top1", 80.0, "")


def test_torchvision_models_carry_their_published_top1_offline():
    from architectures.torchvision_models import classification_models, quoted_top1
    from harness.contract import registry
    names = classification_models()
    quoted = {n: quoted_top1(n) for n in names}
    assert all(q is not None for q in quoted.values())          # torchvision publishes one for every classifier
    assert quoted["resnet18"].value == pytest.approx(69.758)    # torchvision's docs table, ResNet18 IMAGENET1K_V1
    assert quoted["vit_b_16"].value == pytest.approx(81.072)
    assert "published, not measured here" in quoted["resnet50"].source
    spec = registry.resolve("torchvision:convnext_tiny")
    assert spec.quoted[0].metric == "quoted_top1" and spec.quoted[0].value == pytest.approx(82.52)


def test_a_case_carries_the_quoted_top1_labelled_with_its_source():
    from harness.engine.runner import RunOptions, prepare
    from harness.contract.spec import Case, Workload
    case = Case("f", "sq", "torchvision:squeezenet1_1", (), Workload(img_size=32), ("flops",))
    rec = prepare(case, RunOptions())
    assert rec.metrics["quoted_top1"] == pytest.approx(58.178) and "macs" in rec.metrics
    assert "SqueezeNet1_1_Weights.IMAGENET1K_V1" in sources(rec.message)["quoted_top1"]
    # overridden to 10 classes, the model has no ImageNet-1k top-1: nothing is quoted
    ten = prepare(Case("f", "sq", "torchvision:squeezenet1_1", (("num_classes", 10),), Workload(img_size=32),
                       ("flops",)), RunOptions())
    assert "quoted_top1" not in ten.metrics and "quoted_top1" not in ten.message


def test_report_draws_the_frontier_and_names_the_dominated():
    from reports.html import render_report
    records = [_rec("vit_b_16", 81.07, 120.0, 17.6e9), _rec("convnext_tiny", 82.52, 60.0, 4.5e9),
               _rec("resnet18", 69.76, 15.0, 1.8e9)]
    run = RunRecord("r", "vision_frontier", True, "done", 3, "2026-11-25T00:00:00",
                    spec=SuiteSpec(lines={r.line: {} for r in records}))
    page = render_report([(run, records)])
    assert 'id="frontier-0"' in page
    assert "vit_b_16: dominated by convnext_tiny — slower and less accurate at batch 1 on cpu" in page
    assert "quoted" in page and "torchvision test resnet18 meta" in page
