"""Position information behind one small interface.

A scheme may add to the token embeddings (``embed``), contribute an additive attention bias
(``bias``) or rotate q/k (``rotate``); the attention module calls the hooks it is given.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

PositionKind = Literal["none", "learned", "sinusoidal"]


class Positions(nn.Module):
    """Base: no position information (self-attention stays permutation-equivariant)."""

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:     # (B, T, d) -> (B, T, d)
        return x


class LearnedPositions(Positions):
    """A trained table of ``max_len`` vectors; positions past it are an error, never garbage."""

    def __init__(self, max_len: int, d: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if offset + t > self.max_len:
            raise ValueError(f"learned positions cover {self.max_len} tokens; got position {offset + t - 1}"
                             f" (raise max_seq_len or use sinusoidal/rope/alibi positions)")
        return x + self.table.weight[offset:offset + t]        # (T, d) broadcast over B


class SinusoidalPositions(Positions):
    """Vaswani et al.: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d)),
                             persistent=False)
        self.d = d

    def table(self, t: int, offset: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        pos = torch.arange(offset, offset + t, device=device, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq[None, :]          # (T, d/2)
        pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, d/2, 2)
        return pe.flatten(1)[:, : self.d].to(dtype)              # (T, d)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.table(x.shape[1], offset, x.device, x.dtype)


def make_positions(kind: PositionKind, d: int, max_len: int) -> Positions:
    if kind == "none":
        return Positions()
    if kind == "learned":
        return LearnedPositions(max_len, d)
    if kind == "sinusoidal":
        return SinusoidalPositions(d)
    raise ValueError(f"unknown positions {kind!r}")
