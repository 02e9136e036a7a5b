"""Compiled execution (workload ``compile``): validation, case keys, the warm-up rule, and real torch.compile
runs on tiny presets (CPU inductor; the CUDA-graph mode in ``gpu`` tests)."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from reports.labels import case_labels
import torch

from harness.engine import compiled
from harness.contract import registry
from harness.engine.compiled import compile_model, uses_cuda_graphs, warm_up_compiled
from harness.contract.errors import BenchInputError
from harness.engine.runner import RunOptions, run_case
from harness.contract.spec import COMPILES, Case, Workload, workload_dict
from harness.engine.steps import make_step
from harness.instruments.outputs import first_tensor
from harness.contract.suite import load_suite
from harness.instruments.timing import TimingConfig
from tests.helpers import invoke

FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=1.0, rounds=1)
SMALL = tuple(sorted(registry.get("decoder-tiny").small))      # d=32, L=2, h=4, vocab 64


def tiny_decoder(w: Workload) -> tuple[torch.nn.Module, tuple]:
    spec = registry.resolve("decoder-tiny", **dict(SMALL))
    torch.manual_seed(0)
    model = spec.build(spec.config)
    return model, spec.make_inputs(spec.config, w, torch.device("cpu"))


# -- the workload field: values, devices, keys ---------------------------------------------------------

def test_a_default_workload_keeps_the_case_key_it_had_before_compile_existed():
    """Keys computed before the field was added (stored runs, --resume and .ci/baseline-cpu.json match on them)."""
    assert Case("s", "l", "vit-micro", (), Workload(), ("latency",)).key == "d972adb98ea54360"
    case = Case("s", "l", "decoder-tiny", (("attn_impl", "sdpa"),), Workload(batch_size=2, seq_len=16, mode="fwd_bwd"),
                ("latency", "memory", "flops"))
    assert case.key == "3de7c786e732de3a"
    assert [c.key for c in load_suite("suites/ci", quick=True).cases][:2] == ["521a7c9a7ad40bbd", "40bb9e6e7bd5c010"]
    assert case.record("ok").workload == {"batch_size": 2, "seq_len": 16, "img_size": None, "dtype": "fp32",
                                          "mode": "fwd_bwd", "device": "cpu", "threads": 0}


def test_a_compiled_case_is_its_own_case():
    eager = Case("s", "l", "vit-micro", (), Workload(), ("latency",))
    keys = {dataclasses.replace(eager, workload=Workload(compile=c)).key for c in ("none", "default", "max-autotune")}
    assert len(keys) == 3 and eager.key in keys
    graphs = dataclasses.replace(eager, workload=Workload(device="cuda", compile="cudagraphs"))
    assert graphs.record("ok").workload["compile"] == "cudagraphs"
    assert workload_dict(graphs.workload)["compile"] == "cudagraphs" and "compile" not in workload_dict(Workload())
    labels = case_labels([eager.record("skipped"), graphs.record("skipped")])   # the one label scheme
    assert labels[1].endswith("compile=cudagraphs") and labels[0] != labels[1]


@pytest.mark.parametrize("value", ["eager", "reduce-overhead", "max_autotune", "", 1, True, None])
def test_an_unknown_compile_value_is_an_input_error(value):
    with pytest.raises(BenchInputError, match="compile: unknown compile") as info:
        Workload(compile=value)
    assert "cudagraphs" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_cudagraphs_needs_a_cuda_device(device):
    with pytest.raises(BenchInputError, match="needs a CUDA device") as info:
        Workload(device=device, compile="cudagraphs")
    assert info.value.where == "compile"
    for value in ("default", "max-autotune"):             # inductor compiles for the CPU too
        assert Workload(device=device, compile=value).compile == value
    for cuda in ("cuda", "cuda:1"):
        assert Workload(device=cuda, compile="cudagraphs").compile == "cudagraphs"


def test_cli_refuses_cudagraphs_on_cpu_in_one_line_exit_2(tmp_path):
    db = tmp_path / "x.sqlite"
    result = invoke("run", "suites/ci", "--quick", "--set", "compile=cudagraphs", "--executor", "inline",
                    "--no-report", "--store", f"sqlite:///{db}")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "compile" in lines[0] and "needs a CUDA device" in lines[0], result.stderr
    assert not db.exists()
    ok = invoke("run", "suites/ci", "--quick", "--set", "compile=cudagraphs", "--device", "cuda", "--dry-run")
    assert ok.exit_code == 0, ok.stderr
    assert "compile=cudagraphs" in ok.stdout


# -- the warm-up rule (no compiler: the compile counters are faked) -------------------------------------

def fake_compiler(monkeypatch, compiling_calls: int | None):
    """A step whose first ``compiling_calls`` calls (None: every call) count as compiling."""
    state = {"calls": 0, "events": 0}

    def step() -> None:
        state["calls"] += 1
        if compiling_calls is None or state["calls"] <= compiling_calls:
            state["events"] += 1
    monkeypatch.setattr(compiled, "_compile_events", lambda: state["events"])
    return step, state


@pytest.mark.parametrize("compiling, calls", [(1, 2), (0, 2), (2, 3), (4, 5)])
def test_warm_up_runs_until_a_call_compiles_nothing(monkeypatch, compiling, calls):
    step, state = fake_compiler(monkeypatch, compiling)
    spent = warm_up_compiled(step, "cpu", "default")
    assert state["calls"] == calls and spent >= 0.0


def test_warm_up_leaves_the_steady_call_out_of_compile_s(monkeypatch):
    clock = iter([0.0, 5.0, 5.0, 5.5])                     # call 1 takes 5 s (compiles), call 2 0.5 s (steady)
    monkeypatch.setattr(compiled.time, "perf_counter", lambda: next(clock))
    step, state = fake_compiler(monkeypatch, 1)
    assert warm_up_compiled(step, "cpu", "default") == 5.0 and state["calls"] == 2


def test_a_step_that_never_stops_compiling_is_an_error(monkeypatch):
    step, state = fake_compiler(monkeypatch, None)
    with pytest.raises(RuntimeError, match="still compiles after 8 calls"):
        warm_up_compiled(step, "cpu", "max-autotune")
    assert state["calls"] == compiled.MAX_WARM_UP_CALLS


def test_eager_warms_up_nothing():
    calls = []
    assert warm_up_compiled(lambda: calls.append(1), "cpu", "none") == 0.0 and calls == []
    model = torch.nn.Linear(2, 2)
    assert compile_model(model, "none", "fwd") is model and not model.training
    with pytest.raises(BenchInputError, match="compile"):
        compile_model(model, "turbo", "fwd")


def test_cuda_graphs_are_replayed_only_on_cuda():
    assert uses_cuda_graphs("cudagraphs", "cuda") and uses_cuda_graphs("max-autotune", torch.device("cuda:0"))
    assert not uses_cuda_graphs("default", "cuda") and not uses_cuda_graphs("max-autotune", "cpu")
    assert set(compiled.TORCH_MODES) == set(COMPILES) - {"none"}


# -- real compiles on the CPU (inductor; tiny presets) -------------------------------------------------

def test_compiled_forward_equals_eager_and_is_steady_after_warm_up():
    w = Workload(batch_size=2, seq_len=8, compile="default")
    model, inputs = tiny_decoder(w)
    model.eval()
    with torch.no_grad():
        eager = first_tensor(model(*inputs)).clone()                    # (B, T, vocab)
    fast = compile_model(model, w.compile, w.mode)
    step = make_step(fast, inputs, w.mode, w.compile)
    compile_s = warm_up_compiled(step, "cpu", w.compile)
    assert compile_s > 0.0
    before = compiled._compile_events()
    step()
    assert compiled._compile_events() == before                        # steady: nothing compiles any more
    with torch.no_grad():
        out = first_tensor(fast(*inputs))
    assert out.shape == eager.shape
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)


def test_compiled_fwd_bwd_gradients_equal_eager():
    w = Workload(batch_size=2, seq_len=8, mode="fwd_bwd", compile="default")
    model, inputs = tiny_decoder(w)
    twin = copy.deepcopy(model)
    make_step(twin, inputs, w.mode)()                                   # eager gradients
    step = make_step(compile_model(model, w.compile, w.mode), inputs, w.mode, w.compile)
    assert warm_up_compiled(step, "cpu", w.compile) > 0.0                # forward and backward compiled
    step()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads and all(g is not None for g in grads.values())
    for name, p in twin.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_run_case_records_compile_s_and_counts_the_eager_macs():
    """Through the runner: the fake pass counts the uncompiled model, so a compiled case's MACs are the eager
    one's; compile time is recorded apart, and the eager case records none."""
    records = {}
    for value in ("none", "default"):
        case = Case("t", value, "decoder-tiny", SMALL, Workload(batch_size=2, seq_len=8, compile=value),
                    ("latency", "memory", "flops"))
        records[value] = run_case(case, RunOptions(timing=FAST))
    eager, fast = records["none"], records["default"]
    assert eager.status == "ok" and fast.status == "ok", (eager.message, fast.message)
    assert fast.metrics["macs"] == eager.metrics["macs"] > 0
    assert fast.metrics["compile_s"] > 0.0 and "compile_s" not in eager.metrics
    assert fast.metric("median_ms") is not None and fast.workload["compile"] == "default"


