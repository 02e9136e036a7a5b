"""The training step (mode "train_step", harness.engine.training): every preset trains (weights change), the loss
follows the output, the optimizer is built once, compile works, memory by kind (analytic = measured, exactly,
on the CPU; within 5 % of the allocator on CUDA), checkpointing's saving, counted step FLOPs of a Linear stack,
the MFU table, the rates, and every bad input (one line, exit 2, nothing stored)."""
from __future__ import annotations

import dataclasses
import math
import textwrap

import pytest
import torch
from torch import nn

from harness.contract import registry
from harness.engine import checkpointing, peaks, training
from harness.engine.compiled import compile_model, warm_up_compiled
from harness.contract.errors import BenchInputError
from harness.instruments.flops import count_flops
from harness.engine.models import materialize
from harness.engine.modes import step_for
from harness.engine.runner import RunOptions, run_case
from harness.contract.spec import Case, Workload, workload_dict
from harness.store.db import Store
from harness.contract.suite import load_suite
from harness.instruments.timing import TimingConfig
from reports import training_view
from tests.helpers import invoke

CPU = torch.device("cpu")
TRAIN = Workload(batch_size=2, seq_len=8, mode="train_step")
FAST = RunOptions(timing=TimingConfig.quick())


def small(name: str):
    return registry.resolve(name, **dict(registry.get(name).small))


def train_step(name: str, w: Workload = TRAIN, **over):
    spec = registry.resolve(name, **{**dict(registry.get(name).small), **over})
    model = materialize(spec, w, CPU)           # seeded, cheap init, checkpointing applied as the runner does
    inputs = spec.make_inputs(spec.config, w, CPU)
    return training.make_train_step(model, inputs, w)


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


# -- every architecture trains ---------------------------------------------------------------------------------
# Presets that take the very path of a smaller one at seconds each on a busy 2-core machine: torchvision's CNNs
# (one adapter, class logits: mobilenet-v3-small stays) and Swin-S/B (Swin-T's code, deeper): left to the
# training suite's runs.
HEAVY = {"resnet18", "resnet50", "resnet101", "convnext-tiny", "regnet-y-400mf", "efficientnet-b0",
         "mobilenet-v3-large", "swin-s", "swin-b"}
TRAINABLE = [n for n in registry.list_archs() if n != "attention-core" and n not in HEAVY]


@pytest.mark.parametrize("name", TRAINABLE)
def test_every_preset_takes_a_training_step_and_its_weights_change(name, one_thread):
    step = train_step(name)
    before = snapshot(step.params)
    step()
    after = snapshot(step.params)
    step()
    assert step.kind in ("next_token", "classification", "mse") and step.steps == 2
    assert all(torch.isfinite(p).all() for p in step.params)
    assert all(p.grad is None for p in step.params)                  # zero_grad(set_to_none=True)
    changed = [not torch.equal(a, b) for a, b in zip(before, after)]
    assert sum(changed) >= len(changed) // 2 and changed.count(True) > 0      # most tensors moved, at step 1…
    assert any(not torch.equal(a, p) for a, p in zip(after, step.params))      # …and again at step 2


@pytest.mark.parametrize("name, kind", [("decoder-tiny", "next_token"), ("mamba-lm-tiny", "next_token"),
                                        ("encdec-small", "next_token"), ("vit-micro", "classification"),
                                        ("resnet-micro", "classification"), ("encoder-small", "classification"),
                                        ("encoder-layer", "mse")])
def test_the_loss_follows_the_output(name, kind):
    step = train_step(name)
    loss = step.forward_loss()
    assert step.kind == kind and loss.dim() == 0 and torch.isfinite(loss)
    if kind == "next_token":   # the targets are the token input shifted by one: (B, T-1)
        assert torch.equal(step.targets, step.inputs[step.token_input][:, 1:])


def test_a_model_without_trainable_parameters_is_refused():
    spec = small("attention-core")
    with pytest.raises(BenchInputError, match="no.*trainable|trainable parameters"):
        training.make_train_step(spec.build(spec.config), spec.make_inputs(spec.config, TRAIN, CPU), TRAIN)


