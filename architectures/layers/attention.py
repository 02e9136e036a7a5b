"""The one attention of the project.

``n_kv_heads`` covers MHA (== n_heads), GQA (divides n_heads) and MQA (1). Self- and
cross-attention share the code; positions enter through two hooks: an additive bias on the
scores (ALiBi, Swin's relative bias) and a rotation of q/k (RoPE). ``impl="eager"`` is the
documents' formula, softmax(QKᵀ/√d_k + bias)·V, kept as the reference; ``impl="sdpa"`` is
PyTorch's fused kernel, chosen once in ``__init__``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

AttnImpl = Literal["eager", "sdpa"]
Rotation = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]  # (q, k, offset) -> (q, k)


def causal_mask(t: int, s: int, device: torch.device, offset: int = 0) -> Tensor:
    """Boolean (t, s) mask, True where query ``offset+i`` may see key ``j`` (j <= offset+i)."""
    i = torch.arange(t, device=device).unsqueeze(1) + offset
    j = torch.arange(s, device=device).unsqueeze(0)
    return j <= i


def eager_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
                    dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
    """softmax(q kᵀ · scale + bias, masked) v, grouping query heads over shared k/v heads.

    q: (B, H, T, hd); k, v: (B, Hkv, S, hd) with H % Hkv == 0; bias broadcastable to (B, H, T, S);
    mask: bool broadcastable to (B, H, T, S), True = keep. Returns (B, H, T, hd).
    """
    b, h, t, hd = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.view(b, hkv, g, t, hd)                                    # (B, Hkv, G, T, hd)
    scores = (qg * scale) @ k.unsqueeze(2).transpose(-2, -1)        # (B, Hkv, G, T, S)
    scores = scores.view(b, h, t, s)                                 # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = weights.view(b, hkv, g, t, s) @ v.unsqueeze(2)            # (B, Hkv, G, T, hd)
    return out.view(b, h, t, hd)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
                   dropout_p: float = 0.0, scale: float | None = None, is_causal: bool = False) -> Tensor:
    """The same contract as :func:`eager_attention` through ``F.scaled_dot_product_attention``."""
    attn_mask = None
    if bias is not None and mask is not None:
        attn_mask = bias.masked_fill(~mask, float("-inf"))
    elif bias is not None:
        attn_mask = bias
    elif mask is not None:
        attn_mask = mask
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal and attn_mask is None,
        scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def core_fn(impl: AttnImpl):
    """The attention core for ``impl`` (:func:`eager_attention` or :func:`sdpa_attention`); a clear error otherwise."""
    if impl not in ("eager", "sdpa"):
        raise ValueError(f"unknown attention impl {impl!r}")
    return eager_attention if impl == "eager" else sdpa_attention


def head_counts(d_model: int, n_heads: int, n_kv_heads: int | None) -> int:
    """Validate the head layout; returns the number of k/v heads (``None`` means MHA)."""
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if d_model % n_heads:
        raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model})")
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
    return n_kv_heads


class Attention(nn.Module):
    """Multi-head attention with ``n_kv_heads`` key/value heads (MHA, GQA or MQA).

    ``kind="self"`` projects q, k, v from ``x`` with one fused matmul; ``kind="cross"`` takes
    k, v from ``context`` (of width ``context_dim``, default d_model).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *,
                 impl: AttnImpl = "sdpa", kind: Literal["self", "cross"] = "self",
                 dropout: float = 0.0, bias: bool = True, context_dim: int | None = None,
                 scale: float | None = None) -> None:
        """``scale`` multiplies q·kᵀ: None is 1/√head_dim (Vaswani); 1.0 switches the scaling off."""
        super().__init__()
        n_kv_heads = head_counts(d_model, n_heads, n_kv_heads)
        core_fn(impl)                                                     # validates impl
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.kind, self.impl, self.dropout, self.scale = kind, impl, dropout, scale
        kv_width = 2 * n_kv_heads * self.head_dim
        if kind == "self":
            self.qkv = nn.Linear(d_model, d_model + kv_width, bias=bias)
        else:
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.kv = nn.Linear(context_dim or d_model, kv_width, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, context: Tensor | None = None, *, causal: bool = False,
                bias: Tensor | None = None, rotate: Rotation | None = None,
                cache: "KVCache | None" = None) -> Tensor:
        """x: (B, T, d_model); context: (B, S, context_dim) for cross-attention. Returns (B, T, d_model)."""
        b, t, d = x.shape
        hd, h, hkv = self.head_dim, self.n_heads, self.n_kv_heads
        if self.kind == "self":
            q, kv = self.qkv(x).split([d, 2 * hkv * hd], dim=-1)          # (B, T, d), (B, T, 2·Hkv·hd)
        else:
            if context is None:
                raise ValueError("cross-attention needs a context")
            q, kv = self.q(x), self.kv(context)                           # (B, T, d), (B, S, 2·Hkv·hd)
        q = q.view(b, t, h, hd).transpose(1, 2)                           # (B, H, T, hd)
        k, v = kv.view(b, -1, 2, hkv, hd).permute(2, 0, 3, 1, 4)          # 2 × (B, Hkv, S, hd)
        offset = cache.length if cache is not None else 0
        if rotate is not None:
            q, k = rotate(q, k, offset)
        if cache is not None:
            k, v = cache.append(k, v)                                     # (B, Hkv, offset+S, hd)
        dropout_p = self.dropout if self.training else 0.0
        # SDPA's own causal flag is top-left aligned: use it only when no cache offset or bias is in play.
        fused_causal = causal and t > 1 and offset == 0 and bias is None and self.impl == "sdpa"
        mask = causal_mask(t, k.shape[2], x.device, offset) if causal and t > 1 and not fused_causal else None
        if self.impl == "sdpa":
            y = sdpa_attention(q, k, v, bias, mask, dropout_p, self.scale, is_causal=fused_causal)
        else:
            y = eager_attention(q, k, v, bias, mask, dropout_p, self.scale)                      # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(b, t, d)                            # (B, T, d)
        return self.out(y)


class KVCache:
    """Keys and values of past positions for incremental decoding: (B, Hkv, L, hd) each."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes
