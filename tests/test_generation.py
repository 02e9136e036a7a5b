"""Generation (issue 27): the static KV cache, the generation loop and its figures, the generation suite."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from architectures.layers.attention import StaticKVCache, static_kv_bytes
from architectures.ssm import PRESETS as SSM_PRESETS, SSMLM
from architectures.transformer import Decoder, DecoderConfig

TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4)
CONFIGS = {
    "mha": {}, "gqa2": dict(n_kv_heads=2), "mqa": dict(n_kv_heads=1),
    "window3": dict(window=3), "window3-mqa-rope": dict(window=3, n_kv_heads=1, positions="rope"),
    "window5-eager": dict(window=5, attn_impl="eager"), "alibi": dict(positions="alibi"),
    "learned": dict(positions="learned", max_seq_len=32), "llama-like": dict(n_kv_heads=2, positions="rope",
                                                                            norm="rmsnorm", activation="swiglu"),
}


def _decode_vs_full(model: torch.nn.Module, prompt: int = 6, total: int = 12, batch: int = 2) -> float:
    """Largest |logit difference| between prefill + one-token decode steps on the model's generation state and
    the full sequence run again from scratch, at every position after the prompt."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (batch, total))
    with torch.no_grad():
        full = model(tokens)                                              # (B, T, vocab)
        state = model.generation_state(batch, total)
        errs = [(model.prefill(tokens[:, :prompt], state) - full[:, prompt - 1]).abs().max()]
        for i in range(prompt, total):
            errs.append((model.decode(tokens[:, i:i + 1], state) - full[:, i]).abs().max())
    return float(max(errs))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_static_cache_decoding_equals_full_recomputation(name: str) -> None:
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(**TINY, **CONFIGS[name])).eval()
    assert _decode_vs_full(model) < 1e-5


def test_static_cache_is_reusable_after_reset() -> None:
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(**TINY, n_kv_heads=2)).eval()
    assert _decode_vs_full(model) < 1e-5
    assert _decode_vs_full(model, prompt=3) < 1e-5      # a second prompt after a first (prefill resets)


def test_mamba_prefill_and_steps_equal_full_recomputation() -> None:
    torch.manual_seed(1)
    cfg = replace(SSM_PRESETS["mamba-lm-tiny"], vocab_size=64, d_model=32, n_layers=2, d_state=8)
    model = SSMLM(cfg).eval()
    assert _decode_vs_full(model) < 1e-5
    before = model.generation_state(2, 12).nbytes()
    assert model.generation_state(2, 4096).nbytes() == before          # constant state: max_len changes nothing


@pytest.mark.parametrize("kv,window,max_len,slots", [(4, None, 12, 12), (2, None, 7, 7), (1, 3, 12, 4),
                                                     (2, 30, 12, 12)])
def test_static_cache_bytes_are_exact(kv: int, window: int | None, max_len: int, slots: int) -> None:
    like = torch.zeros((), dtype=torch.bfloat16)
    cache = StaticKVCache(3, kv, 8, max_len, window, like=like)
    assert cache.size == slots and cache.ring == (slots < max_len)
    assert cache.nbytes() == static_kv_bytes(3, kv, 8, max_len, window, 2) == 2 * 3 * kv * slots * 8 * 2


def test_ring_buffer_memory_is_bounded_by_the_window() -> None:
    model = Decoder(DecoderConfig(**TINY, window=3)).eval()
    short, long = model.generation_state(1, 16), model.generation_state(1, 4096)
    assert sum(c.nbytes() for c in short) == sum(c.nbytes() for c in long)


def test_static_cache_writes_in_place_without_reallocation() -> None:
    model = Decoder(DecoderConfig(**TINY, n_kv_heads=1)).eval()
    state = model.generation_state(1, 10)
    ptrs = [(c.k.data_ptr(), c.v.data_ptr()) for c in state]
    with torch.no_grad():
        model.prefill(torch.randint(0, 64, (1, 4)), state)
        for _ in range(5):
            model.decode(torch.randint(0, 64, (1, 1)), state)
    assert [(c.k.data_ptr(), c.v.data_ptr()) for c in state] == ptrs
    assert all(int(c.pos) == 9 for c in state)


def test_a_second_prompt_without_reset_is_refused() -> None:
    model = Decoder(DecoderConfig(**TINY)).eval()
    state = model.generation_state(1, 10)
    with torch.no_grad():
        model.stack(model.tok(torch.randint(0, 64, (1, 3))), caches=list(state))
        with pytest.raises(ValueError, match="one prompt"):
            model.stack(model.tok(torch.randint(0, 64, (1, 3))), caches=list(state))
