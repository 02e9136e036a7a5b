"""Long-range-arena-style encoders whose self-attention is exact or an efficient approximation.

One family, one axis: ``attention`` picks the core of the one :class:`Attention` — exact, or the
sliding-window, Longformer, Linformer, Performer or BigBird core of :mod:`architectures.layers.efficient` (the
projections and their parameters are the same for all; :data:`CORES` is the chooser, as data). The
stack is a bidirectional encoder (LRA's tasks are): token + position embedding → n_layers × the shared
``Block`` [attention, MLP] → norm → per-token logits. Presets are data; ``cost`` gives exact params
and forward MACs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from architectures import transformer_cost as tc
from architectures.inputs import need_seq_len, token_inputs
from architectures.layers.attention import Attention, Core, ExactCore
from architectures.layers.blocks import MLP, RESIDUALS, Block, make_norm
from architectures.layers.efficient import (
    BigBirdCore,
    LinformerCore,
    LongformerCore,
    PerformerCore,
    SlidingWindowCore,
)
from architectures.layers.positions import PositionKind, make_positions
from architectures.transformer import TransformerConfig
from harness.api import ArchSpec, Workload, register

AttentionKind = Literal["exact", "window", "linformer", "performer", "bigbird", "longformer"]


@dataclass(frozen=True)
class LongEncoderConfig(TransformerConfig):
    """A transformer stack's fields (LRA-sized defaults) plus each mixer's own knobs (read only by it)."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 4096                # learned positions and Linformer's E, F
    positions: PositionKind = "learned"    # additive schemes only: learned, sinusoidal, none
    attention: AttentionKind = "exact"
    window: int = 128                      # window, longformer: keys within `window` positions of each query
    proj_len: int = 256                    # linformer: k, the projected length
    n_features: int = 256                  # performer: m random features
    block: int = 64                        # bigbird: block size
    n_global: int = 2                      # bigbird: leading global blocks
    n_random: int = 3                      # bigbird: random key blocks per query block
    n_global_tokens: int = 1               # longformer: leading global tokens (see and are seen by all)
    dilation: int = 1                      # longformer: the window looks at every `dilation`-th key

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "proj_len", "n_features", "block", "dilation"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_global < 0 or self.n_random < 0 or self.n_global_tokens < 0:
            raise ValueError("n_global, n_random and n_global_tokens must be >= 0")
        if self.positions in ("rope", "alibi"):
            raise ValueError(f"LRA encoders take additive positions (learned, sinusoidal, none), "
                             f"not {self.positions!r}")


CORES: dict[str, Callable[[LongEncoderConfig, int], Core]] = {
    "exact": lambda cfg, layer: ExactCore(cfg.attn_impl),
    "window": lambda cfg, layer: SlidingWindowCore(cfg.window, cfg.attn_impl),
    "linformer": lambda cfg, layer: LinformerCore(cfg.max_seq_len, cfg.proj_len, cfg.attn_impl),
    "performer": lambda cfg, layer: PerformerCore(cfg.head_dim, cfg.n_features, seed=layer),
    "bigbird": lambda cfg, layer: BigBirdCore(cfg.block, cfg.n_global, cfg.n_random, seed=layer, impl=cfg.attn_impl),
    "longformer": lambda cfg, layer: LongformerCore(cfg.window, cfg.n_global_tokens, cfg.dilation, impl=cfg.attn_impl),
}
"""``attention`` value -> the core of layer ``layer`` (which seeds the random parts: Performer's ω,
BigBird's blocks)."""


def make_attention(cfg: LongEncoderConfig, layer: int = 0) -> Attention:
    """The one Attention with the configured core."""
    return Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, core=CORES[cfg.attention](cfg, layer), bias=cfg.bias)


def make_block(cfg: LongEncoderConfig, layer: int) -> Block:
    """Attention with the configured core, then the MLP, each in the configured residual wrapper."""
    return Block(make_attention(cfg, layer), MLP(cfg.d_model, cfg.ff_dim, cfg.activation, cfg.dropout, cfg.bias),
                 lambda: RESIDUALS[cfg.norm_placement](make_norm(cfg.norm, cfg.d_model), cfg.dropout))


class LongEncoder(nn.Module):
    """Tokens (B, T) -> per-token logits (B, T, vocab)."""

    def __init__(self, cfg: LongEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = make_positions(cfg.positions, cfg.d_model, cfg.max_seq_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(make_block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.drop(self.pos.embed(self.tok(tokens)))                  # (B, T, d)
        for block in self.blocks:
            x = block(x)                                                 # bidirectional
        return self.head(self.norm(x))                                   # (B, T, vocab)


def mix_macs(cfg: LongEncoderConfig, batch: int, t: int) -> int:
    """Forward MACs of one layer's q/k/v mixing (projections excluded): the core's own formula."""
    with torch.device("meta"):                                           # Linformer's E, F cost nothing here
        layer = make_attention(cfg)
    return layer.mix_macs(batch, t)


def cost(cfg: LongEncoderConfig, w: Workload) -> dict[str, int]:
    """Exact parameter count and forward MACs (matmul-like work, as harness.instruments.flops counts it)."""
    t, b = need_seq_len(w), w.batch_size
    d, v = cfg.d_model, cfg.vocab_size
    core_params = 2 * cfg.proj_len * cfg.max_seq_len if cfg.attention == "linformer" else 0   # E, F
    params = v * d + (cfg.max_seq_len * d if cfg.positions == "learned" else 0)
    params += cfg.n_layers * (tc.block_params(cfg) + core_params) + tc.norm_params(cfg) + d * v
    layer_macs = tc.attention_linear_macs(cfg, b * t) + mix_macs(cfg, b, t) + tc.mlp_macs(cfg, b * t)
    macs = cfg.n_layers * layer_macs + b * t * d * v
    return {"params": params, "macs": macs}


def max_len(cfg: LongEncoderConfig) -> int | None:
    """The longest sequence: ``max_seq_len`` with learned positions or Linformer's E, F; unbounded otherwise."""
    return cfg.max_seq_len if cfg.positions == "learned" or cfg.attention == "linformer" else None


PRESETS: dict[str, LongEncoderConfig] = {
    "lra-exact": LongEncoderConfig(attention="exact"),
    "lra-window": LongEncoderConfig(attention="window", window=128),
    "lra-linformer": LongEncoderConfig(attention="linformer", proj_len=256),
    "lra-performer": LongEncoderConfig(attention="performer", n_features=256),
    "lra-bigbird": LongEncoderConfig(attention="bigbird", block=64, n_global=2, n_random=3),
    "lra-longformer": LongEncoderConfig(attention="longformer", window=128, n_global_tokens=1, dilation=1),
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2), ("n_heads", 4), ("max_seq_len", 64),
         ("window", 3), ("proj_len", 8), ("n_features", 16), ("block", 4), ("n_global", 1), ("n_random", 1))

_DETAIL = {"exact": "exact softmax attention", "window": "sliding window ±{window}",
           "linformer": "Linformer k={proj_len}", "performer": "Performer FAVOR+ m={n_features}",
           "bigbird": "BigBird blocks of {block}, {n_global} global + {n_random} random",
           "longformer": "Longformer window ±{window} (dilation {dilation}) + {n_global_tokens} global token(s)"}

for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "lra", _cfg, LongEncoder, token_inputs,
                      f"LRA-style encoder, d={_cfg.d_model}, L={_cfg.n_layers}, h={_cfg.n_heads}, "
                      + _DETAIL[_cfg.attention].format(**vars(_cfg)), small=SMALL, cost=cost, max_len=max_len))
