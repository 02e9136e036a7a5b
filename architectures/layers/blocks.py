"""Norms, MLPs and the residual wrapper that owns norm placement (pre vs post is a class swap)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from architectures.layers.tensor_parallel import Reduce, RowSplitLinear, keep_rows, share

NormKind = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "gelu", "gelu_tanh", "swiglu"]   # gelu_tanh: GPT-2's tanh approximation


def make_norm(kind: NormKind, d: int, eps: float = 1e-5) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d, eps=eps)
    raise ValueError(f"unknown norm {kind!r}")


def make_dropout(p: float) -> Callable[[Tensor], Tensor]:
    """``nn.Dropout(p)``, or the identity when p == 0: chosen once, so a dropout-free layer makes no
    module call per use (~5 µs each, ~4% of a small encoder layer's forward)."""
    return nn.Dropout(p) if p > 0 else _identity


def _identity(x: Tensor) -> Tensor:
    return x


def _gelu_tanh_(x: Tensor) -> Tensor:
    return torch.ops.aten.gelu_(x, approximate="tanh")


_IN_PLACE: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu_, "gelu": torch.ops.aten.gelu_, "gelu_tanh": _gelu_tanh_, "swiglu": torch.ops.aten.silu_}


class MLP(nn.Module):
    """Position-wise feed-forward: d → d_ff → d with ReLU/GELU (exact, or GPT-2's tanh approximation), or gated
    SwiGLU (two input matrices).

    The activation runs in place on the up-projection's fresh output whenever autograd does not need
    that output (under no_grad/inference): the same numbers, one (B, T, d_ff) allocation and memory pass
    fewer — what PyTorch's fused encoder fast path does too. With autograd it runs out of place: the
    output is a view of the Linear's 2-D result, and an in-place op on a view costs autograd a
    CopySlices + as_strided copy in backward (~5% of a training step of an encoder layer).
    """

    def __init__(self, d: int, d_ff: int, activation: Activation = "gelu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.gated = activation == "swiglu"
        self.up = nn.Linear(d, 2 * d_ff if self.gated else d_ff, bias=bias)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"),
                    "swiglu": nn.SiLU()}[activation]
        self.activation = activation
        self.down = nn.Linear(d_ff, d, bias=bias)
        self.drop = make_dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:                    # (B, T, d) -> (B, T, d)
        h = self.up(x)                                         # (B, T, d_ff) or (B, T, 2·d_ff)
        in_place = not (torch.is_grad_enabled() and h.requires_grad)
        if self.gated:
            gate, h = h.chunk(2, dim=-1)                       # 2 × (B, T, d_ff)
            h = (_IN_PLACE[self.activation](gate) if in_place else self.act(gate)) * h
        else:
            h = _IN_PLACE[self.activation](h) if in_place else self.act(h)
        return self.drop(self.down(h))

    def split_heads(self, rank: int, world: int, reduce: Reduce) -> None:
        """Keep rank ``rank``'s share of the hidden width, in place (tensor parallelism,
        :mod:`architectures.layers.tensor_parallel`): its d_ff/N columns of ``up`` (of the gate and of the value
        halves when gated) and the matching rows of ``down``, summed over the ranks by ``reduce``."""
        d_ff = self.down.in_features
        mine = share(d_ff, rank, world, self.up.weight.device)           # (d_ff/N,)
        self.up = keep_rows(self.up, torch.cat([mine, d_ff + mine]) if self.gated else mine)
        self.down = RowSplitLinear(self.down, mine, reduce)


class PreNorm(nn.Module):
    """x + sublayer(norm(x)): the GPT-2 / modern placement."""

    def __init__(self, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm, self.drop = norm, make_dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return x + self.drop(sublayer(self.norm(x)))


class PostNorm(nn.Module):
    """norm(x + sublayer(x)): the original Transformer's placement."""

    def __init__(self, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm, self.drop = norm, make_dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + self.drop(sublayer(x)))


RESIDUALS: dict[str, type[nn.Module]] = {"pre": PreNorm, "post": PostNorm}


class Block(nn.Module):
    """One transformer layer from injected parts (the Annotated Transformer's ``EncoderLayer``):
    self-attention, then cross-attention if one is given, then the MLP — each inside its own
    residual wrapper made by ``residual()`` (PreNorm or PostNorm: the placement is a class swap).

    Encoder layer: ``Block(attn, mlp, residual)``; decoder-only layer: the same, called with
    ``causal=True``; encoder-decoder decoder layer: ``Block(attn, mlp, residual, cross_attn)``.
    """

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, residual: Callable[[], nn.Module],
                 cross_attn: nn.Module | None = None) -> None:
        super().__init__()
        self.attn, self.cross_attn, self.mlp = self_attn, cross_attn, mlp
        self.res_attn = residual()
        self.res_cross = residual() if cross_attn is not None else None
        self.res_mlp = residual()

    def forward(self, x: Tensor, context: Tensor | None = None, *, causal: bool = False,
                bias: Tensor | None = None, rotate: Callable | None = None, cache=None) -> Tensor:
        """x: (B, T, d); context: (B, S, d) for cross-attention. Returns (B, T, d)."""
        if causal or bias is not None or rotate is not None or cache is not None:
            x = self.res_attn(x, lambda h: self.attn(h, causal=causal, bias=bias, rotate=rotate, cache=cache))
        else:                                   # an encoder layer (ViT): no closure per call
            x = self.res_attn(x, self.attn)
        if self.cross_attn is not None:
            x = self.res_cross(x, lambda h: self.cross_attn(h, context))
        return self.res_mlp(x, self.mlp)

    def split_heads(self, rank: int, world: int, reduce: Reduce) -> None:
        """Keep rank ``rank``'s share of the attention heads and the MLP width, in place (tensor parallelism):
        two all-reduces per layer, after the attention's output projection and after the MLP."""
        if self.cross_attn is not None:
            raise ValueError("a layer with cross-attention does not split over ranks")
        self.attn.split_heads(rank, world, reduce)
        self.mlp.split_heads(rank, world, reduce)
