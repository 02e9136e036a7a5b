"""One autoregressive decode step as a model, so the harness can time per-token generation.

The model's forward IS one step of greedy generation after a context of ``workload.seq_len`` tokens:

* ``use_cache=True``: the inputs are the newest token (B, 1) and a prefilled KV cache of the context,
  passed as tensors — k₀, v₀, k₁, v₁, … each (B, Hkv, n, hd) — so the model stays stateless and the
  harness counts the cache's bytes as static (inputs). The step wraps them in fresh
  :class:`~architectures.layers.attention.KVCache` objects and runs the decoder's own blocks on the one
  token: each layer attends it to the cached K/V plus its own (``KVCache.append`` concatenates into a
  new tensor, so the input tensors are never mutated). Cost per step ∝ n (scores) + weights.
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
from architectures.layers.attention import KVCache
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

    def forward(self, tokens: Tensor, *cache: Tensor) -> Tensor:
        dec = self.decoder
        if self.cfg.use_cache:
            n_layers = len(dec.stack.blocks)
            if len(cache) != 2 * n_layers:
                raise ValueError(f"need k and v for each of {n_layers} layers, got {len(cache)} tensors")
            caches = []
            for k, v in zip(cache[0::2], cache[1::2]):                    # each (B, Hkv, n, hd)
                c = KVCache()
                c.k, c.v = k, v                                           # append() concatenates: no mutation
                caches.append(c)
            h = dec.stack(dec.tok(tokens), caches=caches)                 # (B, 1, d)
        else:
            if cache:
                raise ValueError("use_cache=False takes only the token sequence")
            h = dec.stack(dec.tok(tokens))                                # (B, n+1, d)
        return lm_logits(h[:, -1:], dec.tok, dec.head)                    # (B, 1, vocab)


def _context(w: Workload) -> int:
    if w.seq_len is None:
        raise ValueError("a decode-step workload needs seq_len (the context length)")
    return w.seq_len


def decode_inputs(cfg: DecodeStepConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """use_cache: the newest token (B, 1) + k, v per layer, each (B, Hkv, n, hd); else tokens (B, n+1)."""
    n, b = _context(w), w.batch_size
    g = torch.Generator().manual_seed(0)
    if not cfg.use_cache:
        return (torch.randint(0, cfg.vocab_size, (b, n + 1), generator=g).to(device),)
    token = torch.randint(0, cfg.vocab_size, (b, 1), generator=g).to(device)
    shape = (b, cfg.kv_heads, n, cfg.head_dim)
    cache = [tiled_randn(shape, 2, device, g) for _ in range(2 * cfg.n_layers)]   # (B, Hkv, n, hd) each
    return (token, *cache)


def step_max_len(cfg: DecodeStepConfig) -> int | None:
    """The longest context: the new token takes position n, so learned positions allow n ≤ max_seq_len − 1."""
    return cfg.max_seq_len - 1 if cfg.positions == "learned" else None


def step_cost(cfg: DecodeStepConfig, w: Workload) -> dict[str, int]:
    """Forward MACs of one step (matmuls only, as :mod:`architectures.transformer_cost` counts them),
    parameters, and the bytes of the cache the step reads (0 without a cache)."""
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

