"""Norms, MLPs and the residual wrapper that owns norm placement (pre vs post is a class swap)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

NormKind = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "gelu", "swiglu"]


def make_norm(kind: NormKind, d: int, eps: float = 1e-5) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d, eps=eps)
    raise ValueError(f"unknown norm {kind!r}")


class MLP(nn.Module):
    """Position-wise feed-forward: d → d_ff → d with ReLU/GELU, or gated SwiGLU (two input matrices)."""

    def __init__(self, d: int, d_ff: int, activation: Activation = "gelu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.gated = activation == "swiglu"
        self.up = nn.Linear(d, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "swiglu": nn.SiLU()}[activation]
        self.down = nn.Linear(d_ff, d, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:                    # (B, T, d) -> (B, T, d)
        h = self.up(x)                                         # (B, T, d_ff) or (B, T, 2·d_ff)
        if self.gated:
            gate, h = h.chunk(2, dim=-1)
            h = self.act(gate) * h
        else:
            h = self.act(h)
        return self.drop(self.down(h))


class PreNorm(nn.Module):
    """x + sublayer(norm(x)): the GPT-2 / modern placement."""

    def __init__(self, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm, self.drop = norm, nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.drop(sublayer(self.norm(x)))


class PostNorm(nn.Module):
    """norm(x + sublayer(x)): the original Transformer's placement."""

    def __init__(self, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm, self.drop = norm, nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + self.drop(sublayer(x)))


RESIDUALS: dict[str, type[nn.Module]] = {"pre": PreNorm, "post": PostNorm}
