"""The one attention: exact against PyTorch's own, eager == SDPA, GQA/MQA semantics, causality, cache."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from architectures.inputs import hidden_inputs
from architectures.layers.attention import (
    Attention,
    ExactCore,
    causal_mask,
    eager_attention,
    sdpa_attention,
)
from architectures.layers.kv_cache import StaticKVCache
from architectures.single_layer import from_torch
from harness.contract import registry
from harness.contract.spec import Workload
from harness.contract.suite import load_suite
from tests.helpers import counted_cost

torch.manual_seed(0)


def _copy_from_mha(ours: Attention, mha: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ours.qkv.weight.copy_(mha.in_proj_weight)
        ours.qkv.bias.copy_(mha.in_proj_bias)
        ours.out.weight.copy_(mha.out_proj.weight)
        ours.out.bias.copy_(mha.out_proj.bias)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_nn_multihead_attention(impl, causal):
    d, h, t = 64, 4, 10
    mha = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = Attention(d, h, core=impl).eval()
    _copy_from_mha(ours, mha)
    x = torch.randn(2, t, d)
    mask = ~causal_mask(t, t, x.device) if causal else None      # nn.MHA: True = masked out
    with torch.no_grad():
        ref, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        got = ours(x, causal=causal)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_the_core_is_injected_and_a_kernel_name_means_the_exact_core():
    named = Attention(32, 4, 2, core="eager")
    injected = Attention(32, 4, 2, core=ExactCore("eager"))
    assert isinstance(named.core, ExactCore) and named.core.impl == "eager"
    assert set(named.state_dict()) == {"qkv.weight", "qkv.bias", "out.weight", "out.bias"}   # the core owns nothing
    injected.load_state_dict(named.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(injected(x, causal=True), named(x, causal=True))
    assert named.mix_macs(2, 5) == 2 * 2 * 4 * 5 * 5 * 8


@pytest.mark.parametrize("n_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_eager_equals_sdpa(n_kv, causal):
    eager = Attention(64, 8, n_kv, core="eager").eval()
    sdpa = Attention(64, 8, n_kv, core="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    x = torch.randn(2, 12, 64)
    bias = torch.randn(1, 8, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(eager(x, causal=causal), sdpa(x, causal=causal), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(eager(x, causal=causal, bias=bias), sdpa(x, causal=causal, bias=bias),
                                   rtol=1e-5, atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_heads():
    """GQA is MHA whose k/v heads are shared: repeating each k/v head's weights gives MHA exactly."""
    d, h, kv = 64, 8, 2
    hd = d // h
    gqa = Attention(d, h, kv, core="eager").eval()
    mha = Attention(d, h, h, core="eager").eval()
    wq, wk, wv = gqa.qkv.weight.split([d, kv * hd, kv * hd])
    bq, bk, bv = gqa.qkv.bias.split([d, kv * hd, kv * hd])

    def rep(w):   # (kv·hd, ...) -> (h·hd, ...), each kv head serving h/kv query heads
        return w.view(kv, hd, *w.shape[1:]).repeat_interleave(h // kv, dim=0).reshape(h * hd, *w.shape[1:])
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        mha.out.load_state_dict(gqa.out.state_dict())
        x = torch.randn(2, 9, d)
        torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_causal_output_ignores_future_tokens(impl):
    att = Attention(32, 4, 2, core=impl).eval()
    x = torch.randn(1, 10, 32)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 32)
    with torch.no_grad():
        torch.testing.assert_close(att(x, causal=True)[:, :6], att(y, causal=True)[:, :6])
        assert not torch.allclose(att(x, causal=False)[:, :6], att(y, causal=False)[:, :6])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_kv_cache_decoding_equals_full_pass(impl):
    att = Attention(32, 4, 1, core=impl).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        full = att(x, causal=True)
        cache = StaticKVCache(2, 1, 8, 7, like=x)
        prefix = att(x[:, :4], causal=True, cache=cache)
        steps = [att(x[:, i:i + 1], causal=True, cache=cache) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat([prefix, *steps], dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.nbytes() == 2 * 2 * 1 * 7 * 8 * 4      # K and V: (B=2, Hkv=1, L=7, hd=8) fp32


def test_cross_attention_shapes_and_parity():
    eager = Attention(32, 4, 2, core="eager", kind="cross", context_dim=24).eval()
    sdpa = Attention(32, 4, 2, core="sdpa", kind="cross", context_dim=24).eval()
    sdpa.load_state_dict(eager.state_dict())
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 11, 24)
    with torch.no_grad():
        out = eager(x, ctx)
        torch.testing.assert_close(out, sdpa(x, ctx), rtol=1e-5, atol=1e-5)
    assert out.shape == (2, 5, 32)


@pytest.mark.parametrize("bad", [dict(n_heads=5), dict(n_kv_heads=3), dict(n_kv_heads=0), dict(core="flash2"),
                                 dict(kind="sideways")])
def test_invalid_configs_raise(bad):
    kw = dict(d_model=64, n_heads=8, n_kv_heads=None, core="sdpa", kind="self") | bad
    with pytest.raises(ValueError):
        Attention(**kw)


def _reference(q, k, v, bias=None, mask=None):
    """softmax(q kᵀ/√d + bias, masked) v through F.scaled_dot_product_attention with k/v heads repeated."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    attn_mask = bias
    if mask is not None:
        attn_mask = mask if bias is None else bias.masked_fill(~mask, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_functions_equal_torch_sdpa(n_kv, with_bias, with_mask):
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, n_kv, 7, 8), torch.randn(2, n_kv, 7, 8)
    bias = torch.randn(4, 5, 7) if with_bias else None
    mask = causal_mask(5, 7, q.device, offset=2) if with_mask else None
    ref = _reference(q, k, v, bias, mask)
    torch.testing.assert_close(eager_attention(q, k, v, bias, mask), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sdpa_attention(q, k, v, bias, mask), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_gradients_equal_nn_multihead_attention(impl):
    d, h = 32, 4
    mha = nn.MultiheadAttention(d, h, batch_first=True)
    ours = Attention(d, h, core=impl)
    _copy_from_mha(ours, mha)
    x = torch.randn(2, 6, d, requires_grad=True)
    mask = ~causal_mask(6, 6, x.device)
    mha(x, x, x, attn_mask=mask, need_weights=False)[0].square().sum().backward()
    ref = x.grad.clone(), mha.in_proj_weight.grad.clone(), mha.out_proj.weight.grad.clone()
    x.grad = None
    ours(x, causal=True).square().sum().backward()
    for got, want in zip((x.grad, ours.qkv.weight.grad, ours.out.weight.grad), ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_cross_attention_equals_nn_multihead_attention(impl):
    d, h = 32, 4
    mha = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = Attention(d, h, core=impl, kind="cross").eval()
    with torch.no_grad():
        ours.q.weight.copy_(mha.in_proj_weight[:d])
        ours.q.bias.copy_(mha.in_proj_bias[:d])
        ours.kv.weight.copy_(mha.in_proj_weight[d:])
        ours.kv.bias.copy_(mha.in_proj_bias[d:])
        ours.out.load_state_dict(mha.out_proj.state_dict())
        x, ctx = torch.randn(2, 5, d), torch.randn(2, 9, d)
        torch.testing.assert_close(ours(x, ctx), mha(x, ctx, ctx, need_weights=False)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_position_hooks_with_cache_offset_equal_full_pass(impl, positions):
    """RoPE (rotate hook) and ALiBi (bias hook) at a KV-cache offset give the full pass's outputs."""
    from architectures.layers.positions import make_positions
    pos = make_positions(positions, 32, 0, n_heads=4)
    att = Attention(32, 4, 2, core=impl).eval()
    x = torch.randn(2, 9, 32)

    def run(chunk, cache, offset):
        t = chunk.shape[1]
        at, s = cache.span(t) if cache is not None else (offset, offset + t)   # a decode step sees every slot
        return att(chunk, causal=True, bias=pos.bias(t, s, at), rotate=pos.rotate, cache=cache)
    with torch.no_grad():
        full = run(x, None, 0)
        cache = StaticKVCache(2, 2, 8, 9, like=x)
        parts = [run(x[:, :6], cache, 0)] + [run(x[:, i:i + 1], cache, i) for i in (6, 7, 8)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_eager_dropout_is_on_the_attention_weights():
    att = Attention(32, 4, core="eager", dropout=0.3).train()
    x = torch.randn(2, 6, 32)
    torch.manual_seed(5)
    got = att(x, causal=True)
    with torch.no_grad():                                   # the same computation spelled out
        q, k, v = att.qkv(x).split(32, dim=-1)
        q, k, v = (t.view(2, 6, 4, 8).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~causal_mask(6, 6, x.device), float("-inf"))
        torch.manual_seed(5)
        weights = torch.nn.functional.dropout(scores.softmax(-1), p=0.3, training=True)
        want = att.out((weights @ v).transpose(1, 2).reshape(2, 6, 32))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_dropout_only_in_training(impl):
    drop = Attention(32, 4, core=impl, dropout=0.5)
    plain = Attention(32, 4, core=impl)
    plain.load_state_dict(drop.state_dict())
    x = torch.randn(2, 6, 32)
    assert not torch.allclose(drop.train()(x), drop(x))
    with torch.no_grad():
        torch.testing.assert_close(drop.eval()(x), plain.eval()(x))


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
def test_scale_is_the_same_in_eager_and_sdpa_and_none_means_inverse_sqrt_head_dim(scale):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 32)
    eager = Attention(32, 4, core="eager", scale=scale)
    fused = Attention(32, 4, core="sdpa", scale=scale)
    fused.load_state_dict(eager.state_dict())
    torch.testing.assert_close(eager(x, causal=True), fused(x, causal=True))
    explicit = Attention(32, 4, core="eager", scale=1 / 8 ** 0.5)
    explicit.load_state_dict(eager.state_dict())
    same = torch.allclose(explicit(x), eager(x), atol=1e-6)
    assert same == (scale is None)


def test_attention_core_uses_the_shared_core_and_rejects_unknown_impls() -> None:
    from architectures.attention_core import AttentionCore, AttentionCoreConfig, core_cost, core_inputs
    from harness.contract.spec import Workload
    with pytest.raises(ValueError, match="unknown attention impl"):
        AttentionCoreConfig(attn_impl="flash")
    w = Workload(batch_size=2, seq_len=16)
    q, k, v = core_inputs(AttentionCoreConfig(d_model=32, n_heads=4), w, torch.device("cpu"))
    eager = AttentionCore(AttentionCoreConfig(d_model=32, n_heads=4, attn_impl="eager"))(q, k, v)
    sdpa = AttentionCore(AttentionCoreConfig(d_model=32, n_heads=4, attn_impl="sdpa"))(q, k, v)
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)
    assert core_cost(AttentionCoreConfig(d_model=32, n_heads=4), w)["macs"] == 2 * 2 * 4 * 16 * 16 * 8