def test_the_optimizer_is_built_once_per_case_and_sgd_keeps_no_state():
    step = train_step("decoder-tiny")
    opt = step.optimizer
    step()
    step()
    assert step.optimizer is opt and isinstance(opt, torch.optim.AdamW) and opt.state
    sgd = train_step("decoder-tiny", dataclasses.replace(TRAIN, optimizer="sgd"))
    sgd()
    assert isinstance(sgd.optimizer, torch.optim.SGD) and training.optimizer_state_bytes(sgd.optimizer) == 0


def test_bf16_autocast_keeps_fp32_master_weights_and_trains():
    step = train_step("decoder-tiny", dataclasses.replace(TRAIN, amp="bf16"))
    before = snapshot(step.params)
    step()
    assert all(p.dtype == torch.float32 for p in step.params)
    assert any(not torch.equal(a, p) for a, p in zip(before, step.params))


def test_compiled_training_step_on_the_cpu_trains_and_shares_the_eager_optimizer():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    w = Workload(batch_size=4, mode="train_step", compile="default")
    inputs = (torch.randn(4, 16),)
    eager = step_for(model, inputs, w)
    step = eager.compile(w, lambda m: compile_model(m, "default", w.mode))
    assert step.optimizer is eager.optimizer and step.compiled
    warm_up_compiled(step, CPU, "default")
    before = snapshot(step.params)
    step()
    assert any(not torch.equal(a, p) for a, p in zip(before, step.params))
    assert step.kind == "classification"


# -- memory by kind -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer, per_param", [("adamw", 16), ("sgd", 8)])
def test_analytic_static_memory_equals_the_measured_tensors_exactly(optimizer, per_param):
    step = train_step("decoder-tiny", dataclasses.replace(TRAIN, optimizer=optimizer))
    analytic = training.analytic_memory(step.params, optimizer)
    measured = training.measure_memory(step, 0, CPU)
    n = sum(p.numel() for p in step.params)
    assert analytic["weight_bytes"] == measured["measured_weight_bytes"] == 4 * n
    assert analytic["grad_bytes"] == measured["measured_grad_bytes"] == 4 * n
    assert analytic["optimizer_state_bytes"] == measured["measured_optimizer_state_bytes"]
    # fp32 AdamW: 4 + 4 + 8 bytes per parameter, plus a 4-byte step counter per parameter tensor
    assert analytic["static_train_bytes"] == per_param * n + (4 * len(step.params) if optimizer == "adamw" else 0)
    assert 0 < measured["activation_bytes"] <= measured["activation_peak_bytes"]


@pytest.fixture(scope="module")
def tiny_record():
    case = Case("t", "l", "decoder-tiny", (), dataclasses.replace(TRAIN, threads=1),
                ("latency", "memory", "flops"))
    return run_case(case, FAST)


def test_the_runner_records_memory_by_kind_rates_and_no_mfu_on_a_cpu(tiny_record):
    rec = tiny_record
    assert rec.status == "ok", rec.message
    m = rec.metrics
    for kind in ("weight", "grad", "optimizer_state"):
        assert m[f"{kind}_bytes"] == m[f"measured_{kind}_bytes"] > 0
    assert m["peak_bytes"] >= m["weight_bytes"] + m["optimizer_state_bytes"] + m["measured_grad_bytes"]
    assert m["samples_per_s"] == pytest.approx(2 / (m["median_ms"] / 1e3))
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 8)
    assert m["model_flops"] == m["flops"] and m["est_6nd_flops"] == 6 * m["params"] * 16
    assert "mfu" not in m and "no published peak for this device (cpu)" in rec.message
    assert "optimizer" not in rec.workload and "amp" not in rec.workload      # defaults stay out of the key


def test_the_report_shows_rates_mfu_or_its_absence_and_memory_by_kind(tiny_record):
    rows = training_view.training_rows([tiny_record])
    assert len(rows) == 1 and rows[0]["mfu"] == "no published peak" and rows[0]["tokens"] != "–"
    parts = dict(training_view.memory_parts(tiny_record))
    assert sum(parts.values()) == pytest.approx(tiny_record.metrics["peak_bytes"]) and parts["other"] >= 0
    assert training_view.size_figure([tiny_record]) is not None
    assert training_view.memory_figure([tiny_record]) is not None


