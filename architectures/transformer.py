"""Decoder-only transformer (GPT-like) built from the shared layers; presets are data."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from architectures.layers.attention import Attention, AttnImpl, KVCache
from architectures.layers.blocks import MLP, RESIDUALS, Activation, NormKind, make_norm
from architectures.layers.positions import PositionKind, make_positions
from harness.registry import register
from harness.spec import ArchSpec, Workload


@dataclass(frozen=True)
class TransformerConfig:
    """Every axis of the family as a value; invalid combinations fail at construction."""

    vocab_size: int = 8192
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int | None = None          # None: = n_heads (MHA); 1: MQA; else GQA
    d_ff: int | None = None                # None: 4 · d_model
    attn_impl: AttnImpl = "sdpa"
    positions: PositionKind = "sinusoidal"
    max_seq_len: int = 2048                # only bounds learned positions
    norm: NormKind = "layernorm"
    norm_placement: Literal["pre", "post"] = "pre"
    activation: Activation = "gelu"
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        kv = self.kv_heads
        if kv <= 0 or self.n_heads % kv:
            raise ValueError(f"n_kv_heads ({kv}) must divide n_heads ({self.n_heads})")
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class DecoderBlock(nn.Module):
    """Causal self-attention then MLP, each inside the configured residual wrapper."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        residual = RESIDUALS[cfg.norm_placement]
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, impl=cfg.attn_impl,
                              dropout=cfg.dropout, bias=cfg.bias)
        self.mlp = MLP(cfg.d_model, cfg.ff_dim, cfg.activation, cfg.dropout, cfg.bias)
        self.res_attn = residual(make_norm(cfg.norm, cfg.d_model), cfg.dropout)
        self.res_mlp = residual(make_norm(cfg.norm, cfg.d_model), cfg.dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:   # (B, T, d) -> (B, T, d)
        x = self.res_attn(x, lambda h: self.attn(h, causal=True, cache=cache))
        return self.res_mlp(x, self.mlp)


class Decoder(nn.Module):
    """GPT-like language model: tokens (B, T) -> logits (B, T, vocab)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = make_positions(cfg.positions, cfg.d_model, cfg.max_seq_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model) if cfg.norm_placement == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: Tensor, caches: list[KVCache] | None = None) -> Tensor:
        offset = caches[0].length if caches else 0
        x = self.drop(self.pos.embed(self.tok(tokens), offset))          # (B, T, d)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches else None)
        return self.head(self.norm(x))                                   # (B, T, vocab)


def token_inputs(cfg: TransformerConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Random token ids (B, T), reproducible."""
    if w.seq_len is None:
        raise ValueError("a transformer workload needs seq_len")
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (w.batch_size, w.seq_len), generator=g).to(device),)


PRESETS: dict[str, TransformerConfig] = {
    "decoder-tiny": TransformerConfig(vocab_size=1024, d_model=128, n_layers=2, n_heads=4),
    "decoder-small": TransformerConfig(d_model=512, n_layers=6, n_heads=8),
    "decoder-gqa2-small": TransformerConfig(d_model=512, n_layers=6, n_heads=8, n_kv_heads=2),
    "decoder-mqa-small": TransformerConfig(d_model=512, n_layers=6, n_heads=8, n_kv_heads=1),
    "decoder-base": TransformerConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12),
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2), ("n_heads", 4))

for _name, _cfg in PRESETS.items():
    _small = SMALL + ((("n_kv_heads", min(_cfg.kv_heads, 2)),) if _cfg.n_kv_heads is not None else ())
    register(ArchSpec(_name, "decoder", _cfg, Decoder, token_inputs,
                      f"decoder-only, d={_cfg.d_model}, L={_cfg.n_layers}, h={_cfg.n_heads}, kv={_cfg.kv_heads}",
                      small=_small))
