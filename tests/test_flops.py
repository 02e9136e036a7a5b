"""Tests of harness.instruments.flops: published torchvision counts, attention/conv/matmul formulas, robustness."""
from __future__ import annotations

import time
import warnings

import psutil
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils import flop_counter as stock

from harness.instruments import flops as flops_module
from harness.instruments.fake import build_fake
from harness.instruments.flops import (
    EXTRA_FORMULAS,
    FUSED_ATTENTION,
    FlopCount,
    FlopFormulaError,
    UncountedFlopsError,
    count_flops,
    count_model,
    count_params,
    dependency_trace,
    einsum_flops,
    sdpa_backward_flops,
    sdpa_flops,
)
from harness.engine.runner import fake_pass
from harness.contract.spec import ArchSpec, Workload
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


def test_fake_counting_costs_no_arithmetic():
    """Counting on fake tensors does no arithmetic: 256 images cost what one does (a real forward would take
    ~256× longer). Relative, best of three, so the machine's speed and load do not decide it."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_fake(lambda: torchvision.models.get_model("vit_b_16", weights=None), mode, CPU).eval()

    def best(batch: int) -> float:
        x = fake_inputs(lambda: torch.randn(batch, 3, 224, 224), mode)
        count_model(model, (x,))  # warm-up (first-call dispatch caches)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            count_model(model, (x,))
            times.append(time.perf_counter() - t)
        return min(times)
    assert best(256) < 3 * best(1)


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


def test_calls_are_each_counting_op_in_order_with_the_totals_formulas():
    """``calls=True``: one entry per op that counted work, in dispatch order, summing to the total — the CPU fused
    attention included (torch's stock registry counts it 0)."""
    layer = nn.Linear(16, 64)
    q = torch.randn(1, 2, 8, 32)

    def run() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, q, q)
            layer(torch.randn(3, 16))
    count = count_flops(run, calls=True)
    assert [c.op for c in count.calls] == ["aten._scaled_dot_product_flash_attention_for_cpu", "aten.addmm"]
    assert [c.macs for c in count.calls] == [2 * 2 * 8 * 8 * 32, 3 * 16 * 64]
    assert count.calls[1].out_shape == (3, 64)
    assert sum(c.flops for c in count.calls) == count.flops
    assert count_flops(run).calls == ()                                   # recorded only when asked


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


def test_long_sdpa_on_fake_tensors_computes_nothing():
    """Counting a 16k-token SDPA on fake tensors allocates nothing real (its scores alone would be 34 GB)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    n = 16384
    q, k, v = fake_inputs(lambda: (torch.randn(1, 32, n, 128), torch.randn(1, 8, n, 128),
                                   torch.randn(1, 8, n, 128)), mode)
    rss = psutil.Process().memory_info().rss
    count = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    assert psutil.Process().memory_info().rss - rss < 64 * 2**20
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
        with torch.no_grad():
            count = count_flops(lambda: enc(x, src_key_padding_mask=pad))   # a formula failure would raise
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
    for name in FUSED_ATTENTION:                       # every fused attention op of this build, fwd and bwd
        assert getattr(aten, name) in EXTRA_FORMULAS
    assert {"_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
            "_efficient_attention_backward", "_cudnn_attention_backward"} <= set(FUSED_ATTENTION)


# ------------------------------------------------------------------------------------------
# 2b. Every SDPA aten op, GQA-aware, called directly on fake CUDA tensors (no GPU needed)
# ------------------------------------------------------------------------------------------

SDPA_HEADS = [(8, 8), (8, 2), (8, 1)]


def _fake_cuda(*shapes, dtype=torch.bfloat16):
    """Fake tensors on "cuda": they exist on a machine without a GPU (shapes and dtypes only)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        return tuple(torch.randn(*s, device="cuda", dtype=dtype) for s in shapes)


