"""Tests of harness.flops: published torchvision counts, attention/conv/matmul formulas, robustness."""
from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils import flop_counter as stock

from harness.fake import build_fake
from harness.flops import (
    EXTRA_FORMULAS,
    FlopCount,
    FlopFormulaWarning,
    count_flops,
    count_model,
    count_params,
    sdpa_backward_flops,
    sdpa_flops,
)
from torch._subclasses.fake_tensor import FakeTensorMode

aten = torch.ops.aten
CPU = torch.device("cpu")
VISION = ["resnet50", "vit_b_16", "swin_t", "efficientnet_b0", "convnext_tiny"]


def fake_inputs(make, mode):
    """``make()`` inside ``mode``: tensor factories then yield fake tensors."""
    with mode:
        return make()


def _fake_vision(name: str):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_fake(lambda: torchvision.models.get_model(name, weights=None), mode, CPU).eval()
    x = fake_inputs(lambda: torch.randn(1, 3, 224, 224), mode)
    return model, x


# ------------------------------------------------------------------------------------------
# 1. The validation against torchvision's published numbers
# ------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("error::harness.flops.FlopFormulaWarning")
@pytest.mark.parametrize("name", VISION)
def test_torchvision_published_macs_and_params(name):
    meta = torchvision.models.get_model_weights(name).DEFAULT.meta
    model, x = _fake_vision(name)
    count = count_model(model, (x,))  # eval (set above) + no_grad: the fused fast paths run
    gmacs = count.macs / 1e9
    assert gmacs == pytest.approx(meta["_ops"], rel=0.01), (name, gmacs, meta["_ops"], count.by_op)
    # the parameter count is exact, not just within 1%
    assert count_params(model) == meta["num_params"]
    assert count.flops == 2 * count.macs
    assert sum(count.by_op.values()) == count.flops


def test_vit_needs_the_fused_mha_formula():
    """vit_b_16 in eval+no_grad runs nn.MultiheadAttention's fused op; the stock counter sees
    only the MLP and patch embedding (11.27 GMACs of the published 17.564)."""
    model, x = _fake_vision("vit_b_16")
    ours = count_model(model, (x,))
    with torch.no_grad(), stock.FlopCounterMode(display=False) as fc:
        model(x)
    assert fc.get_total_flops() / 2e9 == pytest.approx(11.271, abs=1e-3)
    assert ours.by_op["aten._native_multi_head_attention"] == ours.flops - fc.get_total_flops()
    # by_module: the root and its direct children, attributed as FlopCounterMode does
    assert ours.by_module["VisionTransformer"] == ours.flops
    children = [k for k in ours.by_module if k.startswith("VisionTransformer.")]
    assert sum(ours.by_module[k] for k in children) == ours.flops
    assert all(k.count(".") == 1 for k in children)


def test_fake_counting_is_fast():
    model, x = _fake_vision("vit_b_16")
    count_model(model, (x,))  # warm-up (first-call dispatch caches)
    t = time.perf_counter()
    count_model(model, (x,))
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("name", ["vit_b_16", "efficientnet_b0"])
def test_real_and_fake_tensors_count_the_same(name):
    fake_model, fake_x = _fake_vision(name)
    torch.manual_seed(0)
    real_model = torchvision.models.get_model(name, weights=None).eval()
    real_x = torch.randn(1, 3, 224, 224)
    real, fake = count_model(real_model, (real_x,)), count_model(fake_model, (fake_x,))
    assert real == fake


# ------------------------------------------------------------------------------------------
# 2. Formulas
# ------------------------------------------------------------------------------------------

def test_cpu_sdpa_counts_qk_and_av():
    b, h, n, d = 2, 4, 64, 32
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    count = count_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert count.by_op == {"aten._scaled_dot_product_flash_attention_for_cpu": 2 * (2 * b * h * n * n * d)}
    # the same convention as the stock formula of the CUDA kernels
    assert count.flops == stock.sdpa_flop_count(q.shape, k.shape, v.shape)


def test_causal_sdpa_counts_the_full_square():
    """Convention (the stock counter's): causal masking does not halve the count."""
    q = torch.randn(1, 2, 128, 16)
    full = count_flops(lambda: F.scaled_dot_product_attention(q, q, q)).flops
    causal = count_flops(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)).flops
    assert causal == full == 4 * 2 * 128 * 128 * 16


def test_gqa_sdpa_counts_with_query_heads():
    b, hq, hkv, n, s, d = 2, 8, 2, 48, 40, 16
    q = torch.randn(b, hq, n, d)
    k, v = torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    count = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    expected = 2 * (2 * b * hq * n * s * d)
    assert count.flops == expected
    # the CPU kernel receives k/v with their Hkv heads (no repeat) ...
    assert sdpa_flops((b, hq, n, d), (b, hkv, s, d), (b, hkv, s, d)) == expected
    # ... and counts what the explicit grouped matmul formula counts
    g = hq // hkv

    def eager():
        scores = q.view(b, hkv, g, n, d) @ k.unsqueeze(2).transpose(-2, -1)
        return scores.softmax(-1) @ v.unsqueeze(2)
    assert count_flops(eager).flops == expected


