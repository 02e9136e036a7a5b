"""The one attention: exact against PyTorch's own, eager == SDPA, GQA/MQA semantics, causality, cache."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from architectures.layers.attention import Attention, KVCache, causal_mask

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
    ours = Attention(d, h, impl=impl).eval()
    _copy_from_mha(ours, mha)
    x = torch.randn(2, t, d)
    mask = ~causal_mask(t, t, x.device) if causal else None      # nn.MHA: True = masked out
    with torch.no_grad():
        ref, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        got = ours(x, causal=causal)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_eager_equals_sdpa(n_kv, causal):
    eager = Attention(64, 8, n_kv, impl="eager").eval()
    sdpa = Attention(64, 8, n_kv, impl="sdpa").eval()
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
    gqa = Attention(d, h, kv, impl="eager").eval()
    mha = Attention(d, h, h, impl="eager").eval()
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
    att = Attention(32, 4, 2, impl=impl).eval()
    x = torch.randn(1, 10, 32)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 32)
    with torch.no_grad():
        torch.testing.assert_close(att(x, causal=True)[:, :6], att(y, causal=True)[:, :6])
        assert not torch.allclose(att(x, causal=False)[:, :6], att(y, causal=False)[:, :6])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_kv_cache_decoding_equals_full_pass(impl):
    att = Attention(32, 4, 1, impl=impl).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        full = att(x, causal=True)
        cache = KVCache()
        prefix = att(x[:, :4], causal=True, cache=cache)
        steps = [att(x[:, i:i + 1], causal=True, cache=cache) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat([prefix, *steps], dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.nbytes() == 2 * 2 * 1 * 7 * 8 * 4      # K and V: (B=2, Hkv=1, L=7, hd=8) fp32


def test_cross_attention_shapes_and_parity():
    eager = Attention(32, 4, 2, impl="eager", kind="cross", context_dim=24).eval()
    sdpa = Attention(32, 4, 2, impl="sdpa", kind="cross", context_dim=24).eval()
    sdpa.load_state_dict(eager.state_dict())
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 11, 24)
    with torch.no_grad():
        out = eager(x, ctx)
        torch.testing.assert_close(out, sdpa(x, ctx), rtol=1e-5, atol=1e-5)
    assert out.shape == (2, 5, 32)


@pytest.mark.parametrize("bad", [dict(n_heads=5), dict(n_kv_heads=3), dict(n_kv_heads=0), dict(impl="flash2")])
def test_invalid_configs_raise(bad):
    kw = dict(d_model=64, n_heads=8, n_kv_heads=None, impl="sdpa") | bad
    with pytest.raises(ValueError):
        Attention(kw.pop("d_model"), kw.pop("n_heads"), kw.pop("n_kv_heads"), impl=kw.pop("impl"))
