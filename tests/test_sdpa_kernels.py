"""SDPA kernels: the GQA/MQA strategy (architectures.layers.attention), the executed-MAC arithmetic
(harness.instruments.flops.causal_scores, fused_attention_call) and the probe of a real step (harness.instruments.kernels).

Kernel choice on CUDA is decided by a rule measured on an H100 (gqa_strategy's docstring); here every
branch of the rule is checked, both strategies are run on the CPU against the eager reference, and the
FLOP counter is shown to give the same dense count whichever strategy runs. The probe runs real CPU steps;
what it reports is checked against an independent log of the dispatched ops and against hand counts.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from architectures.layers.attention import (
    Attention, causal_mask, eager_attention, expand_kv, gqa_strategy, sdpa_attention)
from harness.instruments import kernels
from harness.instruments.fake import build_fake
from harness.instruments.flops import causal_scores, count_flops, count_model, fused_attention_call
from harness.instruments.kernels import KernelReport, probe

aten = torch.ops.aten
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"
HEADS = [(8, 8), (8, 2), (8, 1)]                                  # MHA, GQA, MQA
HEAD_IDS = ["mha", "gqa", "mqa"]


class _OpLog(TorchDispatchMode):
    """An independent record of the dispatched ops: (packet name, k's shape for attention ops, kwargs)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...] | None, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func._overloadpacket)
        key_shape = tuple(args[1].shape) if "attention" in name and len(args) > 1 else None
        self.ops.append((name, key_shape, kwargs))
        return func(*args, **kwargs)

    def names(self) -> list[str]:
        return [n for n, _, _ in self.ops]


def _qkv(b, h, hkv, t, s, hd, grad=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, hd, generator=g, dtype=dtype)
    k, v = (torch.randn(b, hkv, s, hd, generator=g, dtype=dtype) for _ in range(2))
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def _triangle_skip(b, h, n, hd, backward=False):
    """MACs a causal kernel skips on a square n×n score matrix: the n(n-1)/2 strictly-upper scores per head,
    at 2·hd MACs each forward (QKᵀ, AV) and 5·hd backward (the 5 matmuls of the counter's convention)."""
    return b * h * (n * (n - 1) // 2) * (5 if backward else 2) * hd


# ------------------------------------------------------------------------------------------
# 1. The GQA strategy rule, every branch
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device,dtype,mask,hd,expected", [
    ("cpu", torch.float32, False, 64, "native"),          # the CPU flash kernel takes GQA natively ...
    ("cpu", torch.float32, True, 64, "native"),           # ... masks included
    ("cpu", torch.bfloat16, False, 512, "native"),
    ("cuda", torch.float32, False, 64, "expand"),         # fp32: only the efficient kernel, which refuses GQA
    ("cuda", torch.float64, False, 64, "expand"),
    ("cuda", torch.float32, True, 64, "expand"),
    ("cuda", torch.bfloat16, False, 64, "native"),        # bf16/fp16 without a mask: flash / cuDNN take GQA
    ("cuda", torch.float16, False, 256, "native"),        # flash's widest head
    ("cuda", torch.bfloat16, True, 64, "expand"),         # a mask: flash cannot, efficient refuses GQA
    ("cuda", torch.float16, False, 264, "expand"),        # wider than flash takes
    ("mps", torch.float32, False, 64, "native"),          # not measured: torch's own choice kept
    ("xpu", torch.bfloat16, True, 64, "native"),
])
def test_gqa_strategy_rule(device, dtype, mask, hd, expected):
    assert gqa_strategy(device, dtype, mask, hd) == expected


def test_expand_kv_groups_query_heads_as_enable_gqa_does():
    k = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)      # (B, Hkv, S, hd)
    out = expand_kv(k, 6)                                                     # G = 2
    assert out.shape == (2, 6, 4, 5)
    assert torch.equal(out, k.repeat_interleave(2, dim=1))                    # head j serves j·G … j·G+G-1
    assert out.is_contiguous()


