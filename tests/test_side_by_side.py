"""Every line against the suite's reference, side by side (reports.side_by_side): the `reference` key of a suite
(validated where suites load), the table on hand-made records with a known answer, its place in `bench run`'s
summary, `bench show`, the report, the exports and `bench compare`, and a real `bench run` of three small models
(MODELS: a CNN reference, a ViT and a MobileNet at 32², batches 1 and 8) whose ViT ÷ CNN ratios must be those the one
comparison computes from the stored cases. (Every built-in suite's cases are checked in test_suites_builtin; the
vision models themselves in test_vision and test_vision_zoo.)"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import textwrap

import numpy as np
import pytest

from harness.analysis.comparison import compare_records
from harness.contract.errors import BenchInputError
from harness.contract.quoted import Quoted
from harness.contract.records import CaseRecord, RunRecord, SuiteSpec
from harness.contract.suite import load_suite
from harness.store.db import Store
from reports.side_by_side import (compares_models, figure_cell, notes, flat_vs_reference, ratio_cell, reference_line,
                                  side_by_side, vs_reference)
from reports.findings import findings
from reports.sentences import contrast_text, headline_contrasts
from tests.helpers import invoke, invoke_fresh

MiB = 1024 * 1024

SUITE = """\
name = "pair"
fixed = {{ arch = "resnet-micro", img_size = 32, dtype = "fp32", mode = "fwd", batch_size = 1 }}
{reference}
[lines]
narrow = {{ width = 8 }}
wide   = {{ width = 16 }}
"""


def _suite(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    return path


# -- the suite's `reference` --------------------------------------------------------------------------------------
def test_reference_names_a_line_else_the_first_line_is_used(tmp_path):
    named = load_suite(str(_suite(tmp_path, SUITE.format(reference='reference = "wide"'))))
    assert named.reference == named.spec.reference == "wide"
    default = load_suite(str(_suite(tmp_path, SUITE.format(reference=""))))
    assert default.reference == "" and default.spec.reference == ""
    assert SuiteSpec.from_dict(named.spec.to_dict()) == named.spec        # stored with the run, read back


@pytest.mark.parametrize("reference, message", [
    ('reference = "nope"', "reference: names no line: 'nope'; lines: narrow, wide"),
    ("reference = 3", "reference: must be a line's label"),
])
def test_a_reference_naming_no_line_is_bad_input(tmp_path, reference, message):
    path = _suite(tmp_path, SUITE.format(reference=reference))
    with pytest.raises(BenchInputError, match=re.escape(message)):
        load_suite(str(path))
    result = invoke("run", str(path), "--dry-run")
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in result.output


def test_a_reference_the_quick_lines_drop_is_bad_input_and_an_overlay_may_name_its_own(tmp_path):
    text = SUITE.format(reference='reference = "wide"') + '[quick]\nlines = ["narrow"]\n'
    path = _suite(tmp_path, text)
    load_suite(str(path))                               # the full run keeps "wide"
    with pytest.raises(BenchInputError, match=r"quick\.lines|'wide' is not among the lines this run keeps"):
        load_suite(str(path), quick=True)
    fixed = _suite(tmp_path, text.replace('lines = ["narrow"]', 'lines = ["narrow"]\nreference = "narrow"'))
    assert load_suite(str(fixed), quick=True).reference == "narrow"
    bad = _suite(tmp_path, text.replace('lines = ["narrow"]', 'lines = ["narrow"]\nreference = "gone"'))
    with pytest.raises(BenchInputError, match=r"quick\.reference: names no line: 'gone'"):
        load_suite(str(bad))


def test_under_dtypes_the_reference_is_its_line_in_the_first_dtype(tmp_path):
    text = SUITE.format(reference='reference = "wide"') + '[cuda]\ndtypes = ["bf16", "fp32"]\n'
    suite = load_suite(str(_suite(tmp_path, text)), sets={"device": "cuda"})
    assert suite.reference == "wide bf16" and "wide bf16" in suite.lines


def test_builtin_suites_of_different_models_name_their_reference():
    for name, ref in (("vit_vs_cnn", "resnet50"), ("vision_zoo", "resnet50"), ("vision_frontier", "resnet50"),
                      ("ssm_vs_attention", "attention sdpa"), ("rnn_vs_attention", "attention d=256"),
                      ("kv_cache", "MHA cache b=8"), ("generation", "MHA b=1")):
        for quick in (False, True):
            suite = load_suite(name, quick=quick)
            assert suite.reference == ref and ref in suite.lines, (name, quick)


# -- the table on hand-made records -----------------------------------------------------------------------------
def _samples(ms: float, n: int = 40, seed: int = 0) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    return tuple(float(x) for x in ms / 1e3 * (1 + 0.01 * rng.standard_normal(n)))


def _rec(line: str, arch: str, ms: float, peak_mib: float, macs: float, params: float, batch: int = 8,
         top1: float | None = None, status: str = "ok", seed: int = 0) -> CaseRecord:
    metrics = {"median_ms": ms, "peak_bytes": peak_mib * MiB, "macs": macs, "flops": 2 * macs, "params": params,
               "throughput_per_s": batch / (ms / 1e3)} if status == "ok" else {}
    message = ""
    if top1 is not None:
        metrics["quoted_top1"] = top1
        message = Quoted("quoted_top1", top1, f"test {arch} meta").note()
    samples = _samples(ms, seed=seed) if status == "ok" else ()
    return CaseRecord(f"{line}-{batch}", "zoo", line, arch, status, message if status == "ok" else "out of memory",
                      config={"name": arch, "img_size": 224},
                      workload={"batch_size": batch, "img_size": 224, "dtype": "fp32", "device": "cpu"},
                      metrics=metrics, samples_s=samples, rounds=(10, 10, 10, 10) if samples else ())


def _run(records, reference: str = "", peak: float | None = None) -> RunRecord:
    return RunRecord("r1", "zoo", True, "done", len(records), "2026-01-01",
                     options={"peak": {"cpu": {"matmul_flops_per_s": {"fp32": peak}}}} if peak else {},
                     spec=SuiteSpec(sweep={"batch_size": sorted({r.workload["batch_size"] for r in records})},
                                    lines={r.line: {} for r in records}, reference=reference))


ZOO = [_rec("resnet50", "resnet50", 100.0, 200, 33e9, 25.6e6, seed=1),
       _rec("vit-b16", "vit-b16", 150.0, 400, 140e9, 86.6e6, seed=2),
       _rec("mobilenet", "mobilenet", 40.0, 80, 1.7e9, 5.5e6, seed=3),
       _rec("swin-t", "swin-t", 160.0, 190, 36e9, 28.3e6, seed=4)]


def test_every_line_against_the_reference_sorted_by_time_with_the_best_marked():
    sbs = side_by_side(_run(ZOO, "resnet50", peak=1e13), ZOO)
    assert sbs is not None and sbs.reference == "resnet50" and sbs.why == "the suite's reference"
    (t,) = sbs.points
    assert t.point == (("batch_size", 8),)
    assert [r.line for r in t.rows] == ["mobilenet", "resnet50", "vit-b16", "swin-t"]      # by time
    vit, ref = t.row("vit-b16"), t.row("resnet50")
    c = compare_records(ZOO[0], ZOO[1])                  # the one comparison: ViT's time over ResNet's
    assert vit.ratios["median_ms"].value == c.ratio
    assert (vit.ratios["median_ms"].lo, vit.ratios["median_ms"].hi) == (c.ci_low, c.ci_high)
    assert vit.ratios["peak_bytes"].value == 2.0 and vit.ratios["macs"].value == 140e9 / 33e9
    assert vit.ratios["params"].value == 86.6e6 / 25.6e6
    assert ref.reference and ratio_cell(ref, "median_ms") == "1 (reference)" and ratio_cell(ref, "macs") == "1"
    assert ratio_cell(vit, "median_ms") == f"{c.ratio:.3g}× [{c.ci_low:.2g}, {c.ci_high:.2g}]"
    assert ratio_cell(vit, "peak_bytes") == "2×"
    mob = t.row("mobilenet")
    assert {"median_ms", "throughput_per_s", "peak_bytes", "macs", "params"} <= mob.best
    assert "peak_pct" in t.row("vit-b16").best          # the most FLOP/s: 280 GFLOP / 0.15 s of a 10 TFLOP/s peak
    assert figure_cell(vit, "peak_pct") == f"{100 * 2 * 140e9 / 0.150 / 1e13:.1f}"
    assert figure_cell(vit, "peak_bytes") == "400" and figure_cell(vit, "macs") == "140.00"
    # time and peak memory: mobilenet dominates every line; swin-t is lighter than resnet50 but slower
    assert {r.line: r.dominated_by for r in t.rows if r.dominated_by} == {
        "resnet50": "mobilenet", "vit-b16": "mobilenet", "swin-t": "mobilenet"}
    assert t.dominance == "time and peak memory"


def test_quoted_top1_decides_dominance_and_carries_its_source():
    recs = [_rec("a", "a", 100.0, 200, 4e9, 25e6, top1=80.0, seed=1),
            _rec("b", "b", 50.0, 300, 4e9, 25e6, top1=79.0, seed=2),
            _rec("c", "c", 120.0, 100, 4e9, 25e6, top1=78.0, seed=3)]
    (t,) = side_by_side(_run(recs), recs).points
    assert t.dominance == "time and quoted top-1"
    assert {r.line: r.dominated_by for r in t.rows if r.dominated_by} == {"c": "a"}   # slower and less accurate
    assert t.row("a").top1_source == "test a meta" and "quoted_top1" in t.row("a").best


def test_default_reference_is_the_first_line_and_failed_lines_come_last():
    recs = [ZOO[1], ZOO[0], _rec("big", "big", 0, 0, 0, 0, status="oom")]
    sbs = side_by_side(_run(recs), recs)
    assert reference_line(_run(recs), recs) == ("vit-b16", "the first line: the suite names no reference")
    (t,) = sbs.points
    assert [r.line for r in t.rows] == ["resnet50", "vit-b16", "big"] and not t.rows[-1].ok
    assert all(v is None for v in t.rows[-1].ratios.values())
    stale = _run(recs, "gone")                       # a stored reference the run does not hold: the first line
    assert reference_line(stale, recs)[0] == "vit-b16"


def test_ranks_on_the_cpu_are_named_in_the_notes_as_sharing_its_cores():
    ranked = dataclasses.replace(ZOO[1], workload={**ZOO[1].workload, "parallel": "ddp", "world_size": 2})
    recs = [ZOO[0], ranked]
    sbs = side_by_side(_run(recs), recs)
    (t,) = sbs.points
    said = [n for n in notes(sbs, t) if "share this machine's CPU cores" in n]
    assert said == ["vit-b16: the ranks share this machine's CPU cores; their times are for correctness, memory and "
                    "communication bytes, not speed"]
    plain = side_by_side(_run(ZOO[:2]), ZOO[:2])
    assert not any("CPU cores" in n for n in notes(plain, plain.points[0]))


def test_one_model_along_an_axis_has_no_side_by_side():
    recs = [_rec("resnet50", "resnet50", 10.0 * b, 100, 4e9 * b, 25e6, batch=b) for b in (1, 8)]
    recs = [CaseRecord(**{**r.__dict__, "case_key": f"k{i}"}) for i, r in enumerate(recs)]
    assert side_by_side(_run(recs), recs) is None
    one_knob = [_rec("b1", "resnet50", 10.0, 100, 4e9, 25e6, batch=1), _rec("b8", "resnet50", 60.0, 200, 32e9, 25e6)]
    assert not compares_models(one_knob, ())        # lines apart only in the workload (batch): no models compared


def test_contrasts_are_against_the_reference_never_one_arbitrary_pair():
    """Seven models differing in one config key: no sentence picks one pair — the table has each against the
    reference; a key where the reference has exactly one rival reads "RIVAL vs REFERENCE"."""
    sbs = side_by_side(_run(ZOO, "resnet50"), ZOO)
    f = findings(ZOO, run_id="r1", suite="zoo")
    assert f.contrasts and headline_contrasts(f, sbs.reference, True) == []
    two = [ZOO[0], ZOO[1]]
    (c,) = headline_contrasts(findings(two), "vit-b16", True)
    assert (c.a, c.b) == ("vit-b16", "resnet50")          # the reference as `a`: "resnet50 vs vit-b16"
    assert c.time.value == pytest.approx(compare_records(ZOO[0], ZOO[1]).ratio)    # a (vit) ÷ b (resnet)
    assert contrast_text(c, None).startswith("resnet50 vs vit-b16 (name resnet50 vs vit-b16): 1.5× [")
    assert c.time.comparison is not None and c.time.comparison.ratio == c.time.value


def test_exports_carry_the_ratios_to_the_reference():
    sbs = side_by_side(_run(ZOO, "resnet50"), ZOO)
    ratios = vs_reference(sbs)
    c = compare_records(ZOO[0], ZOO[1])
    assert ratios["vit-b16-8"]["line"] == "resnet50"
    assert ratios["vit-b16-8"]["median_ms"]["ratio"] == c.ratio and ratios["vit-b16-8"]["peak_bytes"] == {"ratio": 2.0}
    assert ratios["vit-b16-8"]["median_ms"]["level"] == c.level
    assert ratios["resnet50-8"]["median_ms"]["ratio"] == 1.0
    flat = flat_vs_reference(ratios["vit-b16-8"])
    assert flat["vs_ref.line"] == "resnet50" and flat["vs_ref.median_ms_ci_low"] == c.ci_low
    assert flat["vs_ref.macs"] == 140e9 / 33e9


# -- a real run: three small models against a reference ----------------------------------------------------------
MODELS = """\
name = "models"
metrics = ["latency", "memory", "flops"]
fixed = { img_size = 32, dtype = "fp32", mode = "fwd" }
sweep = { batch_size = [1, 8] }
reference = "resnet"
[lines]
resnet    = { arch = "resnet-micro" }
vit       = { arch = "vit-micro" }
mobilenet = { arch = "mobilenet-v3-small" }
"""


@pytest.fixture(scope="module")
def models_run(tmp_path_factory):
    """One `bench run --quick` of MODELS (worker process, store, summary, report): the same path as a built-in
    suite of models, on models small enough to measure in seconds."""
    tmp = tmp_path_factory.mktemp("models")
    suite = tmp / "models.toml"
    suite.write_text(MODELS)
    url = f"sqlite:///{tmp / 'results.sqlite'}"
    result = invoke_fresh("run", str(suite), "--quick", "--store", url, "--no-calibrate",
                          "--timeout", "600", "-o", str(tmp / "run.html"))     # a loaded machine: no case times out
    (tmp / "summary.txt").write_text(result.stdout)    # kept for a failure's reading
    assert result.exit_code == 0, result.output
    return tmp, url, result


def _row(text: str, table_at: str, line: str) -> list[str]:
    """The cells of ``line``'s row in the side-by-side table at ``table_at`` of a printed summary."""
    block = text.split(f"side by side at {table_at}:", 1)[1]
    row = next(s for s in block.splitlines() if re.match(rf"\s+{re.escape(line)}( †)?\s{{2,}}", s))
    return re.split(r"\s{2,}", row.strip())