def _sdpa_aten_calls(q, k, v, go):
    """For each SDPA kernel: a function calling its forward op and then its backward op, as SDPA's
    autograd does (q/k/v (B, H, L, D); the raw kernels get (B, L, H, D))."""
    lq, lk = q.shape[2], k.shape[2]
    qt, kt, vt, gt = (t.transpose(1, 2) for t in (q, k, v, go))

    def flash():
        o = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        aten._scaled_dot_product_flash_attention_backward(go, q, k, v, o[0], o[1], o[2], o[3], o[4], o[5], 0.0,
                                                          True, o[6], o[7])

    def efficient():
        o = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)
        aten._scaled_dot_product_efficient_attention_backward(go, q, k, v, None, o[0], o[1], o[2], o[3], 0.0,
                                                              [True, True, True, False], True)

    def cudnn():
        o = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)
        aten._scaled_dot_product_cudnn_attention_backward(go, q, k, v, o[0], o[1], o[6], o[7], None, o[2], o[3],
                                                          o[4], o[5], 0.0, True)

    def flash_raw():
        o = aten._flash_attention_forward(qt, kt, vt, None, None, lq, lk, 0.0, True, False)
        aten._flash_attention_backward(gt, qt, kt, vt, o[0], o[1], None, None, lq, lk, 0.0, True, o[2], o[3])

    def efficient_raw():
        o = aten._efficient_attention_forward(qt, kt, vt, None, None, None, lq, lk, 0.0, 1, True)
        aten._efficient_attention_backward(gt, qt, kt, vt, None, o[0], None, None, lq, lk, o[1], 0.0, o[2], o[3],
                                           1, False)
    return {"flash": (flash, "_scaled_dot_product_flash_attention"),
            "efficient": (efficient, "_scaled_dot_product_efficient_attention"),
            "cudnn": (cudnn, "_scaled_dot_product_cudnn_attention"),
            "flash_raw": (flash_raw, "_flash_attention_forward"),
            "efficient_raw": (efficient_raw, "_efficient_attention_forward")}


def _hand_count(b, hq, lq, lk, d):
    """FLOPs by hand: forward QKᵀ + AV = 2 matmuls of Lq·Lk·D per query head; backward the counter's 5."""
    mm = 2 * b * hq * lq * lk * d
    return 2 * mm, 5 * mm


@pytest.mark.parametrize("hq,hkv", SDPA_HEADS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn", "flash_raw", "efficient_raw"])
def test_cuda_sdpa_ops_on_fake_tensors(hq, hkv, kernel):
    b, lq, lk, d = 2, 24, 40, 16
    q, k, v, go = _fake_cuda((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d), (b, hq, lq, d))
    run, fwd_name = _sdpa_aten_calls(q, k, v, go)[kernel]
    bwd_name = fwd_name.replace("_forward", "_backward") if fwd_name.endswith("_forward") else fwd_name + "_backward"
    count = count_flops(run)
    fwd, bwd = _hand_count(b, hq, lq, lk, d)
    assert count.by_op == {f"aten.{fwd_name}": fwd, f"aten.{bwd_name}": bwd}
    assert count.flops == fwd + bwd and count.complete


@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn", "flash_raw", "efficient_raw"])
def test_cuda_sdpa_ops_count_gqa_where_torch_2_11_asserted(kernel, monkeypatch):
    """torch 2.11 (the GPU machine's) asserts Hq == Hkv in its own formulas: "sdpa_flop_count: query/key/value
    shapes are incompatible" failed every bf16 GQA case on the H100. With the stock formulas replaced by
    2.11's behaviour, our formulas still count: they, not the stock ones, are what the counter uses."""
    def torch_2_11(*args, **kwargs):
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
    for name in FUSED_ATTENTION:
        if getattr(aten, name) in stock.flop_registry:
            monkeypatch.setitem(stock.flop_registry, getattr(aten, name), torch_2_11)
    b, hq, hkv, n, d = 1, 8, 2, 32, 64
    q, k, v, go = _fake_cuda((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d), (b, hq, n, d))
    run, _ = _sdpa_aten_calls(q, k, v, go)[kernel]
    with pytest.raises(AssertionError, match="incompatible"):          # the stock counter alone fails ...
        with stock.FlopCounterMode(display=False):
            run()
    assert count_flops(run).flops == sum(_hand_count(b, hq, n, n, d))  # ... ours counts


@pytest.mark.parametrize("hq,hkv", SDPA_HEADS, ids=["mha", "gqa", "mqa"])
def test_cudnn_raw_kernel_formulas(hq, hkv):
    """``_cudnn_attention_forward``/``_backward`` have no fake kernel (they need a driver): their formulas are
    called directly, on fake CUDA tensors (a formula reads shapes only)."""
    b, lq, lk, d = 2, 12, 20, 32
    q, k, v, go = _fake_cuda((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d), (b, hq, lq, d))
    fwd, bwd = _hand_count(b, hq, lq, lk, d)
    assert EXTRA_FORMULAS[aten._cudnn_attention_forward](q, k, v, None, None, None, lq, lk, True, 0.0, True) == fwd
    assert EXTRA_FORMULAS[aten._cudnn_attention_backward](go, q, k, v, q, None, None, None, None, None, None,
                                                          lq, lk, 0.0, True) == bwd


def test_packed_variable_length_batches_count_each_sequence():
    """Nested (packed) batches: (T, H, D) with cumulative offsets; real offsets give each sequence's own
    length, fake ones the maximum (an upper bound, as the stock formulas do)."""
    hq, hkv, d = 4, 2, 8
    lens = [3, 7, 5]
    q, k, v, go = (torch.randn(sum(lens), h, d) for h in (hq, hkv, hkv, hq))
    cum = torch.tensor([0, 3, 10, 15], dtype=torch.int32)
    fwd = sum(_hand_count(1, hq, n, n, d)[0] for n in lens)
    bwd = sum(_hand_count(1, hq, n, n, d)[1] for n in lens)
    assert EXTRA_FORMULAS[aten._flash_attention_forward](q, k, v, cum, cum, 7, 7, 0.0, False, False) == fwd
    assert EXTRA_FORMULAS[aten._flash_attention_backward](go, q, k, v, q, None, cum, cum, 7, 7, 0.0, False,
                                                          None, None) == bwd
    q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))                    # the efficient kernel: (1, T, H, D)
    assert EXTRA_FORMULAS[aten._efficient_attention_forward](q4, k4, v4, None, cum, cum, 7, 7, 0.0, 0) == fwd
    fake_cum = _fake_cuda((4,), dtype=torch.float32)[0]
    assert EXTRA_FORMULAS[aten._flash_attention_forward](q, k, v, fake_cum, fake_cum, 7, 7, 0.0, False,
                                                         False) == 3 * _hand_count(1, hq, 7, 7, d)[0]


