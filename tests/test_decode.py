"""The decode-step model: a cached step (the generation loop's own ``Decoder.decode`` on a static cache) equals the
full forward's last position; its cache inputs are ``kv_cache_bytes`` plus the slot the step writes; its analytic
cost equals the counters."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from architectures.decode import PRESETS, DecodeStep, DecodeStepConfig
from architectures.transformer import kv_cache_bytes
from harness.contract import registry
from harness.instruments.fake import new_fake_mode
from harness.contract.spec import Workload
from tests.helpers import counted_cost

CPU = torch.device("cpu")


def _cfg(**kw) -> DecodeStepConfig:
    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4)
    return DecodeStepConfig(**(base | kw))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("n_kv", [4, 2, 1])                     # MHA, GQA, MQA
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope", "alibi"])
def test_cached_step_equals_full_forward(impl, n_kv, positions):
    torch.manual_seed(0)
    cfg = _cfg(attn_impl=impl, n_kv_heads=n_kv, positions=positions, max_seq_len=64)
    cached = DecodeStep(cfg).eval()
    full = DecodeStep(dataclasses.replace(cfg, use_cache=False)).eval()
    full.load_state_dict(cached.state_dict())
    b, n = 2, 11
    tokens = torch.randint(0, cfg.vocab_size, (b, n + 1))
    with torch.no_grad():
        state = cached.decoder.generation_state(b, n + 1)
        cached.decoder.prefill(tokens[:, :n], state)            # a real prefill of the context
        cache_inputs = [t for c in state for t in (c.k, c.v)]   # each (B, Hkv, n + 1, hd)
        before = [t[:, :, :n].clone() for t in cache_inputs]
        steps = [cached(tokens[:, n:], *cache_inputs) for _ in range(3)]   # (B, 1, vocab) each: the same step
        rerun = full(tokens)                                    # (B, 1, vocab)
        reference = cached.decoder(tokens)[:, -1:]              # the decoder's own full forward
    assert steps[0].shape == (b, 1, cfg.vocab_size)
    for step in steps:
        torch.testing.assert_close(step, reference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rerun, reference, atol=1e-5, rtol=1e-4)
    assert all(torch.equal(x[:, :, :n], y) for x, y in zip(cache_inputs, before)), "the step changed the context"
    assert cached._kept[0][0]._buffers["k"] is None, "the step kept its inputs alive"


@pytest.mark.parametrize("n_kv", [8, 2, 1])
@pytest.mark.parametrize("batch,n", [(1, 16), (3, 40)])
def test_cache_inputs_are_kv_cache_bytes(n_kv, batch, n):
    spec = registry.resolve("decode-step-small", n_kv_heads=n_kv)
    w = Workload(batch_size=batch, seq_len=n)
    mode = new_fake_mode()
    with mode:                                                  # fake tensors: shapes only
        token, *cache = spec.make_inputs(spec.config, w, CPU)
    assert token.shape == (batch, 1) and len(cache) == 2 * spec.config.n_layers
    assert all(t.shape == (batch, n_kv, n + 1, spec.config.head_dim) for t in cache)   # + the slot the step writes
    nbytes = sum(t.numel() * t.element_size() for t in cache)
    assert nbytes == kv_cache_bytes(spec.config, batch, n + 1, 4)
    assert spec.cost(spec.config, w)["kv_cache_bytes"] == kv_cache_bytes(spec.config, batch, n, 4)   # what it reads
    no_cache = registry.resolve("decode-step-small", n_kv_heads=n_kv, use_cache=False)
    with new_fake_mode():
        (tokens,) = no_cache.make_inputs(no_cache.config, w, CPU)
    assert tokens.shape == (batch, n + 1)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("use_cache", [True, False])
def test_step_cost_matches_counts(name, use_cache):
    spec = registry.resolve(name, use_cache=use_cache)
    w = Workload(batch_size=2, seq_len=16)
    predicted = spec.cost(spec.config, w)
    assert (predicted["params"], predicted["macs"]) == counted_cost(spec, w)


def test_long_random_inputs_are_tiled_not_drawn_whole():
    """A decode step's KV cache is drawn for 512 positions on the CPU and repeated on the device (issue 26: drawing a
    1.6 G-value cache value by value was a third of the GPU kv_cache run): the same values on every call, the
    shape asked for, contiguous."""
    from architectures.inputs import TILE, tiled_randn
    a = tiled_randn((2, 3, 3 * TILE + 5, 4), 2, torch.device("cpu"), torch.Generator().manual_seed(0))
    b = tiled_randn((2, 3, 3 * TILE + 5, 4), 2, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert a.shape == (2, 3, 3 * TILE + 5, 4) and a.is_contiguous() and torch.equal(a, b)
    assert torch.equal(a[:, :, :TILE], a[:, :, TILE:2 * TILE]) and torch.equal(a[:, :, :5], a[:, :, 3 * TILE:])
    short = tiled_randn((1, 2, 7, 4), 2, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert torch.equal(short, torch.randn((1, 2, 7, 4), generator=torch.Generator().manual_seed(0)))
