"""Claims on a GPU without one: C23's best-rate figures and C08's flash memory ratio from records built here,
the merge of a CPU verdict set with a CUDA one (each rule naming the device that decided it, a rule the CPU
could not decide read from the GPU, a disagreement shown), the round trip through the JSON document, and the
one-line errors of ``bench claims --device cuda`` / ``--merge``."""
from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from claims.catalog import load_catalog
from claims.merge import merge_outcome, merge_runs
from claims.model import Evidence, Figure, Outcome
from claims.probes.cost import flash_memory_ratio
from claims.probes.vision import COMPILED, GPU_RATE_SUITE, gpu_rates
from claims.record import claims_document, read_verdicts
from claims.verdicts import decide
from harness.contract.errors import BenchInputError
from harness.executors.base import interleave_groups
from harness.contract.records import RunRecord
from harness.contract.suite import load_suite
from reports.claims_view import claims_section, markdown_table
from tests.helpers import invoke

CATALOG = {c.id: c for c in load_catalog()}
GFLOPS = {"vit-b16": 35.1e9, "resnet50": 8.2e9}            # forward FLOPs per image (2 per MAC)


# -- C23 on a GPU: each model's best batch, timed side by side --------------------------------------------
def rate_rows(ms: dict[tuple[str, int], float], compile_mode: str) -> list:
    """Records of the GPU rate suite (quick) as if measured on a GPU in 3 worker processes (claims/reads.toml):
    6 rounds of 2 samples, 2 rounds a process, one group."""
    suite = load_suite(GPU_RATE_SUITE, quick=True, sets={"device": "cuda", "threads": 1, "compile": compile_mode})
    rows = []
    for i, case in enumerate(suite.cases):
        b = case.workload.batch_size
        t = ms[(case.arch, b)] / 1e3
        samples = [t * (1 + 0.01 * ((i + r) % 3 - 1)) for r in range(6) for _ in range(2)]   # a little drift
        rows.append(replace(case.record("ok", metrics={"median_ms": t * 1e3, "flops": GFLOPS[case.arch] * b,
                                                       "n_processes": 3.0}, samples_s=samples),
                            run_id=f"run-{compile_mode}", group="g", rounds=(2,) * 6))
    return rows


class GpuContext:
    """What gpu_rates asks of a Context: its device and suite runs (here built, not measured)."""

    def __init__(self, device: str, runs: dict[str, list]) -> None:
        self.device, self.runs, self.asked = device, runs, []

    def suite(self, name: str, sets: dict | None = None):
        self.asked.append((name, dict(sets or {})))
        mode = (sets or {})["compile"]
        return RunRecord(f"run-{mode}", "claims_gpu_rate", True, "done", 6, ""), self.runs[mode]


def test_the_gpu_rate_suite_is_one_side_by_side_group_in_bf16():
    for quick in (False, True):
        suite = load_suite(GPU_RATE_SUITE, quick=quick, sets={"device": "cuda", "compile": COMPILED})
        assert [len(g) for g in interleave_groups(suite.cases)] == [len(suite.cases)]
        assert {c.arch for c in suite.cases} == {"vit-b16", "resnet50"}
        assert {c.workload.dtype for c in suite.cases} == {"bf16"}
        assert len({c.workload.batch_size for c in suite.cases}) >= (2 if quick else 3)
        assert 1 not in {c.workload.batch_size for c in suite.cases}    # launch-bound: never a best rate


