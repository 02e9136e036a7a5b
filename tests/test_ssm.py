"""State-space models: the chunked scan op against a plain loop (values and gradients), its counted MACs
against a hand count, stepwise decoding against the full forward, exact costs, and the decode step's state."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import architectures.layers.scan as scan_op
from architectures.layers.scan import CHUNK, scan_reference, selective_scan
from architectures.ssm import PRESETS, SSMConfig, SSMDecodeStep, SSMLM, state_shapes
from harness.contract import registry
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_flops, count_model
from harness.contract.spec import Workload
from tests.helpers import counted_cost

CPU = torch.device("cpu")


def _scan_inputs(b, length, d, n, selective, h0, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    bc = (b, length, n) if selective else (d, n)
    tensors = [torch.randn(b, length, d, generator=g, dtype=dtype),               # x
               torch.rand(b, length, d, generator=g, dtype=dtype) * 0.5,          # delta > 0
               -torch.rand(d, n, generator=g, dtype=dtype) * 3,                   # A < 0
               torch.randn(bc, generator=g, dtype=dtype),                         # B
               torch.randn(bc, generator=g, dtype=dtype)]                         # C
    if h0:
        tensors.append(torch.randn(b, d, n, generator=g, dtype=dtype))
    return [t.requires_grad_() for t in tensors]


# L = 1; shorter than a sub-chunk; two-level inside one chunk (16); one chunk; chunks + a tail (70, 137)
@pytest.mark.parametrize("length", [1, 5, 16, CHUNK, 70, 137])
@pytest.mark.parametrize("selective", [True, False])
@pytest.mark.parametrize("h0", [False, True])
def test_scan_equals_the_loop_values_and_gradients(length, selective, h0):
    inputs = _scan_inputs(2, length, 3, 4, selective, h0, seed=length)
    y, h = selective_scan(*inputs)
    y_ref, h_ref = scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    gy, gh = torch.randn_like(y), torch.randn_like(h)                 # both outputs feed the loss
    got = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), inputs)
    want = torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), inputs)
    for name, a, b in zip(("x", "delta", "A", "B", "C", "h0"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def _assert_scan_matches_the_loop(inputs, extra=(), tol=1e-10):
    y, h = selective_scan(*inputs)
    y_ref, h_ref = scan_reference(*inputs)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(h, h_ref, rtol=tol, atol=tol)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    leaves = [t for t in inputs if t is not None and t.is_leaf] + list(extra)     # and e.g. the dt under delta
    got = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), leaves)
    want = torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), leaves)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"gradient of input {i}")


@pytest.mark.parametrize("selective", [True, False])
def test_short_chunks_carry_the_state(monkeypatch, selective):
    """Chunks of 3 positions (the chunk length shrinks as B·D·N grows) give the loop's values and gradients."""
    monkeypatch.setattr(scan_op, "CHUNK_ELEMS", 3 * 2 * 3 * 4)
    assert scan_op._chunk_len(2, 3, 4) == 3
    _assert_scan_matches_the_loop(_scan_inputs(2, 11, 3, 4, selective, True, seed=5))


@pytest.mark.parametrize("selective", [True, False])
def test_time_invariant_delta_takes_the_broadcast_decay_and_stays_exact(selective):
    """delta the same at every batch row and position (S4D's dt expanded): one (D, N) decay, same results."""
    x, delta, A, B, C, h0 = _scan_inputs(2, 70, 3, 4, selective, True, seed=9)
    dt = (torch.rand(3, dtype=torch.float64) * 0.5).requires_grad_()
    lti = dt.expand(2, 70, 3)
    from architectures.layers.scan import _Scan
    assert _Scan(x, lti, A, B, C).lti and not _Scan(x, delta, A, B, C).lti
    _assert_scan_matches_the_loop([x, lti, A, B, C, h0], extra=[dt])
    _assert_scan_matches_the_loop([x, lti.contiguous(), A, B, C, None], extra=[dt])