def test_gqa_sdpa_backward():
    b, hq, hkv, n, d = 1, 8, 2, 32, 16
    q = torch.randn(b, hq, n, d, requires_grad=True)
    k = torch.randn(b, hkv, n, d, requires_grad=True)
    v = torch.randn(b, hkv, n, d, requires_grad=True)
    count = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward())
    fwd = 2 * (2 * b * hq * n * n * d)
    # stock backward convention: 5 matmuls of the forward's size (recompute, dP, dV, dQ, dK)
    assert count.by_op == {"aten._scaled_dot_product_flash_attention_for_cpu": fwd,
                           "aten._scaled_dot_product_flash_attention_for_cpu_backward": fwd * 5 // 2}
    assert sdpa_backward_flops(q.shape, k.shape, v.shape) == stock.sdpa_backward_flop_count(
        q.shape, q.shape, k.shape, v.shape)


def test_long_sdpa_on_fake_tensors_is_instant():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    n = 16384
    q, k, v = fake_inputs(lambda: (torch.randn(1, 32, n, 128), torch.randn(1, 8, n, 128),
                                   torch.randn(1, 8, n, 128)), mode)
    t = time.perf_counter()
    count = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    assert time.perf_counter() - t < 1.0
    assert count.flops == 4 * 32 * n * n * 128
    with mode:  # counting also works with the fake mode active (the counter is entered inside it)
        assert count_flops(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)) == count


def _mha_expected(b, l, e):
    # in-projection (q, k, v) + QKᵀ + AV + out-projection, 2 FLOPs per MAC
    return 2 * (3 * b * l * e * e + 2 * b * l * l * e + b * l * e * e)


def test_multihead_attention_fast_path_counts_like_the_unfused_path():
    b, l, e, h = 2, 10, 64, 4
    mha = nn.MultiheadAttention(e, h, batch_first=True)
    x = torch.randn(b, l, e)
    mha.eval()
    fast = count_model(mha, (x, x, x))                           # eval + no_grad: fused op
    assert set(fast.by_op) == {"aten._native_multi_head_attention"}
    mha.train()
    slow = count_flops(lambda: mha(x, x, x, need_weights=False))  # train, grad: addmm/mm + SDPA
    assert "aten._native_multi_head_attention" not in slow.by_op
    weights = count_flops(lambda: mha(x, x, x, need_weights=True))  # bmm path with explicit weights
    assert fast.flops == slow.flops == weights.flops == _mha_expected(b, l, e)


def test_transformer_encoder_layer_fast_path():
    b, l, e, h, ff = 2, 10, 32, 4, 64
    layer = nn.TransformerEncoderLayer(e, h, ff, batch_first=True).eval()
    x = torch.randn(b, l, e)
    fast = count_model(layer, (x,))
    assert set(fast.by_op) == {"aten._transformer_encoder_layer_fwd"}
    slow = count_flops(lambda: layer(x))  # grad enabled: the unfused path
    assert fast.flops == slow.flops == _mha_expected(b, l, e) + 2 * (2 * b * l * e * ff)


def test_transformer_encoder_nested_fast_path_counts_real_tokens():
    """With a padding mask, eval TransformerEncoder packs the batch into a nested tensor."""
    e, h, ff = 32, 4, 64
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(e, h, ff, batch_first=True), 2).eval()
    x = torch.randn(2, 10, e)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 6:] = True
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
        warnings.simplefilter("error", FlopFormulaWarning)
        with torch.no_grad():
            count = count_flops(lambda: enc(x, src_key_padding_mask=pad))
    assert set(count.by_op) == {"aten._transformer_encoder_layer_fwd"}
    per_layer = sum(_mha_expected(1, n, e) + 2 * (2 * n * e * ff) for n in (10, 6))
    assert count.flops == 2 * per_layer


def test_linear_fwd_bwd_exact():
    """fwd: each Linear is addmm, 2·N·in·out. bwd: every layer's grad_weight (mm, same size as
    its forward) plus grad_input for every layer except the first, whose input does not require
    grad; grad_bias is a sum (0). So fwd_bwd = 3·fwd − fwd(first layer), not 3·fwd, and for a
    single Linear fed a non-grad input it is exactly 2·fwd."""
    n, dims = 3, (4, 5, 6, 7)
    model = nn.Sequential(*(nn.Linear(a, b) for a, b in zip(dims, dims[1:])))
    x = torch.randn(n, dims[0])
    layer = [2 * n * a * b for a, b in zip(dims, dims[1:])]
    fwd = count_model(model, (x,))
    both = count_model(model, (x,), "fwd_bwd")
    assert fwd.flops == sum(layer)
    assert both.flops == 3 * sum(layer) - layer[0]
    assert count_model(model[0], (x,), "fwd_bwd").flops == 2 * layer[0]
    assert count_model(model, (x.clone().requires_grad_(),), "fwd_bwd").flops == 3 * sum(layer)
    assert all(p.grad is None for p in model.parameters())  # count_model restores .grad