def test_gpu_rates_take_each_models_best_batch_and_name_the_mode():
    # eager: ViT best at batch 256, ResNet best at batch 64 (launch-bound below, slower per image above)
    eager = {("vit-b16", 1): 5.0, ("vit-b16", 64): 8.0, ("vit-b16", 256): 25.0,
             ("resnet50", 1): 6.8, ("resnet50", 64): 10.0, ("resnet50", 256): 60.0}
    compiled = {k: v / 2 if k[0] == "resnet50" else v for k, v in eager.items()}
    ctx = GpuContext("cuda", {"none": rate_rows(eager, "none"), COMPILED: rate_rows(compiled, COMPILED)})
    ev = Evidence()
    gpu_rates(ctx, ev)                                                          # type: ignore[arg-type]
    assert [s["compile"] for _, s in ctx.asked] == ["none", COMPILED]
    vit_best = GFLOPS["vit-b16"] * 256 / 25.0                                 # FLOP/ms at ViT's best batch (256)
    best = {compiled: vit_best / (GFLOPS["resnet50"] * 64 / (5.0 if compiled else 10.0)) for compiled in (False, True)}
    head, eager_fig = ev.figures["gpu_vit_over_resnet_rate"], ev.figures["gpu_vit_over_resnet_rate_eager"]
    assert head.value == pytest.approx(best[True], rel=0.02) and head.mode == f"compiled ({COMPILED})"
    assert eager_fig.value == pytest.approx(best[False], rel=0.02) and eager_fig.mode == "eager"
    assert head.has_interval and "timed side by side (3 paired processes)" in head.note      # paired, not two medians
    assert head.processes == 3
    assert "batch 256" in head.note and "batch 64" in head.note
    assert ev.figures["gpu_vit_tflops_eager"].value == pytest.approx(GFLOPS["vit-b16"] * 256 / 25e-3 / 1e12)
    outcome = decide(CATALOG["C23"], ev, device="cuda").outcomes[-1]
    assert outcome.rule.central and outcome.status == "pass" and outcome.mode == f"compiled ({COMPILED})"


def test_gpu_rates_missing_a_model_or_off_a_gpu_say_why():
    ev = Evidence()
    gpu_rates(GpuContext("cpu", {}), ev)                                        # type: ignore[arg-type]
    assert not ev.figures and "needs a GPU" in ev.unavailable["gpu_vit_over_resnet_rate"]
    rows = [r for r in rate_rows({(a, b): 1.0 for a in GFLOPS for b in (1, 64, 256)}, COMPILED) if r.arch != "resnet50"]
    ev = Evidence()
    gpu_rates(GpuContext("cuda", {"none": rate_rows({(a, b): 1.0 for a in GFLOPS for b in (1, 64, 256)}, "none"),
                                  COMPILED: rows}), ev)                         # type: ignore[arg-type]
    assert "gpu_vit_over_resnet_rate_eager" in ev.figures
    assert "no ok timed case of resnet50" in ev.unavailable["gpu_vit_over_resnet_rate"]


def test_flash_memory_ratio_at_the_largest_n_both_ran_naming_the_backend():
    suite = load_suite("attention_core", quick=True, sets={"device": "cuda", "dtype": "bf16", "threads": 1})
    rows = []
    for c in suite.cases:
        n, eager = c.workload.seq_len, dict(c.overrides).get("attn_impl") == "eager"
        if eager and n == 4096:
            rows.append(c.record("oom", config=dict(c.overrides)))             # the largest n: eager ran out
            continue
        peak = 8 * n * n * 2 * 2 if eager else 4 * 8 * n * 64 * 2              # scores + softmax vs q, k, v, out
        rows.append(c.record("ok", config=dict(c.overrides), metrics={"peak_bytes": float(peak),
                                                                      "sdpa_backend": "flash"}))
    fig = flash_memory_ratio(rows)
    n = 3072
    assert fig.value == pytest.approx((8 * n * n * 4) / (4 * 8 * n * 64 * 2))
    assert "n=3072" in fig.note and "flash kernel" in fig.note and "bf16" in fig.note


# -- merging a CPU verdict set with a CUDA one -------------------------------------------------------------
def cpu_c23():
    ev = Evidence(figures={"vit_over_resnet_rate": Figure(1.5, 1.4, 1.6), "vit_over_resnet_rate_batch": Figure(1.3),
                           "vits_over_resnet_rate": Figure(1.4, 1.3, 1.5, processes=3),
                           "vits_over_resnet_rate_batch": Figure(1.3),
                           "swin_over_resnet_latency": Figure(0.8), "vit_peak_share": Figure(0.2)},
                  unavailable={"gpu_vit_over_resnet_rate": "needs a GPU"}, notes=["cpu note"], sources=["cpu-run"])
    return decide(CATALOG["C23"], ev, device="cpu")


def cuda_c23(value: float = 2.1):
    ev = Evidence(figures={"gpu_vit_over_resnet_rate": Figure(value, value * 0.9, value * 1.1,
                                                              mode=f"compiled ({COMPILED})"),
                           "gpu_vit_over_resnet_rate_eager": Figure(5.0, mode="eager"),
                           "vit_over_resnet_rate": Figure(0.7)},               # a GPU batch-1 figure: a CPU rule's
                  notes=["gpu note"], sources=["gpu-run"])
    return decide(CATALOG["C23"], ev, device="cuda")


def c21(device: str, params: float):
    """C21 with its rules of any device decided (params), its GPU latency rules measured only on cuda."""
    figs = {"resnet50_params_m": Figure(params), "resnet50_gmacs": Figure(4.1), "effnet_params_m": Figure(5.3),
            "effnet_gmacs": Figure(0.4), "vit_params_m": Figure(86.0), "vit_gmacs": Figure(17.6)}
    if device == "cuda":
        figs |= {"vit_over_resnet_latency": Figure(0.74, 0.7, 0.78), "resnet_over_effnet_latency": Figure(1.6, 1.55, 1.65)}
    return decide(CATALOG["C21"], Evidence(figures=figs), device=device)


def test_a_rule_decided_on_cuda_replaces_unavailable_and_names_its_device():
    cpu, gpu = cpu_c23(), cuda_c23()
    assert cpu.verdict == "partly supported" and gpu.verdict == "partly supported"  # each alone misses rules
    (m,) = merge_runs([cpu], [gpu])
    assert m.verdict == "supported" and m.device == "cpu + cuda"
    by = {o.rule.figure: o for o in m.outcomes}
    assert by["gpu_vit_over_resnet_rate"].device == "cuda" and by["gpu_vit_over_resnet_rate"].status == "pass"
    assert by["gpu_vit_over_resnet_rate"].mode == f"compiled ({COMPILED})"
    assert all(by[f].device == "cpu" for f in ("vit_over_resnet_rate", "swin_over_resnet_latency"))
    assert m.mode == f"eager, compiled ({COMPILED})"
    assert m.evidence.figures["vit_over_resnet_rate@cuda"].value == 0.7          # the GPU's figure kept, renamed
    assert "cuda: gpu note" in m.evidence.notes and m.evidence.sources == ["cpu-run", "gpu-run"]
    assert merge_runs([gpu], [cpu])[0].outcomes == m.outcomes                    # the CPU is home either way
    (failing,) = merge_runs([cpu], [cuda_c23(0.9)])
    assert failing.verdict == "partly supported"               # each device's central rule decides: split
    assert "holds on cpu, not on cuda" in failing.reason


def test_devices_that_disagree_on_a_rule_show_it_as_undecided_with_both_outcomes():
    (m,) = merge_runs([c21("cpu", 25.6)], [c21("cuda", 40.0)])                  # params differ: pass vs fail
    torn = next(o for o in m.outcomes if o.rule.figure == "resnet50_params_m")
    assert torn.conflict and torn.status == "unsure" and torn.device == "cpu"
    assert "on cpu:" in torn.detail and "on cuda:" in torn.detail and "(fail)" in torn.detail
    assert [o.device for o in torn.others] == ["cuda"]
    assert "devices disagree" in m.reason and m.verdict == "partly supported"
    lat = next(o for o in m.outcomes if o.rule.figure == "vit_over_resnet_latency")
    assert lat.device == "cuda" and lat.status == "fail"                        # launch-bound H100: ViT ≈ ResNet
    doc = json.loads(json.dumps(claims_document([m], {}, {}), default=str))
    table = markdown_table(doc)
    assert "⚠ resnet50_params_m 25.6 ?" in table and "(cuda: 40 ✗)" in table and "vit_over_resnet_latency 0.74" in table
    assert "@cuda" in table
    html_rules = claims_section(doc, heading=3)["claims"][0]["rules"]
    assert html_rules[0]["detail"].startswith("⚠ devices disagree")
    assert next(r for r in html_rules if r["figure"] == "vit_over_resnet_latency")["detail"].startswith("[cuda, eager]")


def test_merge_outcome_keeps_agreeing_devices_and_never_invents_a_decision():
    rule = CATALOG["C21"].rules[0]
    a, b = Outcome(rule, "pass", "x", device="cpu"), Outcome(rule, "pass", "y", device="cuda")
    assert merge_outcome([a, b]) == replace(a, others=(b,))
    none = merge_outcome([Outcome(rule, "unavailable", "no cpu"), Outcome(rule, "unavailable", "no gpu")])
    assert none.status == "unavailable" and none.detail == "no cpu; no gpu"
    unsure = merge_outcome([Outcome(rule, "unsure", "straddles", device="cpu"), b])
    assert unsure.status == "unsure" and not unsure.conflict                    # undecided is no disagreement