def test_scan_fp32_and_bf16_follow_the_loop():
    inputs = [t.detach() for t in _scan_inputs(1, 100, 8, 16, True, False)]
    y_ref, _ = scan_reference(*inputs)
    y32, _ = selective_scan(*(t.float() for t in inputs))
    torch.testing.assert_close(y32.double(), y_ref, rtol=1e-4, atol=1e-4)
    y16, h16 = selective_scan(*(t.bfloat16() for t in inputs))
    assert y16.dtype == h16.dtype == torch.bfloat16
    assert (y16.double() - y_ref).abs().max() < 0.05 * y_ref.abs().max()


@pytest.mark.parametrize("b,length,d,n", [(1, 1, 3, 2), (2, 70, 5, 4), (3, 16, 2, 8)])
@pytest.mark.parametrize("selective", [True, False])
def test_scan_macs_are_the_hand_count(b, length, d, n, selective):
    """3 MACs per (b, t, d, n) forward; 6 more backward; no gap (the ops' formulas are registered)."""
    inputs = _scan_inputs(b, length, d, n, selective, False, dtype=torch.float32)
    fwd = count_flops(lambda: selective_scan(*inputs))
    assert fwd.macs == 3 * b * length * d * n and fwd.complete
    both = count_flops(lambda: selective_scan(*inputs)[0].sum().backward())
    assert both.macs == 9 * b * length * d * n
    assert set(both.by_op) == {"bench_ssm.selective_scan", "bench_ssm.selective_scan_backward"}


def _tiny(kind: str, **kw) -> SSMConfig:
    return SSMConfig(**({"vocab_size": 50, "d_model": 16, "n_layers": 2, "kind": kind, "d_state": 4} | kw))


@pytest.mark.parametrize("kind", ["s4d", "mamba"])
def test_stepwise_decoding_equals_the_full_forward(kind):
    torch.manual_seed(0)
    cfg = _tiny(kind)
    lm = SSMLM(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))              # the two-level scan: 3 sub-chunks
    with torch.no_grad():
        full = lm(tokens)                                             # (B, T, vocab)
        states, steps = lm.new_states(2), []
        for t in range(tokens.shape[1]):
            logits, states = lm.step(tokens[:, t:t + 1], states)
            steps.append(logits)
        step_model = SSMDecodeStep(cfg).eval()
        step_model.lm.load_state_dict(lm.state_dict())
        flat = [s for layer in states for s in layer]                 # the state after all tokens
        nxt = torch.randint(0, cfg.vocab_size, (2, 1))
        one = step_model(nxt, *flat)
        reference = lm(torch.cat([tokens, nxt], 1))[:, -1:]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(one, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["s4d", "mamba"])
def test_causal_unless_bidirectional(kind):
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (1, 12))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 50
    for bidirectional in (False, True):
        lm = SSMLM(_tiny(kind, bidirectional=bidirectional)).eval()
        with torch.no_grad():
            same = torch.allclose(lm(tokens)[:, :-1], lm(changed)[:, :-1])
        assert same != bidirectional
    with pytest.raises(ValueError, match="bidirectional"):
        SSMDecodeStep(_tiny(kind, bidirectional=True))


@pytest.mark.parametrize("kind", ["s4d", "mamba"])
@pytest.mark.parametrize("extra", [{}, {"bidirectional": True, "norm": "layernorm"},
                                   {"expand": 3, "dt_rank": 5, "d_conv": 2, "d_state": 3}])
@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 70)])
def test_cost_equals_the_counters(kind, extra, batch, seq):
    spec = registry.resolve("mamba-lm-tiny", **dict(vocab_size=40, d_model=24, n_layers=2, kind=kind, **extra))
    w = Workload(batch_size=batch, seq_len=seq)
    predicted = spec.cost(spec.config, w)
    assert (predicted["params"], predicted["macs"]) == counted_cost(spec, w)


@pytest.mark.parametrize("kind", ["s4d", "mamba"])
def test_fwd_bwd_is_three_forwards_and_complete(kind):
    """Every counted op's backward is twice its forward (matmuls, the depthwise conv, the scan)."""
    spec = registry.resolve("mamba-lm-tiny", vocab_size=40, d_model=24, n_layers=2, kind=kind)
    w = Workload(batch_size=2, seq_len=20)
    model = spec.build(spec.config)
    count = count_model(model, spec.make_inputs(spec.config, w, CPU), "fwd_bwd")
    assert count.complete and count.macs == 3 * spec.cost(spec.config, w)["macs"]


@pytest.mark.parametrize("kind", ["s4d", "mamba"])
def test_decode_step_state_is_its_inputs_and_independent_of_context(kind):
    spec = registry.resolve("ssm-decode-step-small", kind=kind, d_state=64 if kind == "s4d" else 16)
    costs = []
    for batch, n in [(1, 16), (1, 4096), (3, 16), (3, 4096)]:
        w = Workload(batch_size=batch, seq_len=n)
        with new_fake_mode():
            token, *states = spec.make_inputs(spec.config, w, CPU)
        assert token.shape == (batch, 1)
        assert [tuple(s.shape) for s in states] == state_shapes(spec.config, batch) * spec.config.n_layers
        cost = spec.cost(spec.config, w)
        assert cost["state_bytes"] == sum(s.numel() * s.element_size() for s in states)
        costs.append(cost)
    assert costs[0] == costs[1] and costs[2] == costs[3]              # the context length changes nothing
    assert costs[2]["state_bytes"] == 3 * costs[0]["state_bytes"]
    bf16 = spec.cost(spec.config, Workload(batch_size=1, seq_len=16, dtype="bf16"))
    assert bf16["state_bytes"] * 2 == costs[0]["state_bytes"]
    w = Workload(batch_size=2, seq_len=16)
    small = registry.resolve("ssm-decode-step-small", **dict(registry.get("ssm-decode-step-small").small), kind=kind)
    assert (small.cost(small.config, w)["params"], small.cost(small.config, w)["macs"]) == counted_cost(small, w)


@pytest.mark.parametrize("name", ["mamba-lm-small", "s4d-lm-small"])
def test_fake_forward_counts_the_full_size_at_long_context(name):
    spec = registry.get(name)
    w = Workload(batch_size=1, seq_len=4096)
    mode = new_fake_mode()
    model = build_fake(lambda: spec.build(spec.config).eval(), mode, CPU)
    with mode:
        count = count_model(model, spec.make_inputs(spec.config, w, CPU))
    assert count.complete and count.macs == spec.cost(spec.config, w)["macs"]


def test_presets_match_their_attention_counterparts():
    tiny, decoder = registry.get("mamba-lm-tiny").config, registry.get("decoder-tiny").config
    lra = registry.get("lra-exact").config
    for name in ("s4d-lm-tiny", "mamba-lm-tiny"):
        cfg = PRESETS[name]
        assert (cfg.vocab_size, cfg.d_model, cfg.n_layers) == (decoder.vocab_size, decoder.d_model, decoder.n_layers)
    for name in ("s4d-lm-small", "mamba-lm-small", "s4d-small", "mamba-small"):
        cfg = registry.get(name).config
        assert (cfg.d_model, cfg.n_layers) == (lra.d_model, lra.n_layers)
    step, dec = registry.get("ssm-decode-step-small").config, registry.get("decode-step-small").config
    assert (step.vocab_size, step.d_model, step.n_layers) == (dec.vocab_size, dec.d_model, dec.n_layers)
    assert registry.get("s4d-small").family == "ssm" and registry.get("mamba-small").family == "ssm"
    resized = registry.resolve("s4d-lm-tiny", vocab_size=77, d_model=48, n_layers=3)
    assert resized.build(resized.config)(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 77)
    assert tiny.rank == 8 and PRESETS["s4d-lm-tiny"].channels == 128 and tiny.channels == 256


@pytest.mark.parametrize("bad", [{"kind": "s5"}, {"d_state": 0}, {"dt_rank": -1}, {"expand": 0}, {"norm": "batch"}])
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(PRESETS["mamba-lm-tiny"], **bad)