def test_grouped_conv_backward():
    """The stock convolution_backward formula ignores groups in grad_weight (a depthwise conv's
    backward came out C× too large); ours: grad_input and grad_weight each cost one forward."""
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=16)
    x = torch.randn(2, 16, 8, 8)
    fwd = count_model(conv, (x,)).flops
    assert fwd == 2 * 2 * 8 * 8 * 16 * 9
    assert count_model(conv, (x,), "fwd_bwd").flops == 2 * fwd               # grad_weight only
    assert count_model(conv, (x.requires_grad_(),), "fwd_bwd").flops == 3 * fwd
    convt = nn.ConvTranspose2d(16, 8, 3, stride=2, groups=4)
    fwd = count_model(convt, (x,)).flops
    assert fwd == 2 * 2 * 8 * 8 * 16 * (8 // 4) * 9
    assert count_model(convt, (x,), "fwd_bwd").flops == 3 * fwd


def test_vision_fwd_bwd_is_about_three_times_fwd():
    model, x = _fake_vision("efficientnet_b0")
    fwd, both = count_model(model, (x,)), count_model(model, (x,), "fwd_bwd")
    assert 2.9 < both.flops / fwd.flops <= 3.0


def test_lstm_counts_on_cpu():
    lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 5, 8)
    fused = count_model(lstm, (x,))
    assert set(fused.by_op) == {"aten.mkldnn_rnn_layer"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a TF32/oneDNN notice from the flags context
        with torch.backends.mkldnn.flags(enabled=False):
            unfused = count_model(lstm, (x,))
    tokens = 3 * 5
    expected = 2 * tokens * 2 * (4 * 16 * 8 + 4 * 16 * 16) + 2 * tokens * 2 * (4 * 16 * 32 + 4 * 16 * 16)
    assert fused.flops == unfused.flops == expected


@pytest.mark.parametrize("fn, flops", [
    (lambda a, x, y: a @ x, 2 * 5 * 6),                          # mv
    (lambda a, x, y: torch.addmv(y, a, x), 2 * 5 * 6),
    (lambda a, x, y: x @ x, 2 * 6),                              # dot
    (lambda a, x, y: torch.vdot(x, x), 2 * 6),
    (lambda a, x, y: torch.addbmm(torch.zeros(5, 7), torch.ones(3, 5, 6), torch.ones(3, 6, 7)), 2 * 3 * 5 * 6 * 7),
    (lambda a, x, y: aten._addmm_activation(torch.zeros(7), a, torch.ones(6, 7), use_gelu=True), 2 * 5 * 6 * 7),
])
def test_matmul_variants(fn, flops):
    a, x, y = torch.randn(5, 6), torch.randn(6), torch.randn(5)
    assert count_flops(lambda: fn(a, x, y)).flops == flops


def test_extra_formulas_cover_the_known_gaps():
    for op in (aten._scaled_dot_product_flash_attention_for_cpu,
               aten._scaled_dot_product_flash_attention_for_cpu_backward,
               aten._native_multi_head_attention,
               aten._transformer_encoder_layer_fwd,
               aten.convolution_backward):
        assert op in EXTRA_FORMULAS


# ------------------------------------------------------------------------------------------
# 3. Robustness
# ------------------------------------------------------------------------------------------

@torch.library.custom_op("bench_test_flops::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@_mystery.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.parametrize("fake", [False, True])
def test_unknown_op_counts_zero_without_crashing(fake):
    make = lambda: (torch.randn(4, 8), torch.randn(8, 3))  # noqa: E731
    if fake:
        a, w = fake_inputs(make, FakeTensorMode(allow_non_fake_inputs=True))
    else:
        a, w = make()
    count = count_flops(lambda: torch.ops.bench_test_flops.mystery(a) @ w)
    assert isinstance(count, FlopCount)
    assert count.by_op == {"aten.mm": 2 * 4 * 8 * 3}


def test_failing_formula_warns_and_counts_zero():
    formula = EXTRA_FORMULAS[aten.mv]
    with pytest.warns(FlopFormulaWarning):
        assert formula("not a tensor", None) == 0


def test_count_model_output_structures():
    class Dicty(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return {"aux": None, "logits": self.lin(x)}

    class Tuply(Dicty):
        def forward(self, x):
            return (None, self.lin(x), x)

    x = torch.randn(2, 4)
    for model in (Dicty(), Tuply()):
        assert count_model(model, (x,), "fwd_bwd").flops == 2 * (2 * 2 * 4 * 4)
        assert count_model(model, x).flops == 2 * 2 * 4 * 4
    with pytest.raises(ValueError):
        count_model(Dicty(), (x,), "bwd")