# -- CUDA ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_cudagraphs_match_eager_and_reach_a_steady_replay(mode):
    w = Workload(batch_size=2, seq_len=8, mode=mode, device="cuda", compile="cudagraphs")
    model, inputs = tiny_decoder(w)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    twin = copy.deepcopy(model).train(mode == "fwd_bwd")
    with torch.set_grad_enabled(mode == "fwd_bwd"):
        eager = first_tensor(twin(*inputs)).detach().clone()
    fast = compile_model(model, w.compile, w.mode)
    step = make_step(fast, inputs, w.mode, w.compile)
    assert warm_up_compiled(step, "cuda", w.compile) > 0.0
    before = compiled._compile_events()
    step()
    torch.cuda.synchronize()
    assert compiled._compile_events() == before
    torch.compiler.cudagraph_mark_step_begin()
    with torch.set_grad_enabled(mode == "fwd_bwd"):
        out = first_tensor(fast(*inputs)).detach().clone()
    torch.testing.assert_close(out, eager, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
def test_run_case_cudagraphs_on_cuda_keeps_the_macs():
    records = {}
    for value in ("none", "cudagraphs"):
        case = Case("t", value, "decoder-tiny", SMALL,
                    Workload(batch_size=2, seq_len=8, device="cuda", compile=value), ("latency", "memory", "flops"))
        records[value] = run_case(case, RunOptions(timing=FAST))
    eager, graphs = records["none"], records["cudagraphs"]
    assert eager.status == "ok" and graphs.status == "ok", (eager.message, graphs.message)
    assert graphs.metrics["macs"] == eager.metrics["macs"] and graphs.metrics["compile_s"] > 0.0