def test_verdicts_round_trip_through_the_document_and_merge_the_same():
    cpu_doc = json.loads(json.dumps(claims_document([cpu_c23(), c21("cpu", 25.6)], {}, {}), default=str))
    gpu_doc = json.loads(json.dumps(claims_document([cuda_c23(), c21("cuda", 25.6)], {}, {}), default=str))
    catalog = list(CATALOG.values())
    from_docs = merge_runs(read_verdicts(cpu_doc, catalog), read_verdicts(gpu_doc, catalog))
    direct = merge_runs([cpu_c23(), c21("cpu", 25.6)], [cuda_c23(), c21("cuda", 25.6)])
    assert [(v.claim.id, v.verdict, v.device, v.mode) for v in from_docs] == \
           [(v.claim.id, v.verdict, v.device, v.mode) for v in direct]
    assert [[(o.status, o.device, o.mode) for o in v.outcomes] for v in from_docs] == \
           [[(o.status, o.device, o.mode) for o in v.outcomes] for v in direct]
    cpu_doc["claims"][0]["rules"][0]["figure"] = "renamed_figure"
    with pytest.raises(BenchInputError, match="other code"):
        read_verdicts(cpu_doc, catalog)


# -- the command -------------------------------------------------------------------------------------------
def write_doc(path, verdicts) -> str:
    path.write_text(json.dumps(claims_document(verdicts, {"hard": {}, "soft": {}}, {"used": ["gpu-run"]}),
                               default=str))
    return str(path)


def test_bench_claims_merges_another_devices_verdicts(tmp_path):
    gpu = write_doc(tmp_path / "gpu.json", [cuda_c23()])
    out, md = tmp_path / "m.html", tmp_path / "m.md"
    r = invoke("claims", "--only", "C20", "--merge", gpu, "--store", f"sqlite:///{tmp_path / 's.sqlite'}",
               "-o", str(out), "--markdown", str(md))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.with_suffix(".json").read_text())
    by = {c["id"]: c for c in doc["claims"]}
    assert set(by) == {"C20", "C23"} and by["C20"]["device"] == "cpu" and by["C23"]["device"] == "cuda"
    head = next(o for o in by["C23"]["rules"] if o["central"] and o["device"] == "cuda")
    assert head["decided_on"] == "cuda" and head["mode"] == f"compiled ({COMPILED})" and head["status"] == "pass"
    assert doc["context"]["merged"]["path"] == gpu and "gpu-run" in doc["context"]["used"]
    assert "merged with" in r.stderr and "| C23 |" in md.read_text()


@pytest.mark.parametrize("args, message", [
    (("--device", "tpu"), "'tpu' is not a device"),
    (("--device", "cuda", "--only", "C07"), "C07 has no rule for a GPU; --device cuda decides C08, C21, C23"),
    (("--merge", "{tmp}/missing.json"), "cannot read"),
    (("--merge", "{tmp}/bad.json"), "is not JSON"),
    (("--merge", "{tmp}/other.json"), "not a claims record"),
    (("--merge", "{tmp}/empty.json"), "holds no claims: nothing to merge"),
    (("--merge", "{tmp}/cpu.json"), "holds verdicts decided on cpu, as this run's"),
])
def test_bench_claims_device_and_merge_errors_are_one_line_exit_2(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"runs": []}')
    (tmp_path / "empty.json").write_text('{"claims": [], "context": {}, "env": {}}')
    write_doc(tmp_path / "cpu.json", [cpu_c23()])
    r = invoke("claims", "--only", "C20", *[a.format(tmp=tmp_path) for a in args],
               "--store", f"sqlite:///{tmp_path / 's.sqlite'}", "-o", str(tmp_path / "c.html"))
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()                                   # nothing measured or written


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_bench_claims_device_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    r = invoke("claims", "--device", "cuda", "--store", f"sqlite:///{tmp_path / 's.sqlite'}",
               "-o", str(tmp_path / "c.html"))
    assert r.exit_code == 2 and "--device: CUDA is not available here" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.sqlite").exists()