# ---------------------------------------------------------------------------------------------
# Ours vs PyTorch's own modules (architectures.torch_reference; suites/ours_vs_torch.toml)
# ---------------------------------------------------------------------------------------------

PAIRS = [("encoder-layer", "torch-encoder-layer", {}),
         ("encoder-layer", "torch-encoder-layer", {"activation": "gelu", "norm_placement": "pre"}),
         ("attention-layer", "torch-mha", {})]
FUSED = {"aten._transformer_encoder_layer_fwd.default", "aten._native_multi_head_attention.default"}


class _Ops(TorchDispatchMode):
    """The aten ops a call dispatches (a dispatch mode: unlike a function mode, it leaves torch's fast path on)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fastpath", [True, False], ids=["fastpath", "ordinary"])
@pytest.mark.parametrize("ours, theirs, over", PAIRS, ids=["layer", "layer-gelu-pre", "attention"])
def test_ours_is_the_torch_reference_weight_for_weight(ours, theirs, over, fastpath):
    """Loaded with the reference's weights, ours computes the same function: the forward in eval + no_grad
    (against torch's fused fast path, or its ordinary path) and every gradient in training."""
    ref_spec = registry.resolve(theirs, **dict(registry.get(theirs).small) | over, fastpath=fastpath)
    our_spec = registry.resolve(ours, **dict(registry.get(ours).small) | over)
    torch.manual_seed(0)
    ref = ref_spec.build(ref_spec.config)
    mine = our_spec.build(our_spec.config)
    mine.load_state_dict(from_torch(ref.state_dict()))
    (x,) = hidden_inputs(our_spec.config, Workload(batch_size=3, seq_len=7), torch.device("cpu"))
    with torch.no_grad(), _Ops() as ops:
        want = ref.eval()(x)
    assert bool(FUSED & ops.seen) == fastpath, ops.seen                        # the path the suite times
    with torch.no_grad():
        torch.testing.assert_close(mine.eval()(x), want, rtol=1e-5, atol=1e-5)
    x.requires_grad_()
    mine.train()(x).square().sum().backward()
    got, x.grad = x.grad, None
    ref.train()(x).square().sum().backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-4, atol=1e-5)
    ref_grads = from_torch({name: p.grad for name, p in ref.named_parameters()})
    for name, p in mine.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_ours_vs_torch_suite_compares_equal_work():
    """Every line of a comparison (ours, torch's, torch's ordinary path) has the same parameters and
    forward MACs at the same mode, counted on fake tensors."""
    suite = load_suite("ours_vs_torch", quick=True)
    groups: dict[tuple[str, str], set] = {}
    for case in suite.cases:
        spec = registry.resolve(case.arch, **dict(case.overrides))
        groups.setdefault((case.line.split(",")[0], case.workload.mode), set()).add(counted_cost(spec, case.workload))
    assert len(groups) == 8 and all(len(costs) == 1 for costs in groups.values()), groups
