"""Efficient attention: exactness of the blocked kernels against dense masked references,
approximation error against exact attention, O(n) counted MACs, window memory, and the LRA
family's analytic cost against the counter (hypothesis)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from architectures.efficient_attention import LongEncoder, LongEncoderConfig, cost, make_attention, token_inputs
from architectures.layers.attention import Attention, eager_attention
from architectures.layers.kv_cache import StaticKVCache
from architectures.layers.efficient import (
    BigBirdCore,
    LinformerCore,
    PerformerCore,
    SlidingWindowCore,
    approximation_error,
    bigbird_pattern,
)
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_model, count_params
from harness.instruments.memory import measure_peak_cpu
from harness.contract.spec import Workload

CPU = torch.device("cpu")


def split_qkv(mod, x):
    """The (q, k, v) an Attention's core mixes, for reference computations."""
    b, t, d = x.shape
    hd, h, hkv = mod.head_dim, mod.n_heads, mod.n_kv_heads
    q, kv = mod.qkv(x).split([d, 2 * hkv * hd], dim=-1)
    return q.view(b, t, h, hd).transpose(1, 2), *kv.view(b, t, 2, hkv, hd).permute(2, 0, 3, 1, 4)


def variants(d=32, h=4, kv=2):
    """name -> (the one Attention with that core, whether it is called causal)."""
    return {
        "window": (Attention(d, h, kv, core=SlidingWindowCore(3)), False),
        "window-causal": (Attention(d, h, kv, core=SlidingWindowCore(3, impl="eager")), True),
        "linformer": (Attention(d, h, kv, core=LinformerCore(max_seq_len=32, proj_len=5)), False),
        "performer": (Attention(d, h, kv, core=PerformerCore(d // h, n_features=12)), False),
        "bigbird": (Attention(d, h, kv, core=BigBirdCore(block=3, n_global=1, n_random=1)), False),
    }


@pytest.mark.parametrize("t", [1, 2, 7, 16, 31])
def test_shapes_and_gradients(t):
    torch.manual_seed(0)
    x = torch.randn(2, t, 32, requires_grad=True)
    for name, (mod, causal) in variants().items():
        y = mod(x, causal=causal)
        assert y.shape == x.shape and torch.isfinite(y).all(), name
        y.sum().backward()
        assert torch.isfinite(x.grad).all(), name


@pytest.mark.parametrize("name", ["window", "linformer", "performer", "bigbird"])
def test_cores_refuse_what_they_cannot_honour(name):
    """An additive bias, a KV cache or (except the window) a causal mask is an error, never ignored."""
    mod, _ = variants()[name]
    x = torch.randn(1, 6, 32)
    with pytest.raises(ValueError, match="does not support an additive bias"):
        mod(x, bias=torch.zeros(4, 6, 6))
    cache = StaticKVCache(1, 2, 8, 7, like=x)
    mod(x, cache=cache)                                                  # a prefill mixes the prompt as without one
    if name == "window":                                                 # the window decodes from its ring buffer
        assert mod(x[:, :1], cache=cache).shape == (1, 1, 32)
    else:
        with pytest.raises(ValueError, match="KV cache"):
            mod(x[:, :1], cache=cache)
    if name != "window":
        with pytest.raises(ValueError, match="causal mask"):
            mod(x, causal=True)


def test_performer_checks_its_head_dim_and_refuses_dropout():
    with pytest.raises(ValueError, match="head_dim 16"):
        Attention(32, 4, core=PerformerCore(16, n_features=8))
    mod = Attention(32, 4, core=PerformerCore(8, n_features=8), dropout=0.1).train()
    with pytest.raises(ValueError, match="attention dropout"):
        mod(torch.randn(1, 5, 32))
    assert mod.eval()(torch.randn(1, 5, 32)).shape == (1, 5, 32)


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_cores_covering_every_key_honour_the_scale(scale):
    """``Attention.scale`` (what ``counterfactual(attn_scale=…)`` sets) reaches the cores' kernel."""
    torch.manual_seed(0)
    exact = Attention(32, 4, 2, core="eager", scale=scale).eval()
    x = torch.randn(2, 20, 32)
    for core in (SlidingWindowCore(19), BigBirdCore(block=4, n_global=1, n_random=6)):
        mod = Attention(32, 4, 2, core=core, scale=scale).eval()
        mod.load_state_dict(exact.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(mod(x), exact(x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# Exactness of the block-gathered kernels
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_window_equals_dense_band_reference(impl, causal):
    torch.manual_seed(0)
    x = torch.randn(2, 45, 32)
    for t in (1, 4, 17, 45):
        for w in (1, 2, 5, 16, 60):
            core = SlidingWindowCore(w, impl)
            mod = Attention(32, 4, 2, core=core)
            with torch.no_grad():
                q, k, v = split_qkv(mod, x[:, :t])
                ref = eager_attention(q, k, v, None, core.band_mask(t, causal))   # dense O(n²) masked
                got = core(q, k, v, causal=causal)
            torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5, msg=f"t={t} w={w}")


@pytest.mark.parametrize("causal", [False, True])
def test_window_covering_the_sequence_is_exact_attention(causal):
    torch.manual_seed(0)
    exact = Attention(32, 4, 2, core="eager")
    x = torch.randn(2, 20, 32)
    for window, exact_enough in ((19, True), (4, False)):
        err = approximation_error(Attention(32, 4, 2, core=SlidingWindowCore(window)), exact, x, causal=causal)
        assert (err < 1e-5) == exact_enough and (err > 1e-2) != exact_enough


def test_bigbird_equals_dense_masked_reference():
    torch.manual_seed(0)
    x = torch.randn(2, 50, 32)
    for t in (1, 5, 23, 50):
        for block, g, r in ((1, 0, 0), (4, 1, 1), (4, 2, 3), (5, 0, 2), (16, 1, 1)):
            core = BigBirdCore(block, n_global=g, n_random=r, seed=7)
            mod = Attention(32, 4, 2, core=core)
            with torch.no_grad():
                q, k, v = split_qkv(mod, x[:, :t])
                ref = eager_attention(q, k, v, None, core.dense_mask(t))
                got = core(q, k, v)
            torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5, msg=f"t={t} {block=} {g=} {r=}")


def test_bigbird_pattern_is_sparse_deduplicated_and_seeded():
    nb, g, r = 64, 2, 3
    rows = bigbird_pattern(nb, g, r, seed=0)
    assert len(rows) == nb - g and all(len(row) == g + 3 + r for row in rows)
    for i, row in zip(range(g, nb), rows):
        real = [j for j in row if j != nb]
        assert len(real) == len(set(real)) == g + 3 - (i == g) - (i == nb - 1) + r   # window clipped at ends
        assert {0, 1, i} <= set(real)
    assert bigbird_pattern(nb, g, r, seed=1) != rows
    mask = BigBirdCore(block=4, n_global=1, n_random=1).dense_mask(64 * 4)
    assert mask[:4].all() and mask[:, :4].all() and mask.float().mean() < 0.15


def test_bigbird_with_every_block_reachable_is_exact():
    torch.manual_seed(0)
    exact = Attention(32, 4, core="eager")
    x = torch.randn(2, 24, 32)
    full = Attention(32, 4, core=BigBirdCore(block=4, n_global=1, n_random=6))   # 6 blocks: all reachable
    assert approximation_error(full, exact, x) < 1e-5
    sparse = Attention(32, 4, core=BigBirdCore(block=2, n_global=1, n_random=1))
    assert approximation_error(sparse, exact, x) > 1e-2


# ------------------------------------------------------------------------------------------
# Approximations: Linformer and Performer
# ------------------------------------------------------------------------------------------

def test_linformer_identity_projection_is_exact():
    torch.manual_seed(0)
    exact = Attention(32, 4, 2, core="eager")
    x = torch.randn(2, 16, 32)
    lin = Attention(32, 4, 2, core=LinformerCore(max_seq_len=16, proj_len=16))
    with torch.no_grad():
        lin.core.E.copy_(torch.eye(16))
        lin.core.F.copy_(torch.eye(16))
    assert approximation_error(lin, exact, x) < 1e-5
    random_projection = Attention(32, 4, 2, core=LinformerCore(max_seq_len=16, proj_len=16))
    assert approximation_error(random_projection, exact, x) > 1e-2
    with pytest.raises(ValueError, match="max_seq_len=16"):
        lin(torch.randn(1, 17, 32))


def test_linformer_is_exact_on_sequences_of_rank_k():
    """The low-rank premise: when the sequence is k segments of repeated tokens, mean-pooling
    E = F over the segments loses nothing (each distinct key's softmax weight is scaled by its
    multiplicity in numerator and denominator alike)."""
    torch.manual_seed(0)
    k, seg = 4, 5
    exact = Attention(32, 4, core="eager")
    x = torch.randn(2, k, 32).repeat_interleave(seg, dim=1)              # (2, 20, 32), rank k along T
    lin = Attention(32, 4, core=LinformerCore(max_seq_len=k * seg, proj_len=k))
    pool = torch.eye(k).repeat_interleave(seg, dim=1) / seg              # (k, n) segment means
    with torch.no_grad():
        lin.core.E.copy_(pool)
        lin.core.F.copy_(pool)
    assert approximation_error(lin, exact, x) < 1e-5
    assert approximation_error(lin, exact, torch.randn(2, k * seg, 32)) > 1e-2


def test_performer_error_shrinks_with_more_features():
    torch.manual_seed(0)
    exact = Attention(64, 4, core="eager")
    x = torch.randn(2, 128, 64)
    errors = [approximation_error(Attention(64, 4, core=PerformerCore(16, n_features=m, seed=0)), exact, x)
              for m in (16, 64, 256)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.2 and errors[0] / errors[2] > 2, errors


def test_approximation_error_needs_matching_projections():
    with pytest.raises(ValueError, match="qkv.weight"):
        approximation_error(Attention(32, 4, core=SlidingWindowCore(2)), Attention(32, 4, 2), torch.randn(1, 4, 32))


# ------------------------------------------------------------------------------------------
# Cost: counted MACs grow linearly in n; real memory of the window kernel
# ------------------------------------------------------------------------------------------

def counted_layer_macs(make, n: int, d: int = 64) -> int:
    mode = new_fake_mode()
    layer = build_fake(make, mode, CPU).eval()
    with mode:
        x = torch.randn(1, n, d)
    return count_model(layer, (x,)).macs


def exponent(ns, macs) -> float:
    return float(np.polyfit(np.log(ns), np.log(macs), 1)[0])


NS = [1024, 2048, 4096, 8192, 16384]
LINEAR = {
    "window": lambda: Attention(64, 4, core=SlidingWindowCore(128)),
    "linformer": lambda: Attention(64, 4, core=LinformerCore(max_seq_len=16384, proj_len=256)),
    "performer": lambda: Attention(64, 4, core=PerformerCore(16, n_features=256)),
    "bigbird": lambda: Attention(64, 4, core=BigBirdCore(block=64, n_global=2, n_random=3)),
}


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_efficient_variants_count_linear_macs(name):
    macs = [counted_layer_macs(LINEAR[name], n) for n in NS]
    with torch.device("meta"):
        layer = LINEAR[name]()
    assert macs == [n * 4 * 64 * 64 + layer.mix_macs(1, n) for n in NS]       # projections + mixing
    assert 0.9 <= exponent(NS, macs) <= 1.1


def test_exact_attention_counts_quadratic_macs():
    macs = [counted_layer_macs(lambda: Attention(64, 4), n) - n * 4 * 64 * 64 for n in NS]   # minus projections
    assert 1.95 <= exponent(NS, macs) <= 2.05


def test_window_memory_is_linear_and_far_below_exact_eager():
    """Real tensor peaks (no grad): eager exact attention holds n×n scores; the blocked window
    holds n×3w. (CPU SDPA's flash kernel never materialises the scores either: its tracked
    peak is O(n) too, so the comparison is with the eager formula.)"""
    torch.manual_seed(0)
    d, h = 32, 2
    exact, window = Attention(d, h, core="eager"), Attention(d, h, core=SlidingWindowCore(32))
    peaks = {}
    for n in (2048, 4096):
        x = torch.randn(1, n, d)
        with torch.no_grad():
            peaks["exact", n] = measure_peak_cpu(lambda: exact(x))["tensor_peak_bytes"]
            peaks["window", n] = measure_peak_cpu(lambda: window(x))["tensor_peak_bytes"]
    assert peaks["exact", 4096] >= h * 4096 * 4096 * 4                  # one fp32 score matrix at least
    assert peaks["window", 4096] < peaks["exact", 4096] / 15, peaks
    assert peaks["window", 4096] / peaks["window", 2048] < 2.3, peaks    # linear in n
    assert peaks["exact", 4096] / peaks["exact", 2048] > 3.5, peaks      # quadratic in n


# ------------------------------------------------------------------------------------------
# The registered family: analytic cost == counted (hypothesis)
# ------------------------------------------------------------------------------------------

@st.composite
def lra_case(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    t = draw(st.integers(1, 40))
    cfg = LongEncoderConfig(
        vocab_size=draw(st.integers(2, 40)), d_model=heads * draw(st.sampled_from([2, 4, 8])),
        n_layers=draw(st.integers(1, 2)), n_heads=heads, n_kv_heads=draw(st.sampled_from([None, kv])),
        d_ff=draw(st.sampled_from([None, 6, 24])),
        attention=draw(st.sampled_from(["exact", "window", "linformer", "performer", "bigbird", "longformer"])),
        attn_impl=draw(st.sampled_from(["eager", "sdpa"])), window=draw(st.integers(1, 12)),
        proj_len=draw(st.integers(1, 12)), n_features=draw(st.integers(1, 20)), block=draw(st.integers(1, 8)),
        n_global=draw(st.integers(0, 3)), n_random=draw(st.integers(0, 3)),
        n_global_tokens=draw(st.integers(0, 3)), dilation=draw(st.integers(1, 4)),
        max_seq_len=t + draw(st.integers(0, 8)), positions=draw(st.sampled_from(["learned", "sinusoidal", "none"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        activation=draw(st.sampled_from(["relu", "gelu", "swiglu"])), bias=draw(st.booleans()))
    return cfg, Workload(batch_size=draw(st.integers(1, 3)), seq_len=t)


@given(lra_case())
@example((LongEncoderConfig(vocab_size=2, d_model=2, n_layers=1, n_heads=1, attention="linformer", proj_len=1,
                            max_seq_len=1, positions="none"), Workload(batch_size=1, seq_len=1)))
def test_lra_cost_matches_counter(case):
    """Found by Hypothesis: at seq_len 1 Linformer's einsum contracts a length-1 index, which torch runs as an
    elementwise mul; the counter (harness.instruments.flops._EinsumCounter) must still count its MACs."""
    cfg, w = case
    mode = new_fake_mode()
    model = build_fake(lambda: LongEncoder(cfg), mode, CPU).eval()
    with mode:
        counted = count_model(model, token_inputs(cfg, w, CPU))
    analytic = cost(cfg, w)
    assert analytic["params"] == count_params(model)
    assert analytic["macs"] == pytest.approx(counted.macs, rel=0.01), counted.by_op


def test_make_attention_keeps_the_shared_projection_layout():
    cfg = LongEncoderConfig(d_model=32, n_heads=4, n_kv_heads=2, max_seq_len=16, proj_len=4, n_features=8,
                            block=4, window=4)
    ref = {k: v.shape for k, v in Attention(32, 4, 2).state_dict().items()}
    for kind in ("exact", "window", "linformer", "performer", "bigbird", "longformer"):
        mod = make_attention(LongEncoderConfig(**{**vars(cfg), "attention": kind}))
        shapes = {k: v.shape for k, v in mod.state_dict().items() if k.split(".")[0] in ("qkv", "out")}
        assert shapes == ref, kind
    assert cost(cfg, Workload(1, 8))["params"] == count_params(LongEncoder(cfg))