def test_incompatible_attention_shapes_are_a_gap_not_zero():
    q, k, v = _fake_cuda((1, 6, 8, 16), (1, 4, 8, 16), (1, 4, 8, 16))    # 6 query heads over 4 k/v heads
    with pytest.raises(UncountedFlopsError, match="_scaled_dot_product_efficient_attention"):
        count_flops(lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, False))


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
def test_an_op_no_formula_knows_is_a_gap_not_zero(fake):
    """A custom op's work is unknown: the count raises naming it, or (allow_gaps) comes back incomplete
    with the gap recorded beside what it could count — never a silent 0."""
    make = lambda: (torch.randn(4, 8), torch.randn(8, 3))  # noqa: E731
    if fake:
        a, w = fake_inputs(make, FakeTensorMode(allow_non_fake_inputs=True))
    else:
        a, w = make()
    run = lambda: torch.ops.bench_test_flops.mystery(a) @ w  # noqa: E731
    with pytest.raises(UncountedFlopsError, match="bench_test_flops.mystery"):
        count_flops(run)
    count = count_flops(run, allow_gaps=True)
    assert isinstance(count, FlopCount) and not count.complete
    assert set(count.gaps) == {"bench_test_flops.mystery"}
    assert count.by_op == {"aten.mm": 2 * 4 * 8 * 3}
    assert count_flops(lambda: a @ w).complete             # elementwise-free matmul: nothing missing


def test_a_matmul_op_without_formula_is_a_gap():
    """aten ops that do matmul work but have no formula (here nn.Bilinear's _trilinear) are gaps."""
    bil = nn.Bilinear(4, 5, 3)
    with pytest.raises(UncountedFlopsError, match="_trilinear"):
        count_model(bil, (torch.randn(2, 4), torch.randn(2, 5)))


def test_failing_formula_is_a_gap_or_an_error_never_zero(monkeypatch):
    with pytest.raises(FlopFormulaError, match="aten.mv"):             # outside a count: an error naming the op
        EXTRA_FORMULAS[aten.mv]("not a tensor", None)

    def fails(*args, **kwargs):
        raise ValueError("cannot read these arguments")
    monkeypatch.setitem(EXTRA_FORMULAS, aten.mv, flops_module._registered(fails, [aten.mv], False))
    a, x = torch.randn(5, 6), torch.randn(6)
    with pytest.raises(UncountedFlopsError, match="aten.mv.*formula failed"):
        count_flops(lambda: a @ x)
    count = count_flops(lambda: a @ x, allow_gaps=True)
    assert count.flops == 0 and not count.complete and "aten.mv" in count.gaps


