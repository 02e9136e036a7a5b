"""PyTorch's own modules as architectures: the references "ours" is measured against.

* ``torch-encoder-layer``: ``nn.TransformerEncoderLayer`` (batch_first), the counterpart of ``encoder-layer``;
* ``torch-mha``: ``nn.MultiheadAttention`` called as self-attention, output only (``need_weights=False``),
  the counterpart of ``attention-layer``.

Same default sizes and the same config field names as ours (:mod:`architectures.single_layer`), so one
suite line differs from its neighbour by ``arch`` alone; input (B, T, d). In eval + no_grad PyTorch takes
its fused "fast path" (``torch._transformer_encoder_layer_fwd``, ``torch._native_multi_head_attention``):
that is what users get by default and what these presets run. ``fastpath=False`` runs the modules'
ordinary path instead (``F.scaled_dot_product_attention``, as ours does), by switching
``torch.backends.mha`` off around the call and back on after it.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from architectures import transformer_cost as tc
from architectures.inputs import hidden_inputs, need_seq_len
from architectures.layers.attention import exact_mix_macs
from harness.api import ArchSpec, Workload, register


@dataclass(frozen=True)
class TorchMHAConfig:
    """``nn.MultiheadAttention(d_model, n_heads, dropout, bias, batch_first=True)``."""

    d_model: int = 512
    n_heads: int = 8
    dropout: float = 0.0
    bias: bool = True
    fastpath: bool = True                 # False: torch.backends.mha fast path off (the ordinary path)

    def __post_init__(self) -> None:
        if self.d_model <= 0 or self.n_heads <= 0:
            raise ValueError("d_model and n_heads must be positive")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    # the fields transformer_cost reads for an attention (MHA: as many k/v heads as heads)
    @property
    def kv_heads(self) -> int:
        return self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class TorchEncoderLayerConfig(TorchMHAConfig):
    """``nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, activation, norm_first, bias,
    batch_first=True)``; LayerNorm eps 1e-5 (torch's default, and ours)."""

    d_ff: int | None = 2048                # None: 4 · d_model, as in LayerConfig
    activation: Literal["relu", "gelu"] = "relu"
    norm_placement: Literal["pre", "post"] = "post"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")

    @property
    def norm(self) -> str:
        """The one norm nn.TransformerEncoderLayer has (a field transformer_cost reads)."""
        return "layernorm"

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


@contextmanager
def _fastpath(enabled: bool) -> Iterator[None]:
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


class TorchMHA(nn.Module):
    """x (B, T, d) -> nn.MultiheadAttention(x, x, x)[0], (B, T, d)."""

    def __init__(self, cfg: TorchMHAConfig) -> None:
        super().__init__()
        self.fastpath = cfg.fastpath
        self.mha = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, dropout=cfg.dropout, bias=cfg.bias,
                                         batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        if self.fastpath:
            return self.mha(x, x, x, need_weights=False)[0]
        with _fastpath(False):
            return self.mha(x, x, x, need_weights=False)[0]


class TorchEncoderLayer(nn.Module):
    """x (B, T, d) -> nn.TransformerEncoderLayer(x), (B, T, d)."""

    def __init__(self, cfg: TorchEncoderLayerConfig) -> None:
        super().__init__()
        self.fastpath = cfg.fastpath
        self.layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.ff_dim, cfg.dropout, cfg.activation,
                                                batch_first=True, norm_first=cfg.norm_placement == "pre",
                                                bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.fastpath:
            return self.layer(x)
        with _fastpath(False):
            return self.layer(x)


def mha_cost(cfg: TorchMHAConfig, w: Workload) -> dict[str, int]:
    """Exact parameters; forward MACs: q/k/v and out projections, QKᵀ and AV (either path counts these)."""
    b, t = w.batch_size, need_seq_len(w)
    mix = exact_mix_macs(b, t, cfg.n_heads, cfg.head_dim)
    return {"params": tc.attention_params(cfg), "macs": tc.attention_linear_macs(cfg, b * t) + mix}


def encoder_layer_cost(cfg: TorchEncoderLayerConfig, w: Workload) -> dict[str, int]:
    """Exact parameters (two LayerNorms) and forward MACs of one layer, as for ``encoder-layer``."""
    return {"params": tc.block_params(cfg), "macs": tc.block_macs(cfg, w.batch_size, need_seq_len(w))}


SMALL = (("d_model", 32), ("n_heads", 4))

register(ArchSpec("torch-mha", "torch-reference", TorchMHAConfig(), TorchMHA, hidden_inputs,
                  "nn.MultiheadAttention as self-attention (PyTorch's own), d=512, h=8; input (B, T, d)",
                  small=SMALL, cost=mha_cost))
register(ArchSpec("torch-encoder-layer", "torch-reference", TorchEncoderLayerConfig(), TorchEncoderLayer,
                  hidden_inputs, "nn.TransformerEncoderLayer (PyTorch's own), d=512, h=8, d_ff=2048, ReLU, "
                  "post-norm; input (B, T, d)", small=SMALL + (("d_ff", 64),), cost=encoder_layer_cost))
