"""Fused attention ops: every SDPA kernel's aten op, forward and backward, GQA-aware.

What a fused *causal* kernel executes is about half of the dense count: :func:`fused_attention_call` gives,
per call of a fused attention op, the dense MACs and those its causal mask skips (:func:`causal_scores`);
:mod:`harness.instruments.kernels` sums them over a real step (``executed_macs``). The FLOP counter counts
the dense figure (:mod:`harness.instruments.flops.registry` registers :func:`fused_attention_flops` for every
op of :data:`FUSED_ATTENTION`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch._subclasses.fake_tensor import is_fake

from harness.instruments.flops.formulas import sdpa_backward_flops, sdpa_flops

__all__ = ["FUSED_ATTENTION", "AttentionCall", "FusedAttention", "causal_scores", "fused_attention_call",
           "fused_attention_flops"]

aten = torch.ops.aten

Shape = tuple[int, ...]
Align = Literal["top_left", "bottom_right"]


def causal_scores(lq: int, lk: int, align: Align = "top_left") -> int:
    """Scores a causal kernel computes for one (batch, head): query i sees key j when j <= i
    (``"top_left"``, SDPA's ``is_causal``) or j <= i + lk - lq (``"bottom_right"``, flash-attn's own and
    the efficient kernel's mask type 2). Square: n(n+1)/2. This is the exact lower triangle; real kernels
    work in tiles (e.g. 64-128 rows on CUDA, up to 256 on the CPU) and also compute the part of each
    diagonal tile above the diagonal, so they execute a little more (for n within one tile: everything)."""
    if align == "top_left":
        return lq * (lq + 1) // 2 if lq <= lk else lk * (lk + 1) // 2 + (lq - lk) * lk
    off = lk - lq
    return lq * (lq + 1) // 2 + lq * off if off >= 0 else lk * (lk + 1) // 2


def _macs_per_score(d: int, dv: int, backward: bool) -> int:
    """MACs per (query, key) pair: QKᵀ and AV forward (D + Dv); the backward's 5 matmuls (3D + 2Dv)."""
    return 3 * d + 2 * dv if backward else d + dv


@dataclass(frozen=True)
class FusedAttention:
    """How one fused attention aten op takes its arguments (by name, from its schema).

    ``backend``: the SDPA backend it belongs to (``flash``, ``efficient``, ``cudnn``, ``flash_cpu``,
    ``overrideable``, ``math_mps``); ``backward``: a backward op (its first argument is grad_out);
    ``seq_first``: q/k/v are (B, L, H, D) rather than (B, H, L, D); ``varlen``: the names of (cum_seq_q,
    cum_seq_k, max_q, max_k) for packed variable-length batches ((T, H, D) tensors), None if it takes
    none; ``causal``: the argument that makes it causal (``is_causal``, or ``custom_mask_type``: 1
    top-left, 2 bottom-right); ``align``: where ``is_causal``'s diagonal starts when Lq != Lk;
    ``skips``: whether its causal mode skips the masked scores (the math kernel computes them all).
    """

    backend: str
    backward: bool
    seq_first: bool = False
    varlen: tuple[str, str, str, str] | None = None
    causal: str = "is_causal"
    align: Align = "top_left"
    skips: bool = True


_FLASH_VARLEN = ("cum_seq_q", "cum_seq_k", "max_q", "max_k")
_EFF_VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
_FUSED_ATTENTION_ALL: dict[str, FusedAttention] = {
    "_scaled_dot_product_flash_attention_for_cpu": FusedAttention("flash_cpu", False),
    "_scaled_dot_product_flash_attention_for_cpu_backward": FusedAttention("flash_cpu", True),
    "_scaled_dot_product_flash_attention": FusedAttention("flash", False),
    "_scaled_dot_product_flash_attention_backward": FusedAttention("flash", True),
    "_scaled_dot_product_efficient_attention": FusedAttention("efficient", False),
    "_scaled_dot_product_efficient_attention_backward": FusedAttention("efficient", True),
    "_scaled_dot_product_cudnn_attention": FusedAttention("cudnn", False),
    "_scaled_dot_product_cudnn_attention_backward": FusedAttention("cudnn", True),
    "_scaled_dot_product_fused_attention_overrideable": FusedAttention("overrideable", False),
    "_scaled_dot_product_fused_attention_overrideable_backward": FusedAttention("overrideable", True),
    "_flash_attention_forward": FusedAttention("flash", False, True, _FLASH_VARLEN, align="bottom_right"),
    "_flash_attention_backward": FusedAttention("flash", True, True, _FLASH_VARLEN, align="bottom_right"),
    "_efficient_attention_forward": FusedAttention("efficient", False, True, _EFF_VARLEN, "custom_mask_type"),
    "_efficient_attention_backward": FusedAttention("efficient", True, True, _EFF_VARLEN, "custom_mask_type"),
    "_cudnn_attention_forward": FusedAttention("cudnn", False, False, _FLASH_VARLEN),
    "_cudnn_attention_backward": FusedAttention("cudnn", True, False, _FLASH_VARLEN),
    "_scaled_dot_product_attention_math_for_mps": FusedAttention("math_mps", False, skips=False),
}
FUSED_ATTENTION: dict[str, FusedAttention] = {
    name: spec for name, spec in _FUSED_ATTENTION_ALL.items() if hasattr(aten, name)}
"""The fused attention ops of this torch build (aten packet name → how it takes its arguments)."""


@dataclass(frozen=True)
class AttentionCall:
    """One call of a fused attention op: its backend, direction, the dense MACs the counter gives it
    and the MACs its causal mask skips (0 unless causal): executed = dense_macs - skipped_macs."""

    backend: str
    backward: bool
    dense_macs: int
    skipped_macs: int


def _bind(schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An op call's arguments by name (defaults filled in) from its schema."""
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    return bound


def _lengths(offsets: Any, max_len: Any, n: int) -> list[int]:
    """Sequence lengths of a packed batch from its cumulative offsets; every one ``max_len`` when the offsets
    hold no data (fake or meta tensors: the count is then an upper bound, as the stock formulas do)."""
    if isinstance(offsets, torch.Tensor) and not is_fake(offsets) and offsets.device.type != "meta":
        return [int(x) for x in offsets.diff().tolist()]
    return [int(max_len)] * n


def _attention_shapes(spec: FusedAttention, bound: dict[str, Any]) -> list[tuple[Shape, Shape, Shape]]:
    """The (B, H, L, D) shapes of q, k, v of each attention one fused op call computes (one per sequence
    of a packed batch)."""
    q, k, v = bound["query"], bound["key"], bound["value"]
    if spec.varlen is not None and bound.get(spec.varlen[0]) is not None:     # packed: (T, H, D) each
        cum_q, cum_k, max_q, max_k = (bound[name] for name in spec.varlen)
        n = int(cum_q.shape[0]) - 1
        (hq, d), (hkv, dk), (hv, dv) = (tuple(t.shape[-2:]) for t in (q, k, v))
        return [((1, hq, lq, d), (1, hkv, lk, dk), (1, hv, lk, dv))
                for lq, lk in zip(_lengths(cum_q, max_q, n), _lengths(cum_k, max_k, n), strict=True)]
    shapes = [tuple(int(x) for x in t.shape) for t in (q, k, v)]
    if spec.seq_first:                                                          # (B, L, H, D) -> (B, H, L, D)
        shapes = [(*s[:-3], s[-2], s[-3], s[-1]) for s in shapes]
    return [tuple(shapes)]                                                      # type: ignore[list-item]


def _causal_align(spec: FusedAttention, bound: dict[str, Any]) -> Align | None:
    flag = bound.get(spec.causal)
    if spec.causal == "custom_mask_type":
        return {1: "top_left", 2: "bottom_right"}.get(int(flag or 0))
    return spec.align if flag else None


def fused_attention_call(func: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None
                         ) -> AttentionCall | None:
    """The MACs of one call ``func(*args, **kwargs)`` of a fused attention op (an ``OpOverload``), dense and
    skipped by its causal mask; None when ``func`` is not one of :data:`FUSED_ATTENTION`. GQA/MQA: counted
    with the query heads, whatever the k/v heads."""
    spec = FUSED_ATTENTION.get(getattr(getattr(func, "_overloadpacket", func), "__name__", ""))
    if spec is None:
        return None
    bound = _bind(func._schema, args, kwargs or {})
    align = _causal_align(spec, bound) if spec.skips else None
    dense = skipped = 0
    for qs, ks, vs in _attention_shapes(spec, bound):
        flops = (sdpa_backward_flops if spec.backward else sdpa_flops)(qs, ks, vs)   # also checks the shapes
        dense += flops // 2
        if align is not None:
            lq, lk = qs[-2], ks[-2]
            rows = math.prod(qs[:-2])                                               # B · Hq
            skipped += rows * (lq * lk - causal_scores(lq, lk, align)) * _macs_per_score(qs[-1], vs[-1], spec.backward)
    return AttentionCall(spec.backend, spec.backward, dense, skipped)


def fused_attention_flops(packet: Any, *args: Any, **kwargs: Any) -> int:
    """The FLOP formula of a fused attention op (its default overload's schema names the arguments; q, k, v
    and the packed-batch offsets sit at the same places in every overload)."""
    call = fused_attention_call(packet.default, args, kwargs)
    if call is None:
        raise ValueError(f"{packet} is not a fused attention op")
    return 2 * call.dense_macs