# ------------------------------------------------------------------------------------------
# 2. Both strategies equal the eager reference (CPU), MHA/GQA/MQA, causal or not
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("h,hkv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("gqa", ["native", "expand", None])
def test_both_strategies_equal_eager(h, hkv, causal, gqa):
    q, k, v = _qkv(2, h, hkv, 12, 12, 16)
    ref = eager_attention(q, k, v, None, causal_mask(12, 12, q.device) if causal else None)
    got = sdpa_attention(q, k, v, None, None, is_causal=causal, gqa=gqa)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("h,hkv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("gqa", ["native", "expand"])
def test_both_strategies_equal_eager_with_bias_mask_and_gradients(h, hkv, gqa):
    q, k, v = _qkv(1, h, hkv, 10, 14, 8, grad=True)
    bias = torch.randn(1, h, 10, 14, generator=torch.Generator().manual_seed(1))
    mask = causal_mask(10, 14, q.device, offset=4)
    ref = eager_attention(q, k, v, bias, mask)
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    got = sdpa_attention(q, k, v, bias, mask, gqa=gqa)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(grads, grads_ref):                      # dk, dv keep Hkv heads: the copy sums back
        assert g.shape == g_ref.shape
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)


def test_cpu_keeps_native_gqa_in_the_flash_kernel():
    """On the CPU the default is native: the flash kernel really receives k/v with their Hkv heads, no copy."""
    q, k, v = _qkv(1, 8, 2, 16, 16, 16)
    log = _OpLog()
    with log:
        sdpa_attention(q, k, v, None, None, is_causal=True)
    attention = [(n, ks) for n, ks, _ in log.ops if "attention" in n]
    assert attention == [(FLASH_CPU, (1, 2, 16, 16))]
    assert not [n for n in log.names() if n in ("aten.clone", "aten.repeat_interleave", "aten.index_select")]
    log = _OpLog()
    with log:                                                       # forced expand: the kernel sees H heads
        sdpa_attention(q, k, v, None, None, is_causal=True, gqa="expand")
    assert [(n, ks) for n, ks, _ in log.ops if "attention" in n] == [(FLASH_CPU, (1, 8, 16, 16))]


# ------------------------------------------------------------------------------------------
# 3. The FLOP count does not depend on the strategy (the copy is data movement)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("h,hkv", HEADS[1:], ids=HEAD_IDS[1:])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
def test_count_is_the_dense_gqa_count_for_both_strategies(h, hkv, backward):
    b, n, hd = 2, 24, 16
    q, k, v = _qkv(b, h, hkv, n, n, hd, grad=backward)

    def run(gqa):
        def step():
            out = sdpa_attention(q, k, v, None, None, is_causal=True, gqa=gqa)
            if backward:
                out.sum().backward()
        return count_flops(step)
    native, expanded = run("native"), run("expand")
    dense = 2 * b * h * n * n * hd                                   # QKᵀ + AV with the query heads, MACs
    assert native.macs == expanded.macs == dense * (7 if backward else 2) // 2
    assert native.by_op == expanded.by_op                            # the same kernel op, the same formula
    if hkv > 1:
        assert expanded.bytes_moved > native.bytes_moved             # the copy moves bytes, not MACs
    elif not backward:                                               # MQA: a stride-0 view, no copy at all
        assert expanded.bytes_moved == native.bytes_moved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32-expand", "bf16-native"])
def test_fake_cuda_attention_counts_like_the_cpu(dtype):
    """The fake pass on CUDA (where SDPA falls back to the math path) counts the dense GQA forward too,
    whichever strategy the rule picks for the dtype."""
    def count(device):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        attn = build_fake(lambda: Attention(64, 8, 2).to(dtype), mode, torch.device(device))
        with mode:
            x = torch.randn(2, 32, 64, device=device, dtype=dtype)
            return count_model(attn, x, "fwd").macs, attn.mix_macs(2, 32)
    assert gqa_strategy("cuda", dtype, False, 8) == ("expand" if dtype == torch.float32 else "native")
    (cuda_macs, mix), (cpu_macs, _) = count("cuda"), count("cpu")
    assert cuda_macs == cpu_macs
    assert mix == 2 * 2 * 8 * 32 * 32 * 8                             # the core's formula: B·H·T·S·hd·2
    assert cuda_macs == mix + 2 * 32 * (64 * (64 + 2 * 2 * 8) + 64 * 64)   # + qkv and out projections


# ------------------------------------------------------------------------------------------
# 4. Executed scores of a causal kernel
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lq,lk", [(1, 1), (5, 5), (16, 16), (4, 9), (9, 4), (1, 7), (7, 1)])
def test_causal_scores_is_the_visible_triangle(lq, lk):
    ones = torch.ones(lq, lk)
    assert causal_scores(lq, lk) == int(ones.tril(0).sum())                  # SDPA's is_causal: top-left
    assert causal_scores(lq, lk, "bottom_right") == int(ones.tril(lk - lq).sum())
    if lq == lk:
        assert causal_scores(lq, lk) == causal_scores(lq, lk, "bottom_right") == lq * (lq + 1) // 2


def _fake_cuda(*shapes, dtype=torch.bfloat16):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return tuple(torch.randn(*s, device="cuda", dtype=dtype) for s in shapes)


@pytest.mark.parametrize("mask_type,align", [(0, None), (1, "top_left"), (2, "bottom_right")])
def test_efficient_kernel_mask_types(mask_type, align):
    b, h, hkv, lq, lk, d = 2, 4, 2, 6, 10, 8                          # (B, L, H, D) layout
    q, k, v = _fake_cuda((b, lq, h, d), (b, lk, hkv, d), (b, lk, hkv, d))
    call = fused_attention_call(aten._efficient_attention_forward.default,
                                (q, k, v, None, None, None, lq, lk, 0.0, mask_type, True))
    assert call.backend == "efficient" and not call.backward
    assert call.dense_macs == b * h * lq * lk * 2 * d
    kept = causal_scores(lq, lk, align) if align else lq * lk
    assert call.skipped_macs == b * h * (lq * lk - kept) * 2 * d


def test_sdpa_level_kernels_skip_only_when_causal():
    b, h, hkv, n, d = 1, 4, 1, 12, 16
    q, k, v = _fake_cuda((b, h, n, d), (b, hkv, n, d), (b, hkv, n, d))
    for op, args in [(aten._scaled_dot_product_flash_attention.default, (0.0,)),
                     (aten._scaled_dot_product_efficient_attention.default, (None, True, 0.0)),
                     (aten._scaled_dot_product_cudnn_attention.default, (None, True, 0.0))]:
        full = fused_attention_call(op, (q, k, v, *args))
        causal = fused_attention_call(op, (q, k, v, *args), {"is_causal": True})
        assert full.skipped_macs == 0 and full.dense_macs == causal.dense_macs == b * h * n * n * 2 * d
        assert causal.skipped_macs == _triangle_skip(b, h, n, d)
    assert fused_attention_call(aten.mm.default, (q[0, 0], k[0, 0].T)) is None


# ------------------------------------------------------------------------------------------
# 5. probe(): what a real step ran, and what it skipped
# ------------------------------------------------------------------------------------------

def test_probe_causal_sdpa_runs_flash_cpu_and_skips_the_upper_triangle():
    b, h, hkv, n, hd = 2, 8, 2, 32, 16
    q, k, v = _qkv(b, h, hkv, n, n, hd)
    report = probe(lambda: sdpa_attention(q, k, v, None, None, is_causal=True))
    assert report == KernelReport("flash_cpu", _triangle_skip(b, h, n, hd), 1)
    full = probe(lambda: sdpa_attention(q, k, v, None, None))
    assert full == KernelReport("flash_cpu", 0, 1)


def test_probe_fwd_bwd_adds_the_backward_skip():
    b, h, hkv, n, hd = 1, 4, 1, 20, 8
    q, k, v = _qkv(b, h, hkv, n, n, hd, grad=True)
    report = probe(lambda: sdpa_attention(q, k, v, None, None, is_causal=True).sum().backward())
    assert report.sdpa_backend == "flash_cpu" and report.sdpa_calls == 1
    assert report.causal_skipped_macs == _triangle_skip(b, h, n, hd) + _triangle_skip(b, h, n, hd, backward=True)


def test_probe_reports_what_really_ran_with_a_mask_and_with_dropout():
    """An explicit mask: this torch's CPU flash kernel takes it (checked independently: the op ran, with the
    mask); not causal, so nothing skipped. Dropout on the CPU: no fused kernel was dispatched, so math."""
    q, k, v = _qkv(1, 4, 2, 16, 16, 8)
    mask = causal_mask(16, 16, q.device)
    log = _OpLog()
    with log:
        report = probe(lambda: sdpa_attention(q, k, v, None, mask))
    ran = [(n, kw) for n, _, kw in log.ops if "attention" in n]
    assert report.sdpa_calls == 1 and report.causal_skipped_macs == 0
    if ran:
        assert [n for n, _ in ran] == [FLASH_CPU] and ran[0][1].get("attn_mask") is not None
        assert report.sdpa_backend == "flash_cpu"
    else:
        assert report.sdpa_backend == "math"
    log = _OpLog()
    with log:
        report = probe(lambda: sdpa_attention(q, k, v, None, None, dropout_p=0.5, is_causal=True))
    assert not [n for n in log.names() if "attention" in n] and "aten.bmm" in log.names()
    assert report == KernelReport("math", 0, 1)                       # the math path computes every score


def test_probe_without_sdpa_is_empty():
    q, k, v = _qkv(1, 4, 2, 16, 16, 8)
    assert probe(lambda: eager_attention(q, k, v, None, causal_mask(16, 16, q.device))) == KernelReport("", 0, 0)
    lin = nn.Linear(8, 8)
    assert probe(lambda: lin(torch.randn(3, 8)).sum().backward()) == KernelReport("", 0, 0)


class _Stack(nn.Module):
    """``n_layers`` causal self-attention layers (GQA), the second with dropout when ``math_layer``."""

    def __init__(self, n_layers: int, d: int = 32, h: int = 4, hkv: int = 2, math_layer: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Attention(d, h, hkv, dropout=0.5 if math_layer and i == 1 else 0.0)
                                    for i in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x, causal=True)
        return x


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_probe_a_model_with_several_layers(mode):
    torch.manual_seed(0)
    model, x = _Stack(3), torch.randn(2, 24, 32)
    b, n, h, hd = 2, 24, 4, 8
    if mode == "fwd":
        model.eval()
        step = lambda: model(x)                                      # noqa: E731
        with torch.no_grad():
            report = probe(step)
    else:
        model.train()
        report = probe(lambda: model(x).sum().backward())
    per_layer = _triangle_skip(b, h, n, hd) + (_triangle_skip(b, h, n, hd, True) if mode == "fwd_bwd" else 0)
    assert report == KernelReport("flash_cpu", 3 * per_layer, 3)
    macs = count_model(model, x, mode).macs
    dense_attention = 3 * 2 * b * h * n * n * hd // 2 * (7 if mode == "fwd_bwd" else 2)
    assert macs > dense_attention
    executed = report.executed_macs(macs)
    assert macs - executed == 3 * per_layer
    # the executed attention is the lower triangle, n(n+1)/2 of n² scores: a little over half the dense
    executed_attention = dense_attention - 3 * per_layer
    assert executed_attention * n * n == dense_attention * n * (n + 1) // 2


def test_probe_joins_several_backends():
    torch.manual_seed(0)
    model = _Stack(3, math_layer=True).train()                       # dropout in layer 2: the math path
    report = probe(lambda: model(torch.randn(1, 16, 32)))
    assert report.sdpa_backend == "flash_cpu+math" and report.sdpa_calls == 3
    assert report.causal_skipped_macs == 2 * _triangle_skip(1, 4, 16, 8)      # math skips nothing


def test_probe_sees_a_fused_op_called_directly_and_nn_multihead_attention():
    q, k, v = _qkv(1, 2, 2, 8, 8, 4)
    assert probe(lambda: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)) == \
        KernelReport("flash_cpu", _triangle_skip(1, 2, 8, 4), 1)
    mha, x = nn.MultiheadAttention(16, 2, batch_first=True), torch.randn(1, 8, 16)
    assert probe(lambda: mha(x, x, x, need_weights=False)).sdpa_backend == "flash_cpu"   # F.sdpa inside F.mha
    assert probe(lambda: mha(x, x, x, need_weights=True)) == KernelReport("", 0, 0)       # explicit weights