def test_block_checkpointing_saves_activations_and_counts_its_recomputation():
    w = dataclasses.replace(TRAIN, seq_len=32)
    plain = train_step("decoder-tiny", w, n_layers=4)
    ckpt = train_step("decoder-tiny", dataclasses.replace(w, checkpointing="block"), n_layers=4)
    assert sum(isinstance(m, checkpointing.Checkpointed) for m in ckpt.model.modules()) == 4
    saved_plain = training.measure_memory(plain, 0, CPU)["activation_bytes"]
    saved_ckpt = training.measure_memory(ckpt, 0, CPU)["activation_bytes"]
    assert saved_ckpt < 0.6 * saved_plain
    # the recomputed forwards are counted: the step as run does more than the model's step
    assert count_flops(ckpt).flops > count_flops(plain).flops
    before = snapshot(ckpt.params)
    ckpt()
    assert any(not torch.equal(a, p) for a, p in zip(before, ckpt.params))


def test_checkpointing_a_model_without_blocks_is_refused():
    with pytest.raises(BenchInputError, match="blocks"):
        checkpointing.apply_checkpointing(nn.Sequential(nn.Linear(2, 2)), "block")


# -- FLOPs of the step -----------------------------------------------------------------------------------------
def test_counted_step_flops_of_a_linear_stack_are_three_forwards_less_the_first_input_gradient():
    """A stack of bias-free Linear layers, MSE loss: forward 2·B·Σ(in·out); backward the weight gradients
    (2·B·in·out each) and the input gradients of every layer but the first (its input needs no gradient).
    The loss, AdamW's update (≈ a dozen elementwise ops per parameter) and zero_grad are elementwise: the
    counter's convention counts them 0, so the step's count is exactly that."""
    dims, batch = [32, 64, 48, 16], 8
    model = nn.Sequential(*(nn.Linear(a, b, bias=False) for a, b in zip(dims, dims[1:])))
    x = torch.randn(batch, dims[0])
    fwd = sum(2 * batch * a * b for a, b in zip(dims, dims[1:]))
    first_input_grad = 2 * batch * dims[0] * dims[1]
    w = Workload(batch_size=batch, mode="train_step")
    step = training.make_train_step(model, (x,), w)
    with torch.no_grad():
        assert count_flops(lambda: model(x)).flops == fwd
    assert count_flops(step).flops == 3 * fwd - first_input_grad
    x.requires_grad_(True)               # with the input's gradient too: exactly 3 × forward
    step2 = training.make_train_step(model, (x,), w)
    assert count_flops(step2).flops == 3 * fwd
    opt_only = count_flops(step2.optimizer.step)
    assert opt_only.flops == 0 and opt_only.complete


# -- MFU -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, label", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"), ("NVIDIA H200", "NVIDIA H200 SXM"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"), ("NVIDIA A100-PCIE-40GB", "NVIDIA A100"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA GeForce RTX 4090", None), ("cpu", None)])
def test_device_names_match_their_row_of_dense_peaks(name, label):
    row = peaks.device_peak(name)
    assert (row.label if row else None) == label


def test_dense_peaks_are_the_published_dense_figures_never_the_sparse_ones():
    h100 = peaks.device_peak("NVIDIA H100 80GB HBM3")
    assert (h100.bf16, h100.tf32, h100.fp32) == (989.4e12, 494.7e12, 66.9e12)
    a100 = peaks.device_peak("NVIDIA A100-SXM4-40GB")
    assert (a100.bf16, a100.tf32, a100.fp32) == (312e12, 156e12, 19.5e12)


def test_mfu_divides_model_flops_per_second_by_the_peak_of_the_step_precision():
    w = Workload(batch_size=4, seq_len=128, mode="train_step", device="cuda", amp="bf16")
    out, why = peaks.rates(w, 0.5, model_flops=1e14, flops=1.2e14, name="NVIDIA H100 80GB HBM3")
    assert why == "" and out["published_peak_flops_per_s"] == 989.4e12
    assert out["mfu"] == pytest.approx(2e14 / 989.4e12) and out["hfu"] == pytest.approx(2.4e14 / 989.4e12)
    assert out["tokens_per_s"] == 4 * 128 / 0.5
    cpu, why = peaks.rates(TRAIN, 0.5, 1e9, 1e9, "cpu")
    assert "mfu" not in cpu and why == "MFU: no published peak for this device (cpu)"


# -- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, where", [
    (dict(optimizer="lion"), "optimizer"), (dict(amp="fp8"), "amp"), (dict(checkpointing="layer"), "checkpointing"),
    (dict(amp="fp16"), "amp"), (dict(amp="bf16", dtype="bf16"), "amp")])