def test_bench_claims_device_cuda_lists_the_gpu_claims():
    r = invoke("claims", "--device", "cuda", "--list")
    assert r.exit_code == 0 and [line.split()[0] for line in r.stdout.splitlines()] == ["C08", "C21", "C23"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_claims_on_a_gpu_decides_the_gpu_rules(tmp_path):
    """On the GPU machine: every cuda rule of C08, C21 and C23 is decided there, naming cuda and its mode."""
    out = tmp_path / "g.html"
    r = invoke("claims", "--device", "cuda", "--quick", "--store", f"sqlite:///{tmp_path / 's.sqlite'}", "-o", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.with_suffix(".json").read_text())
    gpu_rules = [o for c in doc["claims"] for o in c["rules"] if o["device"] == "cuda"]
    assert len(gpu_rules) == 4 and all(o["status"] != "unavailable" for o in gpu_rules), gpu_rules
    assert all(o["decided_on"].startswith("cuda") for o in gpu_rules)
    head23 = next(o for c in doc["claims"] if c["id"] == "C23" for o in c["rules"] if o["central"])
    assert head23["mode"] == f"compiled ({COMPILED})" and "timed side by side" in head23["measured"]["note"]


# -- scripts/gpu-check: argument handling, the dry run, a failing and a stuck step ---------------------------
GPU_CHECK = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check"


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GPU_CHECK), *args], capture_output=True, text=True, timeout=120)


def load_gpu_check():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(GPU_CHECK))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    sys.modules["gpu_check"] = module                  # its dataclasses look their module up
    try:
        loader.exec_module(module)
    finally:
        del sys.modules["gpu_check"]
    return module


def test_gpu_check_is_executable_and_its_dry_run_lists_every_step(tmp_path):
    assert os.access(GPU_CHECK, os.X_OK)
    out = tmp_path / "out"
    r = gpu_check("--dry-run", "--quick", str(out))
    assert r.returncode == 0, r.stderr
    steps = [line.split(" ", 2)[1] for line in r.stdout.splitlines()[1:]]
    assert steps == ["setup", "gpu-tests", "claims", "vit_vs_cnn", "attention_scaling", "report"]
    assert "-m pytest -m gpu" in r.stdout and "claims --device cuda --quick" in r.stdout
    assert "run suites/vit_vs_cnn --device cuda" in r.stdout and "run suites/attention_scaling --device cuda" in r.stdout
    assert f"--store sqlite:///{out.resolve() / 'gpu.sqlite'}" in r.stdout and "report.html" in r.stdout
    assert not out.exists()                                                    # a dry run writes nothing
    cpu = tmp_path / "cpu.json"
    cpu.write_text("{}")
    assert f"--merge {cpu.resolve()}" in gpu_check("--dry-run", "--merge", str(cpu), str(out)).stdout


@pytest.mark.parametrize("args, message", [
    ((), "required: OUT_DIR"),
    (("--budget", "10", "{tmp}/o"), "--budget must be at least 60"),
    (("--merge", "{tmp}/none.json", "{tmp}/o"), "no such file"),
    (("{tmp}/afile",), "is not a directory"),
])
def test_gpu_check_bad_arguments_exit_2(tmp_path, args, message):
    (tmp_path / "afile").write_text("")
    r = gpu_check(*[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2 and message in r.stderr and not (tmp_path / "o").exists()


FAKE_PYTHON = """#!{python}
import json, pathlib, sys
state = pathlib.Path(__file__).with_name("runs.json")          # the fake store: {{run id: [suite, ok cases]}}
runs = json.loads(state.read_text()) if state.exists() else {{}}
args = sys.argv[1:]
if "claims" in args:
    print("broken", file=sys.stderr); sys.exit(3)
if args[:2] == ["-m", "pytest"]:
    print("{tests}"); sys.exit(0)
if args[:1] == ["-c"] and "Store" in args[1]:
    print(json.dumps(runs)); sys.exit(0)
if "run" in args:
    suite = args[args.index("run") + 1].split("/")[-1]
    runs["r%d" % len(runs)] = [suite, {ok}.get(suite, 0)]
    state.write_text(json.dumps(runs))
print("ran", *args)
"""


def fake_python(tmp_path, tests="3 passed in 1.00s", ok=None):
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, tests=tests, ok=ok or {}))
    fake.chmod(0o755)
    return fake


