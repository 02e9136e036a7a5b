"""Sequence baselines: shapes, the ops the counter sees, per-layer cost laws (claims C04/C05),
the measured sequential depth, and analytic cost == counted (hypothesis)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from architectures.layers.attention import exact_mix_macs
from architectures.rnn import SeqBaseline, SeqBaselineConfig, cost, token_inputs
from harness.contract import registry
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_model, count_params, dependency_trace
from harness.contract.spec import Workload

CPU = torch.device("cpu")
KINDS = ["lstm", "gru", "rnn", "conv1d"]


def fake_count(build, make_inputs, real: bool = False):
    """(model, FlopCount) of a forward, on fake tensors unless ``real``."""
    if real:
        torch.manual_seed(0)
        model = build().eval()
        return model, count_model(model, make_inputs())
    mode = new_fake_mode()
    model = build_fake(build, mode, CPU).eval()
    with mode:
        inputs = make_inputs()
    return model, count_model(model, inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_layer_types(kind):
    cfg = SeqBaselineConfig(vocab_size=11, d_model=16, n_layers=2, kind=kind, kernel_size=5)
    model = SeqBaseline(cfg)
    (tokens,) = token_inputs(cfg, Workload(batch_size=3, seq_len=9), CPU)
    assert model(tokens).shape == (3, 9, 11)
    layer = model.stack.rnn if kind != "conv1d" else model.stack.layers[0]
    assert isinstance(layer, {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN, "conv1d": nn.Conv1d}[kind])
    if kind != "conv1d":
        assert layer.batch_first and layer.num_layers == 2 and layer.hidden_size == 16


@pytest.mark.parametrize("kind", KINDS)
def test_fake_and_real_counts_agree_and_name_the_ops(kind):
    """On CPU: LSTM runs the fused aten.mkldnn_rnn_layer (harness formula); GRU/RNN unroll into
    one addmm for the input projection and an mm/addmm per step (stock formulas)."""
    cfg = SeqBaselineConfig(vocab_size=7, d_model=8, n_layers=2, kind=kind)
    w = Workload(batch_size=2, seq_len=5)
    _, fake = fake_count(lambda: SeqBaseline(cfg), lambda: token_inputs(cfg, w, CPU))
    _, real = fake_count(lambda: SeqBaseline(cfg), lambda: token_inputs(cfg, w, CPU), real=True)
    assert fake.by_op == real.by_op and fake.macs == cost(cfg, w)["macs"]
    expected = {"lstm": "aten.mkldnn_rnn_layer", "gru": "aten.mm", "rnn": "aten.mm", "conv1d": "aten.convolution"}
    assert expected[kind] in fake.by_op, fake.by_op


def exponent(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_per_layer_cost_laws(kind):
    """Claim C05's table, counted: recurrent O(n·d²), conv O(k·n·d²) — linear in n, quadratic in d."""
    def layer_macs(n, d, k=3):
        cfg = SeqBaselineConfig(vocab_size=1, d_model=d, n_layers=1, kind=kind, kernel_size=k)
        model, counted = fake_count(lambda: SeqBaseline(cfg), lambda: token_inputs(cfg, Workload(1, n), CPU))
        return counted.macs - n * d                                      # minus the 1-word head
    ns, ds = [16, 32, 64, 128], [8, 16, 32, 64]
    assert exponent(ns, [layer_macs(n, 16) for n in ns]) == pytest.approx(1.0, abs=1e-6)
    assert exponent(ds, [layer_macs(32, d) for d in ds]) == pytest.approx(2.0, abs=1e-6)
    per_token_d2 = layer_macs(32, 16) / (32 * 16 * 16)
    assert per_token_d2 == {"lstm": 8, "gru": 6, "rnn": 2, "conv1d": 3}[kind]     # 2·gates, or k
    if kind == "conv1d":
        assert layer_macs(32, 16, k=7) == 7 * 32 * 16 * 16


def test_attention_beats_recurrence_per_layer_while_n_is_below_d():
    """Claim C04: self-attention's mixing (2·n²·d) is cheaper than a vanilla RNN's (2·n·d²) iff n < d."""
    d = 64
    for n, cheaper in ((32, True), (64, False), (128, False)):
        rnn = cost(SeqBaselineConfig(vocab_size=1, d_model=d, n_layers=1, kind="rnn"), Workload(1, n))["macs"] - n * d
        assert (exact_mix_macs(1, n, 4, d // 4) < rnn) == cheaper


@pytest.mark.parametrize("kind, grows", [("lstm", True), ("gru", True), ("rnn", True), ("conv1d", False)])
def test_measured_depth_grows_with_n_only_for_recurrence(kind, grows):
    """The dependency depth of a real forward (torch's reference path, oneDNN off, so nn.LSTM's steps
    are dispatched one by one): +k ops per token for a recurrence, the same at every n for a conv stack."""
    cfg = SeqBaselineConfig(vocab_size=5, d_model=4, n_layers=2, kind=kind)
    model = SeqBaseline(cfg).eval()

    def depth(n: int) -> int:
        (tokens,) = token_inputs(cfg, Workload(1, n), CPU)
        was = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            with torch.no_grad():
                return dependency_trace(lambda: model(tokens)).depth
        finally:
            torch.backends.mkldnn.enabled = was
    d8, d16, d32 = depth(8), depth(16), depth(32)
    if grows:
        assert d32 - d16 == 2 * (d16 - d8) > 0            # affine in n: a fixed number of ops per step
    else:
        assert d8 == d16 == d32


def test_presets_registered_with_cost():
    for name in ("lstm-small", "gru-small", "rnn-small", "conv1d-small"):
        spec = registry.get(name)
        assert spec.family == "sequence-baseline" and spec.cost is not None and spec.config.d_model == 256
    wide = registry.resolve("lstm-small", d_model=512)
    assert cost(wide.config, Workload(1, 8))["params"] == count_params(SeqBaseline(wide.config))


@st.composite
def baseline_case(draw):
    cfg = SeqBaselineConfig(vocab_size=draw(st.integers(1, 30)), d_model=draw(st.integers(1, 24)),
                            n_layers=draw(st.integers(1, 3)), kind=draw(st.sampled_from(KINDS)),
                            kernel_size=draw(st.integers(1, 6)), activation=draw(st.sampled_from(["gelu", "relu"])),
                            bias=draw(st.booleans()))
    return cfg, Workload(batch_size=draw(st.integers(1, 3)), seq_len=draw(st.integers(1, 20)))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@given(baseline_case())
def test_baseline_cost_matches_counter(case):
    cfg, w = case
    model, counted = fake_count(lambda: SeqBaseline(cfg), lambda: token_inputs(cfg, w, CPU))
    analytic = cost(cfg, w)
    assert analytic["params"] == count_params(model)
    assert analytic["macs"] == pytest.approx(counted.macs, rel=0.01), counted.by_op