def test_bad_training_fields_are_refused(kw, where):
    with pytest.raises(BenchInputError) as info:
        Workload(mode="train_step", **kw)
    assert info.value.where == where


def test_training_fields_outside_train_step_are_refused_and_defaults_keep_keys():
    with pytest.raises(BenchInputError, match="train_step"):
        Workload(mode="fwd", optimizer="sgd")
    assert set(workload_dict(Workload())) == set(workload_dict(Workload(mode="train_step"))) 


BAD_SUITE = """
name = "bad_train"
metrics = ["latency"]
fixed = {{ mode = "train_step", batch_size = 1, seq_len = 8 }}
[lines]
x = {{ {line} }}
"""


@pytest.mark.parametrize("line, needle", [
    ('arch = "attention-core"', "trainable parameters"),
    ('arch = "decoder-tiny", optimizer = "lion"', "unknown optimizer"),
    ('arch = "decoder-tiny", amp = "fp8"', "unknown amp"),
    ('arch = "decoder-tiny", amp = "fp16"', "needs a CUDA device"),
    ('arch = "resnet-micro", checkpointing = "block"', "needs blocks"),
])
def test_bad_training_input_on_the_cli_is_one_line_exit_2_and_nothing_stored(tmp_path, line, needle):
    suite = tmp_path / "bad.toml"
    suite.write_text(textwrap.dedent(BAD_SUITE.format(line=line)))
    db = tmp_path / "r.sqlite"
    result = invoke("run", str(suite), "--quick", "--executor", "inline", "--store", f"sqlite:///{db}")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr
    assert not db.exists() or not Store(f"sqlite:///{db}", create=False).runs()


def test_an_out_of_memory_step_is_a_recorded_oom(monkeypatch):
    def oom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(training.TrainStep, "update", oom)
    case = Case("t", "l", "decoder-tiny", (), dataclasses.replace(TRAIN, threads=1), ("latency",))
    rec = run_case(case, FAST)
    assert rec.status == "oom" and "out of memory" in rec.message


# -- the suite ------------------------------------------------------------------------------------------------
def test_the_training_suite_loads_quick_and_full():
    quick = load_suite("training", quick=True)
    full = load_suite("training")
    assert all(c.workload.mode == "train_step" for c in (*quick.cases, *full.cases))
    assert {c.workload.checkpointing for c in full.cases} == {"none", "block"}
    assert {c.workload.compile for c in full.cases} >= {"none", "default"}
    assert len(quick.cases) < len(full.cases)


# -- CUDA ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_analytic_static_memory_is_within_5_percent_of_the_allocator():
    """The allocator's growth at each stage of a step on CUDA against the analytic bytes: the weights at the
    build, AdamW's state at the first step (less the targets made then), the gradients after a backward."""
    device = torch.device("cuda")
    spec = small("decoder-small")
    w = Workload(batch_size=2, seq_len=64, mode="train_step", device="cuda")

    def allocated() -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)

    base = allocated()
    model = spec.build(spec.config).to(device)
    weights = allocated() - base
    step = training.make_train_step(model, spec.make_inputs(spec.config, w, device), w)
    analytic = training.analytic_memory(step.params, "adamw")
    before_step = allocated()
    step()                                                  # AdamW's state is made at the first step
    state = allocated() - before_step - training.memory.tensor_bytes(step.targets)
    before_bwd = allocated()
    loss = step.forward_loss()
    step.backward(loss)
    del loss
    grads = allocated() - before_bwd
    step.update()
    assert math.isclose(weights, analytic["weight_bytes"], rel_tol=0.05)
    assert math.isclose(state, analytic["optimizer_state_bytes"], rel_tol=0.05)
    assert math.isclose(grads, analytic["grad_bytes"], rel_tol=0.05)


def test_c29_counts_the_training_step(monkeypatch):
    """C29's probe (the Transformer's training FLOPs) counts mode train_step, not a bare forward + backward."""
    from claims.probes import cost
    modes = []

    def fake(arch, w, **over):
        modes.append(w.mode)
        return {"flops": 1e9}
    monkeypatch.setattr(cost, "fake_metrics", fake)
    monkeypatch.setattr(cost, "built_params", lambda arch: 65e6)
    cost.training_flops(None)  # type: ignore[arg-type]
    assert modes == ["train_step", "train_step"]