def test_run_summary_leads_with_the_ratios_the_comparison_computes(models_run):
    tmp, url, result = models_run
    out = result.stdout
    fits = re.search(r"^  vit: ", out, re.M)      # how the line scales with the batch (or why it has no fit)
    assert fits, out
    assert out.index("side by side at batch_size=1") < out.index("side by side at batch_size=8") < fits.start(), out
    assert "reference: resnet (the suite's reference)" in out
    assert not re.search(r"^  (at b=\d+, )?\S+ vs \S+ \(", out, re.M), out       # no pair picked from the three
    store = Store(url, create=False)
    run = store.get_run("latest")
    records = store.records(run.id)
    for batch in (1, 8):
        vit = next(r for r in records if r.line == "vit" and r.workload["batch_size"] == batch)
        res = next(r for r in records if r.line == "resnet" and r.workload["batch_size"] == batch)
        c = compare_records(res, vit)                  # the ViT over the CNN reference, from the stored cases
        cells = _row(out, f"batch_size={batch}", "vit")
        assert f"{c.ratio:.3g}× [{c.ci_low:.2g}, {c.ci_high:.2g}]" in cells
        assert f"{vit.metric('peak_bytes') / res.metric('peak_bytes'):.3g}×" in cells
        assert f"{vit.metric('macs') / res.metric('macs'):.3g}×" in cells
        assert f"{vit.metric('params') / res.metric('params'):.3g}×" in cells
        assert "1 (reference)" in _row(out, f"batch_size={batch}", "resnet")
    html = (tmp / "run.html").read_text()             # -o wrote the report, which leads with the same table
    assert html.index("side by side at batch_size=1") < html.index('class="findings"')
    assert f"{c.ratio:.3g}× [{c.ci_low:.2g}, {c.ci_high:.2g}]" in html


