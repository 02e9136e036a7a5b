"""The transformer layouts: analytic cost vs the counters, exactness of every position scheme
(eager == SDPA, causality, KV cache, permutation equivariance), and the presets vs their papers."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from architectures.layers.kv_cache import StaticKVCache
from architectures.layers.positions import POSITION_KINDS, SinusoidalPositions, alibi_slopes, make_positions
from architectures.transformer import (PRESETS, Decoder, counterfactual, DecoderConfig, Encoder, EncoderConfig, EncoderDecoder,
                                       EncoderDecoderConfig, seq2seq_inputs, token_inputs)
from architectures.transformer_cost import (decoder_cost, encoder_cost, encoder_decoder_cost, kv_cache_bytes)
from harness.contract import registry
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_model, count_params
from harness.contract.spec import Workload
from harness.engine.generation import Generation
from tests.helpers import counted_cost, greedy_without_cache

CPU = torch.device("cpu")
LAYOUTS = {"decoder": (DecoderConfig, Decoder, token_inputs, decoder_cost),
           "encoder": (EncoderConfig, Encoder, token_inputs, encoder_cost),
           "encoder-decoder": (EncoderDecoderConfig, EncoderDecoder, seq2seq_inputs, encoder_decoder_cost)}
TINY = dict(vocab_size=37, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


def build(layout: str, seed: int = 0, **kw):
    cfg_cls, model_cls, _, _ = LAYOUTS[layout]
    torch.manual_seed(seed)
    return model_cls(cfg_cls(**(TINY | kw))).eval()


def tokens(*shape: int, vocab: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Cost formulas: MACs vs the counter on fake tensors, params vs the real model (exact)
# ---------------------------------------------------------------------------------------------

@st.composite
def configs(draw, layout: str):
    n_heads = draw(st.sampled_from([1, 2, 3, 4, 6]))
    head_dim = draw(st.sampled_from([2, 4, 6, 8]))
    kw = dict(
        vocab_size=draw(st.integers(2, 50)),
        d_model=n_heads * head_dim,
        n_layers=draw(st.integers(1, 3)),
        n_heads=n_heads,
        n_kv_heads=draw(st.sampled_from([None] + [k for k in range(1, n_heads + 1) if n_heads % k == 0])),
        d_ff=draw(st.one_of(st.none(), st.integers(1, 48))),
        attn_impl=draw(st.sampled_from(["eager", "sdpa"])),
        positions=draw(st.sampled_from(POSITION_KINDS)),
        max_seq_len=draw(st.integers(9, 40)),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        norm_placement=draw(st.sampled_from(["pre", "post"])),
        activation=draw(st.sampled_from(["relu", "gelu", "swiglu"])),
        bias=draw(st.booleans()),
    )
    if layout == "encoder":
        kw |= dict(n_classes=draw(st.integers(1, 5)), pool=draw(st.sampled_from(["cls", "mean"])))
    else:
        kw |= dict(tie_embeddings=draw(st.booleans()))
    workload = Workload(batch_size=draw(st.integers(1, 3)), seq_len=draw(st.integers(1, 9)))
    return LAYOUTS[layout][0](**kw), workload


def _check_cost(layout: str, cfg, w: Workload) -> None:
    _, model_cls, make_inputs, cost = LAYOUTS[layout]
    predicted = cost(cfg, w)
    mode = new_fake_mode()
    fake = build_fake(lambda: model_cls(cfg).eval(), mode, CPU)
    with mode:
        counted = count_model(fake, make_inputs(cfg, w, CPU)).macs
    assert abs(predicted["macs"] - counted) <= 0.01 * counted, (cfg, w, predicted["macs"], counted)
    assert predicted["params"] == count_params(model_cls(cfg)), cfg


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cost_formulas_match_counted_macs_and_params(layout):
    @settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(configs(layout))
    def check(drawn):
        _check_cost(layout, *drawn)
    check()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_cost_matches_counts(name):
    """Full-size presets on fake tensors (no memory): the registered cost hook equals the counters."""
    spec = registry.get(name)
    w = Workload(batch_size=2, seq_len=16)
    predicted = spec.cost(spec.config, w)
    assert (predicted["params"], predicted["macs"]) == counted_cost(spec, w)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_bytes_formula_equals_a_real_cache(n_kv, dtype):
    model = build("decoder", n_kv_heads=n_kv, positions="rope").to(dtype)
    gen = Generation(model, tokens(3, 5), 4)
    gen()
    assert gen.tokens.shape == (3, 4)
    held = 5 + 4                                   # the state is sized for the prompt and every new token
    cfg = model.cfg
    assert gen.state.nbytes() == kv_cache_bytes(cfg, 3, held, dtype.itemsize)
    assert decoder_cost(cfg, Workload(batch_size=3, seq_len=held, dtype="bf16" if dtype == torch.bfloat16 else "fp32")
                        )["kv_cache_bytes"] == kv_cache_bytes(cfg, 3, held, dtype.itemsize)


def test_paper_parameter_counts():
    """C29: the original Transformer's base/big (paper, Table 3: 65M / 213M) with embeddings tied 3 ways
    (§3.4) give 63.08M (-3.0%) / 214.25M (+0.6%); an untied output projection would give 82.0M / 252.1M
    and three separate matrices 101.0M / 290.0M, far from the paper's figures."""
    base, big = registry.get("aiayn-base"), registry.get("aiayn-big")
    w = Workload(batch_size=1, seq_len=1)
    n_base, n_big = base.cost(base.config, w)["params"], big.cost(big.config, w)["params"]
    assert n_base == 63_082_496 and abs(n_base / 65e6 - 1) < 0.03
    assert n_big == 214_245_376 and abs(n_big / 213e6 - 1) < 0.01
    untied = dataclasses.replace(base.config, tie_embeddings=False)
    assert base.cost(untied, w)["params"] - n_base == 2 * 37000 * 512
    gpt2, t5, bert = (registry.get(n) for n in ("gpt2-small", "encdec-small", "encoder-base"))
    assert gpt2.cost(gpt2.config, w)["params"] == 124_439_808               # GPT-2 small as released
    assert t5.cost(t5.config, w)["params"] == 60_506_624 - 2 * 32 * 8       # T5-small less its rel. bias tables
    # BertModel less token-type embeddings, embedding LayerNorm and pooler, plus our 2-class head
    assert bert.cost(bert.config, w)["params"] == 109_482_240 - 2 * 768 - 2 * 768 - 590_592 + (768 * 2 + 2)


# ---------------------------------------------------------------------------------------------
# Exactness of every position scheme
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", POSITION_KINDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_eager_equals_sdpa(layout, positions):
    eager = build(layout, positions=positions, n_kv_heads=2, attn_impl="eager")
    sdpa = build(layout, positions=positions, n_kv_heads=2, attn_impl="sdpa")
    sdpa.load_state_dict(eager.state_dict())
    inputs = (tokens(2, 9),) if layout != "encoder-decoder" else (tokens(2, 7), tokens(2, 9, seed=2))
    with torch.no_grad():
        torch.testing.assert_close(eager(*inputs), sdpa(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions", POSITION_KINDS)
@pytest.mark.parametrize("layout", ["decoder", "encoder-decoder"])
def test_output_at_i_ignores_tokens_after_i(layout, positions):
    """C18: with the causal mask, position i's logits do not depend on later tokens."""
    model = build(layout, positions=positions)
    a = tokens(2, 10)
    b = a.clone()
    b[:, 6:] = tokens(2, 4, seed=7)
    src = (tokens(2, 8, seed=3),) if layout == "encoder-decoder" else ()
    with torch.no_grad():
        ya, yb = model(*src, a), model(*src, b)
    torch.testing.assert_close(ya[:, :6], yb[:, :6], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ya[:, 6:], yb[:, 6:])


@pytest.mark.parametrize("positions", POSITION_KINDS)
def test_encoder_is_permutation_equivariant_only_without_positions(positions):
    """C13: self-attention without positions commutes with a permutation of the tokens; every scheme breaks it."""
    model = build("encoder", positions=positions)
    x = tokens(2, 9)
    perm = torch.tensor([3, 0, 8, 5, 1, 7, 2, 6, 4])
    with torch.no_grad():
        permuted_after, permuted_before = model.features(x)[:, perm], model.features(x[:, perm])
        pooled = build("encoder", positions=positions, pool="mean")
        invariant = torch.allclose(pooled(x), pooled(x[:, perm]), atol=1e-5)
    if positions == "none":
        torch.testing.assert_close(permuted_before, permuted_after, rtol=1e-5, atol=1e-5)
        assert invariant                                   # mean pooling: the logits are invariant
    else:
        assert (permuted_before - permuted_after).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("positions", POSITION_KINDS)
def test_kv_cache_decoding_equals_full_forward(positions, n_kv, impl):
    model = build("decoder", positions=positions, n_kv_heads=n_kv, attn_impl=impl)
    x = tokens(2, 10)
    with torch.no_grad():
        full = model(x)                                                       # (B, 10, vocab)
        state = model.generation_state(2, 10)
        parts = [model.prefill(x[:, :7], state)]                              # the prompt's last position
        parts += [model.decode(x[:, i:i + 1], state) for i in range(7, 10)]   # then one token at a time
    torch.testing.assert_close(torch.stack(parts, dim=1), full[:, 6:], rtol=1e-5, atol=1e-5)
    gen = Generation(model, x[:, :5], 5)
    gen()
    torch.testing.assert_close(gen.tokens, greedy_without_cache(model, x[:, :5], 5))


def test_encoder_decoder_incremental_decoding_equals_full_decode():
    model = build("encoder-decoder", positions="rope", n_kv_heads=2)
    src, tgt = tokens(2, 6), tokens(2, 7, seed=2)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt, memory)
        caches = [StaticKVCache(2, 2, model.cfg.head_dim, 7, like=memory) for _ in model.decoder.blocks]
        steps = [model.decode(tgt[:, :3], memory, caches)] + [model.decode(tgt[:, i:i + 1], memory, caches)
                                                                for i in range(3, 7)]
        other_src = model(tokens(2, 6, seed=9), tgt)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(other_src, full)                           # cross-attention reads the source


def test_gqa_with_as_many_kv_heads_as_heads_is_mha():
    mha, gqa = build("decoder", n_kv_heads=None), build("decoder", n_kv_heads=4)
    assert count_params(mha) == count_params(gqa)
    gqa.load_state_dict(mha.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens(2, 8)), mha(tokens(2, 8)))