def test_probe_restores_sdpa_and_propagates_errors():
    original = F.scaled_dot_product_attention
    q, k, v = _qkv(1, 2, 2, 4, 4, 4)

    def broken():
        F.scaled_dot_product_attention(q, k, v)
        raise RuntimeError("the step failed")
    with pytest.raises(RuntimeError, match="the step failed"):
        probe(broken)
    assert F.scaled_dot_product_attention is original
    probe(lambda: F.scaled_dot_product_attention(q, k, v))
    assert F.scaled_dot_product_attention is original


def test_executed_macs_never_goes_below_zero():
    report = KernelReport("flash", 100, 1)
    assert report.executed_macs(250.0) == 150.0
    with pytest.raises(ValueError, match="not of the same step"):
        report.executed_macs(99.0)
    assert dataclasses.is_dataclass(report)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.sdpa_backend = "math"                                  # type: ignore[misc]


def test_kernels_module_names_its_public_api():
    assert set(kernels.__all__) == {"KernelReport", "probe"}


# ------------------------------------------------------------------------------------------
# 6. On the GPU machine: the rule's kernels really run, and the probe names them
# ------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,expected", [(torch.float32, "efficient"), (torch.bfloat16, None)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_gpu_gqa_runs_a_fused_kernel(dtype, expected, mode):
    """fp32 GQA goes through the efficient kernel (expanded k/v), bf16 through flash or cuDNN (native):
    never the math path; the output matches eager; the causal skip is the hand count."""
    b, h, hkv, n, hd = 1, 8, 2, 1024, 64
    dev = torch.device("cuda")
    q, k, v = (t.to(dev) for t in _qkv(b, h, hkv, n, n, hd, grad=False, dtype=dtype))
    q, k, v = (t.requires_grad_(mode == "fwd_bwd") for t in (q, k, v))

    def step():
        out = sdpa_attention(q, k, v, None, None, is_causal=True)
        if mode == "fwd_bwd":
            out.float().sum().backward()
        return out
    report = probe(step)
    torch.cuda.synchronize()
    assert "math" not in report.sdpa_backend and report.sdpa_calls == 1
    assert report.sdpa_backend == expected if expected else report.sdpa_backend in ("flash", "cudnn")
    skip = _triangle_skip(b, h, n, hd) + (_triangle_skip(b, h, n, hd, True) if mode == "fwd_bwd" else 0)
    assert report.causal_skipped_macs == skip
    with torch.no_grad():
        ref = eager_attention(q.float(), k.float(), v.float(), None, causal_mask(n, n, dev))
        torch.testing.assert_close(step().float() if mode == "fwd" else sdpa_attention(
            q, k, v, None, None, is_causal=True).float(), ref, rtol=2e-2, atol=2e-2)