def test_show_export_and_compare_hold_the_same_table(models_run):
    tmp, url, run_result = models_run
    shown = invoke("show", "latest", "--store", url)
    assert shown.exit_code == 0
    assert _row(shown.stdout, "batch_size=8", "vit") == _row(run_result.stdout, "batch_size=8", "vit")
    store = Store(url, create=False)
    run = store.get_run("latest")
    records = store.records(run.id)
    vit = next(r for r in records if r.line == "vit" and r.workload["batch_size"] == 8)
    res = next(r for r in records if r.line == "resnet" and r.workload["batch_size"] == 8)
    c = compare_records(res, vit)
    cases = json.loads(invoke("export", "latest", "--format", "json", "--store", url).stdout)
    exported = next(x for x in cases if x["case_key"] == vit.case_key)["vs_reference"]
    assert exported["line"] == "resnet" and exported["median_ms"]["ratio"] == c.ratio
    assert exported["macs"]["ratio"] == vit.metric("macs") / res.metric("macs")
    rows = list(csv.DictReader(io.StringIO(invoke("export", "latest", "--format", "csv", "--store", url).stdout)))
    row = next(r for r in rows if r["case_key"] == vit.case_key)
    assert float(row["vs_ref.median_ms"]) == pytest.approx(c.ratio, rel=1e-12)
    assert float(row["vs_ref.peak_bytes"]) == pytest.approx(vit.metric("peak_bytes") / res.metric("peak_bytes"))
    compared = invoke("compare", run.id, run.id, "--store", url)
    assert compared.exit_code == 0 and f"run A {run.id}:" in compared.stdout
    assert _row(compared.stdout, "batch_size=8", "vit") == _row(run_result.stdout, "batch_size=8", "vit")
