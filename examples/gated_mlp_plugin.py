"""A complete plug-in: a gMLP-style sequence model registered without touching the harness.

    bench list archs --plugin examples/gated_mlp_plugin.py
    bench run examples/gated_mlp_suite.toml --plugin examples/gated_mlp_plugin.py --quick

The contract: a frozen config dataclass (fields typed int/float/bool/str/Literal/X|None, validated in
``__post_init__``), ``build(config) -> nn.Module`` free of devices and timers, ``make_inputs(config,
workload, device) -> tuple`` of forward's positional inputs, and one ``register(ArchSpec(...))`` per
preset. ``small`` makes a tiny version for tests; ``cost`` (optional) gives analytic params and MACs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.api import ArchSpec, Workload, register


@dataclass(frozen=True)
class GatedMLPConfig:
    vocab_size: int = 1024
    d_model: int = 128
    d_ff: int = 512
    n_layers: int = 2
    max_seq_len: int = 4096

    def __post_init__(self) -> None:
        if self.d_ff % 2:
            raise ValueError(f"d_ff must be even (it is split into two halves), got {self.d_ff}")


class SpatialGatingBlock(nn.Module):
    """x + W_out · (u ⊙ W_seq v), where (u, v) = split(GELU(W_in · LN(x))) and W_seq mixes tokens."""

    def __init__(self, cfg: GatedMLPConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.gate_norm = nn.LayerNorm(cfg.d_ff // 2)
        self.seq = nn.Parameter(torch.zeros(cfg.max_seq_len, cfg.max_seq_len))   # token mixing, causal-free
        self.down = nn.Linear(cfg.d_ff // 2, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:                        # (B, T, d) -> (B, T, d)
        t = x.shape[1]
        u, v = nn.functional.gelu(self.up(self.norm(x))).chunk(2, dim=-1)   # 2 × (B, T, d_ff/2)
        v = self.seq[:t, :t] @ self.gate_norm(v) + v                   # (B, T, d_ff/2)
        return x + self.down(u * v)


class GatedMLP(nn.Module):
    def __init__(self, cfg: GatedMLPConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.Sequential(*(SpatialGatingBlock(cfg) for _ in range(cfg.n_layers)))
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:                   # (B, T) -> (B, T, vocab)
        return self.head(self.blocks(self.embed(tokens)))


def token_inputs(cfg: GatedMLPConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (w.batch_size, w.seq_len or 128), generator=g).to(device),)


register(ArchSpec("example-gmlp", "example", GatedMLPConfig(), GatedMLP, token_inputs,
                  "plug-in example: gMLP-style spatial gating",
                  small=(("vocab_size", 32), ("d_model", 16), ("d_ff", 32), ("max_seq_len", 64))))
