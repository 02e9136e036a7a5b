"""The one step protocol: every workload mode is one Step class with the same small interface (the callable that
is timed, its counted figures, its figures from timing, its memory by kind, how it compiles), the runner never asks
which mode it holds, and every measuring path (a run, a group, the A/B worker) makes records with the same fields."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from harness.contract import registry
from harness.contract.spec import MODES, Case, Workload
from harness.engine import measure, runner
from harness.engine.models import real_case
from harness.engine.modes import STEPS, step_class, step_for
from harness.engine.runner import RunOptions, fake_pass, run_case, run_group
from harness.engine.steps import Step
from harness.instruments.timing import TimingConfig

CPU = torch.device("cpu")
FAST = RunOptions(timing=TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=0.5,
                                      rounds=1))
WORKLOADS = {
    "fwd": Workload(batch_size=2, seq_len=8),
    "fwd_bwd": Workload(batch_size=2, seq_len=8, mode="fwd_bwd"),
    "train_step": Workload(batch_size=2, seq_len=8, mode="train_step"),
    "generate": Workload(batch_size=2, mode="generate", prompt_len=6, new_tokens=3),
}
# What each mode's step adds to a record beside the timing and the memory every step has
OWN_FIGURES = {
    "fwd": set(),
    "fwd_bwd": set(),
    "train_step": {"samples_per_s", "tokens_per_s", "model_flops", "est_6nd_flops", "weight_bytes", "grad_bytes",
                   "optimizer_state_bytes", "activation_bytes", "measured_grad_bytes"},
    "generate": {"ttft_ms", "tpot_ms", "e2e_ms", "kv_cache_bytes", "decode_min_bytes", "prefill_macs"},
}


def _case(mode: str, line: str = "a") -> Case:
    return Case("steps", line, "decoder-tiny", (("n_kv_heads", 2),), WORKLOADS[mode], ("latency", "memory", "flops"))


def test_every_mode_is_one_step_class():
    assert set(STEPS) == set(MODES)
    for mode, cls in STEPS.items():
        assert issubclass(cls, Step) and cls.mode == mode and step_class(mode) is cls
        for name in ("for_workload", "__call__", "compile"):     # what every step must say for itself
            assert getattr(cls, name) is not getattr(Step, name), (mode, name)
    with pytest.raises(ValueError, match="no step for mode"):
        step_class("nope")


@pytest.mark.parametrize("mode", sorted(WORKLOADS))
def test_each_step_is_built_called_and_measured_through_the_one_interface(mode):
    w = WORKLOADS[mode]
    kind = step_class(mode)
    spec = registry.resolve("decoder-tiny", n_kv_heads=2)
    model, inputs = real_case(spec, kind.inputs_workload(w), CPU)
    step = step_for(model, inputs, w)
    assert isinstance(step, kind)
    step()
    mem = step.memory(measure.static_bytes(model, inputs), CPU)
    assert mem["peak_bytes"] > 0 and mem["activation_peak_bytes"] > 0
    counted = fake_pass(spec, w, CPU, want_flops=True)
    assert counted["macs"] > 0 and counted["est_peak_bytes"] > 0
    assert ("analytic_fwd_macs" in counted) == kind.forward_cost     # decoder-tiny has an analytic cost()


@pytest.mark.parametrize("mode", sorted(WORKLOADS))
def test_a_run_records_what_its_step_counts_and_derives(mode):
    rec = run_case(_case(mode), FAST)
    assert rec.ok, rec.message
    assert OWN_FIGURES[mode] <= set(rec.metrics), OWN_FIGURES[mode] - set(rec.metrics)
    for figures in OWN_FIGURES.values():            # and nothing only another mode's step records
        assert not (figures - OWN_FIGURES[mode]) & set(rec.metrics)
    assert rec.sdpa_backend and rec.metric("executed_macs") > 0 and rec.metric("median_ms") > 0


def _branches(source: str) -> list[str]:
    """Comparisons with a workload's ``mode`` and isinstance checks against a step class, in ``source``."""
    steps = {cls.__name__ for cls in STEPS.values()} | {"Step"}
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [n for n in (node.left, *node.comparators) if isinstance(n, ast.Attribute) and n.attr == "mode"]
            out += [ast.unparse(node)] if names else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            out += [ast.unparse(node)] if any(getattr(a, "attr", getattr(a, "id", "")) in steps
                                              for a in ast.walk(node.args[1])) else []
    return out


def test_the_runner_and_the_measuring_protocol_never_ask_for_a_mode():
    for module in (runner, measure):
        assert _branches(Path(inspect.getfile(module)).read_text()) == [], module.__name__
    assert _branches("if w.mode == 'generate': pass\nisinstance(s, Generation)") != []   # the check can fail


def test_a_group_and_a_run_record_the_same_fields():
    """A case timed side by side (``--interleave``) is measured on as a case timed alone: same metric names, the
    SDPA backend, the same counted figures."""
    alone = {m: run_case(_case(m), FAST) for m in ("fwd", "generate")}
    together = run_group([_case("fwd", "a"), _case("generate", "b")], FAST)
    for rec in together:
        solo = alone[rec.workload["mode"]]
        assert rec.ok and solo.ok, (rec.message, solo.message)
        assert set(rec.metrics) == set(solo.metrics), set(rec.metrics) ^ set(solo.metrics)
        assert rec.sdpa_backend == solo.sdpa_backend != ""
        for k in ("macs", "params", "executed_macs", "kv_cache_bytes", "prefill_macs"):
            assert rec.metrics.get(k) == solo.metrics.get(k), k
    assert together[0].group and together[0].group == together[1].group


def test_a_replica_process_times_only():
    """A replicated case's second and later processes (``RunOptions.replica``) lend only their samples: no counting,
    memory or kernel pass (the first process's figures are kept: harness.engine.replicate.merge_processes)."""
    first = run_case(_case("fwd"), FAST)
    replica = run_case(_case("fwd"), dataclasses.replace(FAST, replica=True))
    assert first.ok and replica.ok, (first.message, replica.message)
    assert replica.samples_s and replica.metric("median_ms") > 0
    for k in ("macs", "flops", "executed_macs"):
        assert first.metric(k) and replica.metric(k) is None, k
    assert "params" in replica.metrics and "est_peak_bytes" in replica.metrics     # the budget guard still runs