def test_gpu_check_runs_every_step_and_exits_1_when_one_fails(tmp_path):
    # `claims` fails; attention_scaling exits 0 with no ok case: a failure too (it measured nothing)
    fake = fake_python(tmp_path, ok={"vit_vs_cnn": 4, "attention_scaling": 0})
    out = tmp_path / "out"
    r = gpu_check("--python", str(fake), "--budget", "120", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    assert "claims" in summary and "failed (rc 3)" in summary
    assert "failed (measured nothing: the attention_scaling run has no ok case)" in summary
    assert summary.count("  ok  ") == 4                                         # the others still ran
    assert all(re.search(rf"^{name} +\d+\.\d s ", summary, re.M)                  # each step's seconds
               for name in ("setup", "gpu-tests", "claims", "vit_vs_cnn", "attention_scaling", "report"))
    assert "broken" in (out / "03-claims.log").read_text()
    assert "run suites/attention_scaling --device cuda" in (out / "05-attention_scaling.log").read_text()


def test_gpu_check_fails_a_step_that_measured_nothing(tmp_path):
    """Every step exits 0, but the tests all skipped and no suite stored an ok case: exit 1, no step "ok"
    except setup and report (the issue 26 H100 run reported "ok" for claims that measured nothing)."""
    fake = fake_python(tmp_path, tests="25 skipped in 0.40s")
    out = tmp_path / "out"
    r = gpu_check("--python", str(fake), "--budget", "120", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    assert "failed (measured nothing: no test passed (25 skipped in 0.40s))" in summary
    assert "failed (measured nothing: the vit_vs_cnn run has no ok case)" in summary
    assert summary.count("  ok  ") == 2 and summary.count("failed (rc 3)") == 1    # setup, report; claims broke


def test_gpu_check_claims_that_decided_nothing_on_cuda_fail(tmp_path):
    m = load_gpu_check()
    doc = tmp_path / "claims.json"
    undecided = {"status": "unavailable", "decided_on": None}
    cpu = {"status": "pass", "decided_on": "cpu"}
    doc.write_text(json.dumps({"claims": [{"id": "C08", "verdict": "inconclusive", "rules": [undecided]},
                                          {"id": "C21", "verdict": "supported", "rules": [cpu, undecided]}]}))
    assert m.claims_measured(doc).startswith("measured nothing: no rule decided on cuda (2 claims, 1 inconclusive)")
    doc.write_text(json.dumps({"claims": [{"id": "C08", "verdict": "inconclusive",
                                           "rules": [undecided, {"status": "fail", "decided_on": "cuda:0"}]}]}))
    assert m.claims_measured(doc) == ""
    assert m.claims_measured(tmp_path / "none.json").startswith("measured nothing: no none.json")
    log = tmp_path / "t.log"
    log.write_text("....\n4 passed, 2 skipped in 3.1s\n")
    assert m.tests_measured(log) == ""
    log.write_text("no tests ran in 0.01s\n")
    assert m.tests_measured(log).startswith("measured nothing")


def test_gpu_check_stops_a_step_past_its_timeout(tmp_path):
    m = load_gpu_check()
    t0 = time.monotonic()
    r = m.run_step(m.Step("stuck", ("sleep", "60"), 1.0), 1.0, tmp_path / "stuck.log", dict(os.environ))
    assert r.status == "timeout after 1 s" and time.monotonic() - t0 < 60     # stopped: not the sleep's 60 s


def test_vision_probes_read_one_dtype_of_a_run_with_several():
    from claims.probes.vision import one_dtype
    suite = load_suite("vit_vs_cnn", sets={"device": "cuda", "threads": 1})
    bf16 = [c.record("ok") for c in suite.cases]
    assert {r.value("dtype") for r in bf16} == {"bf16"}                         # the [cuda] table: bf16 only
    fp32 = [dataclasses.replace(r, workload={**r.workload, "dtype": "fp32"}) for r in bf16]
    rows = bf16 + fp32                                                          # a run with both dtypes
    assert {r.value("dtype") for r in one_dtype(rows)} == {"fp32"}
    assert {r.value("dtype") for r in one_dtype([r for r in rows if r.value("dtype") == "bf16"])} == {"bf16"}
