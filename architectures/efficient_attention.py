"""Long-range-arena-style encoders whose self-attention is exact or an efficient approximation.

One family, one axis: ``attention`` picks the mixer — the shared exact :class:`Attention`, or a
sliding window, Linformer, Performer or BigBird layer from :mod:`architectures.layers.efficient`
(same qkv/out parameters, forward (B, T, d) -> (B, T, d)). The stack is a bidirectional encoder
(LRA's tasks are): token + position embedding → n_layers × [pre-norm attention, pre-norm MLP] →
norm → per-token logits. Presets are data; ``cost`` gives exact params and forward MACs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from architectures.layers.attention import Attention
from architectures.layers.blocks import MLP, RESIDUALS, make_norm
from architectures.layers.efficient import (
    BigBirdAttention,
    LinformerAttention,
    PerformerAttention,
    WindowAttention,
    exact_mix_macs,
)
from architectures.layers.positions import PositionKind, make_positions
from architectures.transformer import TransformerConfig
from harness.registry import register
from harness.spec import ArchSpec, Workload

AttentionKind = Literal["exact", "window", "linformer", "performer", "bigbird"]


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
    window: int = 128                      # window: keys within `window` positions of each query
    proj_len: int = 256                    # linformer: k, the projected length
    n_features: int = 256                  # performer: m random features
    block: int = 64                        # bigbird: block size
    n_global: int = 2                      # bigbird: leading global blocks
    n_random: int = 3                      # bigbird: random key blocks per query block

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "proj_len", "n_features", "block"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_global < 0 or self.n_random < 0:
            raise ValueError("n_global and n_random must be >= 0")
        if self.positions in ("rope", "alibi"):
            raise ValueError(f"LRA encoders take additive positions (learned, sinusoidal, none), "
                             f"not {self.positions!r}")


def make_attention(cfg: LongEncoderConfig, layer: int = 0) -> nn.Module:
    """The configured mixer; ``layer`` seeds the random parts (Performer's ω, BigBird's blocks)."""
    d, h, kv, bias, impl = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.bias, cfg.attn_impl
    if cfg.attention == "exact":
        return Attention(d, h, kv, impl=impl, bias=bias)
    if cfg.attention == "window":
        return WindowAttention(d, h, kv, window=cfg.window, impl=impl, bias=bias)
    if cfg.attention == "linformer":
        return LinformerAttention(d, h, kv, max_seq_len=cfg.max_seq_len, proj_len=cfg.proj_len, impl=impl, bias=bias)
    if cfg.attention == "performer":
        return PerformerAttention(d, h, kv, n_features=cfg.n_features, seed=layer, bias=bias)
    if cfg.attention == "bigbird":
        return BigBirdAttention(d, h, kv, block=cfg.block, n_global=cfg.n_global, n_random=cfg.n_random,
                                seed=layer, impl=impl, bias=bias)
    raise ValueError(f"unknown attention {cfg.attention!r}")


class EncoderBlock(nn.Module):
    """Bidirectional mixing then MLP, each in the configured residual wrapper; the mixer is injected."""

    def __init__(self, cfg: LongEncoderConfig, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = MLP(cfg.d_model, cfg.ff_dim, cfg.activation, cfg.dropout, cfg.bias)
        residual = RESIDUALS[cfg.norm_placement]
        self.res_attn = residual(make_norm(cfg.norm, cfg.d_model), cfg.dropout)
        self.res_mlp = residual(make_norm(cfg.norm, cfg.d_model), cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:                              # (B, T, d) -> (B, T, d)
        x = self.res_attn(x, self.attn)
        return self.res_mlp(x, self.mlp)


class LongEncoder(nn.Module):
    """Tokens (B, T) -> per-token logits (B, T, vocab)."""

    def __init__(self, cfg: LongEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = make_positions(cfg.positions, cfg.d_model, cfg.max_seq_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(cfg, make_attention(cfg, i)) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.drop(self.pos.embed(self.tok(tokens)))                  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))                                   # (B, T, vocab)


def token_inputs(cfg, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Random token ids (B, T), reproducible (shared with the sequence baselines in rnn.py)."""
    if w.seq_len is None:
        raise ValueError("a sequence workload needs seq_len")
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (w.batch_size, w.seq_len), generator=g).to(device),)


def mix_macs(cfg: LongEncoderConfig, batch: int, t: int) -> int:
    """Forward MACs of one layer's q/k/v mixing (projections excluded)."""
    if cfg.attention == "exact":
        return exact_mix_macs(batch, t, cfg.n_heads, cfg.head_dim)
    with torch.device("meta"):                                           # the formula lives with the layer
        layer = make_attention(cfg)
    return layer.mix_macs(batch, t)


def cost(cfg: LongEncoderConfig, w: Workload) -> dict[str, int]:
    """Exact parameter count and forward MACs (matmul-like work, as harness.flops counts it)."""
    if w.seq_len is None:
        raise ValueError("a sequence workload needs seq_len")
    d, ff, v = cfg.d_model, cfg.ff_dim, cfg.vocab_size
    qkv_width = d + 2 * cfg.kv_heads * cfg.head_dim
    up = 2 * ff if cfg.activation == "swiglu" else ff
    norm = 2 * d if cfg.norm == "layernorm" else d
    layer_weights = d * qkv_width + d * d + d * up + ff * d               # every Linear weight of a block
    layer_params = layer_weights + 2 * norm + (qkv_width + d + up + d if cfg.bias else 0)
    if cfg.attention == "linformer":
        layer_params += 2 * cfg.proj_len * cfg.max_seq_len
    params = v * d + (cfg.max_seq_len * d if cfg.positions == "learned" else 0)
    params += cfg.n_layers * layer_params + norm + d * v
    tokens = w.batch_size * w.seq_len
    macs = tokens * (cfg.n_layers * layer_weights + d * v)
    macs += cfg.n_layers * mix_macs(cfg, w.batch_size, w.seq_len)
    return {"params": params, "macs": macs}


PRESETS: dict[str, LongEncoderConfig] = {
    "lra-exact": LongEncoderConfig(attention="exact"),
    "lra-window": LongEncoderConfig(attention="window", window=128),
    "lra-linformer": LongEncoderConfig(attention="linformer", proj_len=256),
    "lra-performer": LongEncoderConfig(attention="performer", n_features=256),
    "lra-bigbird": LongEncoderConfig(attention="bigbird", block=64, n_global=2, n_random=3),
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2), ("n_heads", 4), ("max_seq_len", 64),
         ("window", 3), ("proj_len", 8), ("n_features", 16), ("block", 4), ("n_global", 1), ("n_random", 1))

_DETAIL = {"exact": "exact softmax attention", "window": "sliding window ±{window}",
           "linformer": "Linformer k={proj_len}", "performer": "Performer FAVOR+ m={n_features}",
           "bigbird": "BigBird blocks of {block}, {n_global} global + {n_random} random"}

for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "lra", _cfg, LongEncoder, token_inputs,
                      f"LRA-style encoder, d={_cfg.d_model}, L={_cfg.n_layers}, h={_cfg.n_heads}, "
                      + _DETAIL[_cfg.attention].format(**vars(_cfg)), small=SMALL, cost=cost))