@pytest.mark.parametrize("equation, shapes, flops", [
    ("ij,jk->ik", [(2, 3), (3, 4)], 2 * 2 * 3 * 4),
    ("ij,jk->ik", [(2, 1), (1, 4)], 2 * 2 * 1 * 4),
    ("ii->i", [(3, 3)], 0),                                  # one operand: a diagonal/reduction
    ("i,i,i->i", [(3,), (3,), (3,)], 0),                     # three operands, nothing contracted
    ("ij,jk,kl->il", [(2, 1), (1, 1), (1, 5)], None),        # three operands, contracted: no formula
])
def test_einsum_flops(equation, shapes, flops):
    assert einsum_flops(equation, shapes) == flops


def test_an_einsum_lowered_to_mul_is_counted_or_a_gap():
    a, b, c = torch.randn(2, 1), torch.randn(1, 1), torch.randn(1, 5)
    assert count_flops(lambda: torch.einsum("ij,jk->ik", a, b)).flops == 2 * 2 * 1 * 1
    with pytest.raises(UncountedFlopsError, match="einsum"):
        count_flops(lambda: torch.einsum("ij,jk,kl->il", a, b, c))
    assert count_flops(lambda: torch.einsum("i,i,i->i", *(torch.randn(3),) * 3)).complete


def test_module_depth_attributes_nested_modules():
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)))
    x = torch.randn(3, 4)
    shallow, deep = count_model(model, (x,)), count_model(model, (x,), module_depth=None)
    assert "Sequential.0.1" not in shallow.by_module
    assert deep.by_module["Sequential.0.0"] == 2 * 3 * 4 * 8 and deep.by_module["Sequential.0.1"] == 2 * 3 * 8 * 2


def test_lstm_formula_equals_the_unrolled_cells_matmuls():
    """The fused-LSTM formula (aten.mkldnn_rnn_layer) against a step-by-step nn.LSTMCell loop with the same
    weights, counted by the stock matmul formulas: equal; a cell with one more matmul per step is not."""
    d, n, b = 8, 6, 2
    lstm = nn.LSTM(d, d, batch_first=True)
    cell = nn.LSTMCell(d, d)
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in lstm.state_dict().items()})
    x = torch.randn(b, n, d)                                                          # (B, n, d)

    def loop(extra: bool) -> None:
        h = c = torch.zeros(b, d)
        for t in range(n):
            h, c = cell(x[:, t], (h, c))
            if extra:
                h = h @ cell.weight_hh[:d].T                                           # one more matmul
    fused = count_model(lstm, (x,))
    assert set(fused.by_op) == {"aten.mkldnn_rnn_layer"}
    assert fused.macs == count_flops(lambda: loop(False)).macs == n * b * 8 * d * d
    assert fused.macs != count_flops(lambda: loop(True)).macs


def test_dependency_trace_depth_and_bytes():
    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def chain(k: int) -> None:
        y = x
        for _ in range(k):
            y = (y @ w).t().t()                              # views add no depth
    assert dependency_trace(lambda: chain(3)).depth == 3
    assert dependency_trace(lambda: [x @ w for _ in range(5)]).depth == 1     # independent: parallel
    trace = dependency_trace(lambda: x.double() @ w.double())
    assert [op.out_bytes for op in trace.ops if op.name == "aten.mm"] == [4 * 8 * 8]


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


def test_a_case_with_uncountable_work_keeps_its_other_metrics_and_names_the_gap():
    """The runner's fake pass never stores a partial or zero MAC count: with gaps the MACs are left out and
    the ops named, while params and the memory estimate are kept; without a gaps dict it raises."""
    spec = ArchSpec("bilinear", "test", None, lambda cfg: nn.Bilinear(8, 8, 4),
                    lambda cfg, w, device: (torch.randn(w.batch_size, 8, device=device),
                                            torch.randn(w.batch_size, 8, device=device)))
    gaps: dict[str, str] = {}
    out = fake_pass(spec, Workload(batch_size=2), torch.device("cpu"), True, gaps)
    assert "macs" not in out and "flops" not in out and out["params"] == 8 * 8 * 4 + 4
    assert out["est_peak_bytes"] > 0 and any("_trilinear" in op for op in gaps)
    with pytest.raises(UncountedFlopsError, match="_trilinear"):
        fake_pass(spec, Workload(batch_size=2), torch.device("cpu"), True)
