"""Megatron-style tensor parallelism, the pieces a layer needs to keep its own share of the work in place.

A layer split across ``world`` ranks keeps, on rank ``rank``:

* a **column** share of its first linear (:func:`keep_rows`: the output features of its heads, or of its slice of
  the MLP width), so each rank computes its own heads / hidden units from the whole input, with no communication;
* a **row** share of its last linear (:class:`RowSplitLinear`: the input features those heads / units feed), whose
  partial products the ranks sum with one all-reduce (``reduce``, injected by the harness), the bias added once,
  after the sum.

The layers know their own layouts (the fused ``qkv`` of :class:`architectures.layers.attention.Attention`, the
gated ``up`` of :class:`architectures.layers.blocks.MLP`); the harness supplies ``reduce`` and never looks inside.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Reduce = Callable[[Tensor], Tensor]
"""Sums a tensor over the ranks (an all-reduce) and returns the sum: every rank gets the same."""


def share(n: int, rank: int, world: int, device: torch.device | None = None) -> Tensor:
    """Rank ``rank``'s contiguous share of ``n`` units, as indices (n/world,); ``world`` must divide ``n``."""
    if n % world:
        raise ValueError(f"{n} units do not split evenly over {world} ranks")
    per = n // world
    return torch.arange(rank * per, (rank + 1) * per, device=device)


def keep_rows(linear: nn.Linear, rows: Tensor) -> nn.Linear:
    """A new linear with only ``rows`` (1-D indices) of ``linear``'s output features (column parallelism)."""
    out = nn.Linear(linear.in_features, rows.numel(), bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rows])
    return out


class RowSplitLinear(nn.Module):
    """``linear`` with only ``cols`` of its input features (row parallelism): y = reduce(x · W[:, cols]ᵀ) + b.
    x: (..., len(cols)) -> (..., out_features), the same on every rank."""

    def __init__(self, linear: nn.Linear, cols: Tensor, reduce: Reduce) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone(), requires_grad=linear.weight.requires_grad)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                 requires_grad=linear.bias.requires_grad)
        self.reduce = reduce

    def forward(self, x: Tensor) -> Tensor:
        y = self.reduce(F.linear(x, self.weight))          # (..., out): the partial products summed over the ranks
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]} (this rank's), out_features={self.weight.shape[0]}"