def test_sinusoidal_shift_is_a_fixed_linear_map():
    """C14: PE(pos + k) = PE(pos) · M_k for one matrix M_k (a rotation per frequency pair): solve for M_k
    by least squares from 256 positions below 4000, check that it predicts the unseen positions
    6000..6999 and that it is the closed-form block rotation. (d = 16 keeps the lowest frequency,
    10000^(-14/16), resolvable from positions below 4000; the table is computed in fp64.)"""
    d, k = 16, 7
    pe = SinusoidalPositions(d).table(8000, 0, CPU, torch.float64)                   # (8000, d)
    fit_at = torch.randperm(4000, generator=torch.Generator().manual_seed(0))[:256]
    fit = torch.linalg.lstsq(pe[fit_at], pe[fit_at + k]).solution                   # (d, d)
    unseen = torch.arange(6000, 7000)
    torch.testing.assert_close(pe[unseen] @ fit, pe[unseen + k], rtol=0, atol=1e-9)
    closed = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = 10000.0 ** (-2 * i / d)
        c, s = math.cos(k * w), math.sin(k * w)            # [sin, cos](p + k) = [sin, cos](p) @ [[c, -s], [s, c]]
        closed[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    torch.testing.assert_close(fit, closed, rtol=0, atol=1e-9)
    learned = torch.randn(8000, d, generator=torch.Generator().manual_seed(0)).double()   # a negative control
    fit = torch.linalg.lstsq(learned[fit_at], learned[fit_at + k]).solution
    assert (learned[unseen] @ fit - learned[unseen + k]).abs().max() > 0.5


def test_rope_scores_depend_only_on_relative_position():
    rope = make_positions("rope", 32, 0, n_heads=4)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    dots = []
    for m, n in [(5, 2), (9, 6), (103, 100)]:
        qm, _ = rope.rotate(q, q, m)
        _, kn = rope.rotate(k, k, n)
        dots.append((qm * kn).sum())
    torch.testing.assert_close(dots[0], dots[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dots[0], dots[2], rtol=1e-4, atol=1e-4)


def test_alibi_slopes_and_bias():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence (Press et al.'s code)
    assert alibi_slopes(12) == pytest.approx([2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)])
    alibi = make_positions("alibi", 64, 0, n_heads=12)
    torch.testing.assert_close(alibi.slopes().double(), torch.tensor(alibi_slopes(12), dtype=torch.float64))
    bias = make_positions("alibi", 64, 0, n_heads=8).bias(2, 5, offset=3)           # queries at 3, 4
    assert bias.shape == (8, 2, 5)
    torch.testing.assert_close(bias[0, 1], -0.5 * torch.tensor([4.0, 3, 2, 1, 0]))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_learned_positions_past_max_seq_len_raise(layout):
    model = build(layout, positions="learned", max_seq_len=8)
    inputs = (tokens(1, 9),) if layout != "encoder-decoder" else (tokens(1, 4), tokens(1, 9))
    with pytest.raises(ValueError, match="learned positions cover 8 tokens; got position 8"):
        model(*inputs)
    if layout == "decoder":
        Generation(model, tokens(1, 4), 4)()                             # 4 + 4 - 1 positions: fits
        with pytest.raises(ValueError, match="learned positions cover 8 tokens"):
            Generation(model, tokens(1, 4), 6)()


def test_invalid_configs_raise():
    for bad in (dict(n_heads=5), dict(n_kv_heads=3), dict(positions="rope", n_heads=32), dict(d_ff=0)):
        with pytest.raises(ValueError):
            DecoderConfig(**(TINY | bad))
    with pytest.raises(ValueError, match="n_classes"):
        EncoderConfig(**TINY, n_classes=0)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_mlp_in_place_activation_is_exact_and_leaves_inputs_alone(activation):
    from architectures.layers.blocks import MLP
    mlp = MLP(16, 24, activation)
    x = torch.randn(2, 5, 16, requires_grad=True)
    with_grad = mlp(x)
    with_grad.sum().backward()                                           # autograd path intact
    before = x.detach().clone()
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), with_grad.detach(), rtol=0, atol=0)
    assert torch.equal(x.detach(), before)


def test_decoder_without_the_causal_mask_lets_later_tokens_change_earlier_outputs():
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (1, 8))
    later = tokens.clone()
    later[0, -1] = (later[0, -1] + 1) % 50
    for causal in (True, False):
        cfg = DecoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4)
        model = counterfactual(Decoder(cfg), causal=causal).eval()
        changed = not torch.allclose(model(tokens)[0, :-1], model(later)[0, :-1])
        assert changed == (not causal)
