"""One autoregressive decode step as a model, so the harness can time per-token generation.

The model's forward IS one step of greedy generation after a context of ``workload.seq_len`` tokens:

* ``use_cache=True``: the inputs are the newest token (B, 1) and the decoder's static KV cache after a prefill of
  the n context tokens, passed as tensors — k₀, v₀, k₁, v₁, … each (B, Hkv, n + 1, hd): n filled slots and the one
  this step writes — so the harness counts the cache's bytes as static (inputs). The step takes them as the
  buffers of :class:`~architectures.layers.kv_cache.StaticKVCache` objects (:meth:`StaticKVCache.over`: no copy)
  and runs :meth:`Decoder.decode`, the very step the generation loop (:mod:`harness.engine.generation`) calls: each
  layer writes the token's k, v into the last slot in place and attends it over the n + 1 slots. Every call
  rewrites the same slot, so every call does the same work. Cost per step ∝ n (scores) + weights.
* ``use_cache=False``: the input is the whole (B, n+1) sequence, re-run from scratch as generation
  without a cache does; cost per step ∝ n·weights + n² (scores).

Either way the output is the logits of the last position, (B, 1, vocab); the LM head runs on that
position only (what a generation step needs). ``make_inputs`` draws random cache contents — the values
do not change the cost — while tests/test_decode.py checks, on a real prefill, that the cached step's
logits equal the full forward's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from architectures import transformer_cost as tc
from architectures.inputs import tiled_randn
from architectures.layers.kv_cache import StaticKVCache, StaticKVState
from architectures.transformer import DECODERS, Decoder, DecoderConfig, _describe, _small, lm_logits
from harness.api import ArchSpec, Workload, register


@dataclass(frozen=True)
class DecodeStepConfig(DecoderConfig):
    """A decoder's config plus how the step is taken."""

    use_cache: bool = True                 # True: one token against a prefilled cache; False: rerun n+1 tokens


class DecodeStep(nn.Module):
    """``forward(token (B, 1), k₀, v₀, …)`` or ``forward(tokens (B, n+1))`` -> logits (B, 1, vocab)."""

    def __init__(self, cfg: DecodeStepConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = Decoder(cfg)
        self._kept: list[StaticKVState] = []          # the caches of the last call's shapes (a list: not a submodule)

    def _state(self, cache: tuple[Tensor, ...]) -> StaticKVState:
        """One :class:`StaticKVCache` per layer over ``cache``'s buffers: the kept ones when they have the same
        slots, device and tensor type, else new ones (their bookkeeping, ``slot_pos`` and ``pos``, is all they own)."""
        k = cache[0]
        kept = self._kept[0] if self._kept else None
        if kept is None or any(c.size != k.shape[2] or c.pos.device != k.device or type(c.pos) is not type(k)
                               for c in kept):
            kept = StaticKVState(StaticKVCache.over(k, v, k.shape[2] - 1) for k, v in zip(cache[0::2], cache[1::2]))
            self._kept[:] = [kept]
        else:
            for c, k, v in zip(kept, cache[0::2], cache[1::2]):
                c.adopt(k, v)
        return kept

    def forward(self, tokens: Tensor, *cache: Tensor) -> Tensor:
        dec = self.decoder
        if self.cfg.use_cache:
            n_layers = len(dec.stack.blocks)
            if len(cache) != 2 * n_layers:
                raise ValueError(f"need k and v for each of {n_layers} layers, got {len(cache)} tensors")
            state = self._state(cache)
            try:
                return dec.decode(tokens, state).unsqueeze(1)             # (B, 1, vocab): Decoder.decode, in place
            finally:
                for c in state:
                    c.release()                                           # the inputs are not kept alive
        if cache:
            raise ValueError("use_cache=False takes only the token sequence")
        h = dec.stack(dec.tok(tokens))                                    # (B, n+1, d)
        return lm_logits(h[:, -1:], dec.tok, dec.head)                    # (B, 1, vocab)


def _context(w: Workload) -> int:
    if w.seq_len is None:
        raise ValueError("a decode-step workload needs seq_len (the context length)")
    return w.seq_len


def decode_inputs(cfg: DecodeStepConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """use_cache: the newest token (B, 1) + k, v per layer, each (B, Hkv, n + 1, hd) (the last slot is the one the
    step writes); else tokens (B, n+1)."""
    n, b = _context(w), w.batch_size
    g = torch.Generator().manual_seed(0)
    if not cfg.use_cache:
        return (torch.randint(0, cfg.vocab_size, (b, n + 1), generator=g).to(device),)
    token = torch.randint(0, cfg.vocab_size, (b, 1), generator=g).to(device)
    shape = (b, cfg.kv_heads, n + 1, cfg.head_dim)
    cache = [tiled_randn(shape, 2, device, g) for _ in range(2 * cfg.n_layers)]   # (B, Hkv, n + 1, hd) each
    return (token, *cache)


def step_max_len(cfg: DecodeStepConfig) -> int | None:
    """The longest context: the new token takes position n, so learned positions allow n ≤ max_seq_len − 1."""
    return cfg.max_seq_len - 1 if cfg.positions == "learned" else None


def step_cost(cfg: DecodeStepConfig, w: Workload) -> dict[str, int]:
    """Forward MACs of one step (matmuls only, as :mod:`architectures.transformer_cost` counts them),
    parameters, and the bytes of the context's cache the step reads (0 without a cache; the inputs hold one slot
    more, the one the step writes)."""
    n, b = _context(w), w.batch_size
    head = b * cfg.d_model * cfg.vocab_size                                # last position only
    if cfg.use_cache:
        macs = tc.stack_macs(cfg, b, 1, kv_len=n + 1) + head               # cached keys + the new one
        cache_bytes = tc.kv_cache_bytes(cfg, b, n, w.itemsize)
    else:
        macs = tc.stack_macs(cfg, b, n + 1) + head
        cache_bytes = 0
    return {"params": tc.decoder_params(cfg), "macs": macs, "kv_cache_bytes": cache_bytes}


# Presets: decoder presets as decode steps (the suite varies n_kv_heads and use_cache as lines).
PRESETS: dict[str, DecodeStepConfig] = {
    "decode-step-tiny": DecodeStepConfig(**vars(DECODERS["decoder-tiny"])),
    "decode-step-small": DecodeStepConfig(**vars(DECODERS["decoder-small"])),
    "decode-step-llama-small": DecodeStepConfig(**vars(DECODERS["decoder-llama-small"])),
}


def _register() -> None:
    for name, cfg in PRESETS.items():
        register(ArchSpec(name, "decode-step", cfg, DecodeStep, decode_inputs,
                          f"one decode step (cache in inputs), {_describe(cfg)}", small=_small(cfg),
                          cost=step_cost, max_len=step_max_len))


_register()

