"""FLOP / MAC counter: ``torch.utils.flop_counter.FlopCounterMode`` plus formulas for the ops it misses.

Conventions (the stock counter's, kept unchanged):

* A multiply-accumulate is 2 FLOPs; only matmul-like work is counted (convolutions, matmuls,
  attention). Elementwise ops, norms, softmax, activations, reductions and bias adds are 0.
  ``macs = flops // 2`` is what vision papers and torchvision's ``meta["_ops"]`` report (GMACs).
* Attention counts QKᵀ and AV over the *full* score matrix. A causal (``is_causal=True``) or
  masked attention is counted like an unmasked one, n² and not n(n+1)/2, as the stock kernels'
  formulas do (it is also what the eager ``softmax(QKᵀ)V`` reference computes). Under GQA/MQA
  the attention matmuls are counted with the *query* heads (each query head attends over its
  shared k/v head); k/v heads only enter the k/v projections.
* Attention backward uses the stock convention of 5 matmuls (recomputed scores, dV, dP, dQ,
  dK), i.e. 2.5x the forward attention matmuls when the head dims are equal.
* What a fused *causal* kernel executes is about half of that: :func:`fused_attention_call` gives,
  per call of a fused attention op, the dense MACs and those its causal mask skips
  (:func:`causal_scores`); :mod:`harness.instruments.kernels` sums them over a real step (``executed_macs``).

Counting is shape-only, so it runs on fake tensors (:mod:`harness.instruments.fake`) at no cost: build the
model with ``build_fake`` and make the inputs inside the same mode, then call
:func:`count_model` (inside or outside ``with mode``: both count the same). Real and fake
tensors give identical counts (``by_module`` included).

What the stock counter (torch 2.14) misses and this module adds (:data:`EXTRA_FORMULAS`):

* Every fused attention op, forward and backward (:data:`FUSED_ATTENTION`): the SDPA kernels
  ``aten._scaled_dot_product_{flash_attention_for_cpu, flash_attention, efficient_attention,
  cudnn_attention, fused_attention_overrideable}`` (+ ``_backward``), the raw kernels they call
  (``_flash_attention_*``, ``_efficient_attention_*``, ``_cudnn_attention_*``, (B, L, H, D) or packed
  variable-length layouts) and MPS's ``_scaled_dot_product_attention_math_for_mps``. The CPU one the
  stock counter counts 0; the CUDA ones it counts, but torch 2.11's formulas assert Hq == Hkv
  ("query/key/value shapes are incompatible": every bf16 GQA case on the H100 failed in the fake
  pass). k/v keep their Hkv heads under ``enable_gqa=True``; these formulas handle Hq != Hkv and
  count the dense score matrix with the query heads, as above. Ops missing from a torch build are
  skipped (looked up by name).
* ``aten._native_multi_head_attention``: ``nn.MultiheadAttention``'s fused fast path (eval,
  no grad, batched self-attention): q/k/v in-projection, QKᵀ, AV and the out-projection in one
  op. torchvision's ViT-B/16 counts 11.27 GMACs instead of 17.56 without it.
* ``aten._transformer_encoder_layer_fwd``: ``nn.TransformerEncoderLayer``'s fast path, a whole
  encoder layer (attention as above plus the 2-matmul MLP) in one op.
* ``aten.mkldnn_rnn_layer`` (+ backward): ``nn.LSTM`` on CPU (one call per layer and direction).
  The fused backward is counted as 2x forward (all input, hidden and weight gradients), a bit
  more than the unfused path, which skips the gradients nobody asked for.
* ``aten.convolution_backward`` is *replaced*: the stock formula ignores ``groups`` in the
  weight gradient, overcounting grouped/depthwise convs' backward by the group count.
* Plain matmul variants: ``mv``, ``addmv``, ``dot``, ``vdot``, ``addbmm``, ``_addmm_activation``,
  ``_int_mm`` (e.g. ``matrix @ vector`` dispatches to ``mv``).
* ``torch.einsum`` whose contracted indices all have length 1: torch lowers it to an elementwise
  ``mul`` (no matmul reaches the dispatcher), so the stock counter sees 0 although the same
  einsum at length ≥ 2 is a counted ``bmm``. :func:`_einsum_counted` wraps ``torch.einsum`` at
  the Python API and, when the ops it dispatched counted nothing, adds :func:`einsum_flops` under
  ``aten.einsum`` (forward only: its backward is elementwise too and stays uncounted).

**A count that cannot be computed is a gap, never 0.** Elementwise ops count 0 by the convention
above; work the counter *cannot* count is recorded in :attr:`FlopCount.gaps` (op → why), and
:func:`count_flops` / :func:`count_model` raise :class:`UncountedFlopsError` naming those ops unless
called with ``allow_gaps=True`` (then the totals are a lower bound, and ``complete`` is False). Three
kinds of gap:

* a formula that cannot read its arguments (e.g. a nested tensor on fake storage); outside
  :func:`count_flops` (a bare ``FlopCounterMode`` with :data:`EXTRA_FORMULAS`) it raises
  :class:`FlopFormulaError` naming the op;
* an op that does matmul work but has no formula (:data:`UNCOUNTED_CONTRACTIONS`: ``_grouped_mm``,
  ``_trilinear``, cuDNN's ``_cudnn_rnn``, ...), or an op outside aten (a custom op: its work is
  unknown) that takes a floating-point tensor;
* an einsum lowered to elementwise ops whose contraction :func:`einsum_flops` cannot cost (three or
  more operands with a contracted index).

:func:`dependency_trace` records every dispatched op of a run with its output bytes and its depth in
the run's data-dependency graph (the longest chain of compute ops leading to it): the sequential
steps of a forward, measured.

**Bytes moved** (:class:`harness.instruments.traffic.ByteCounterMode`, counted in the same pass as the FLOPs): the memory
traffic of the step *if every aten op reads each of its tensor operands once from memory and
writes each of its results once to memory*, with no reuse across ops (nothing stays in cache
between one op and the next). It is the standard roofline model's operational-intensity
denominator (Williams, Waterman & Patterson 2009): ``flops / bytes_moved`` is the arithmetic
intensity in FLOP/byte. It is an upper bound on real DRAM traffic for fused or cache-resident
work (and a lower bound for kernels that re-read operands, such as blocked matmuls that spill).
Per op: the bytes of its distinct tensor inputs (an input's bytes are the elements it addresses
times the element size; a broadcast dimension of stride 0, as made by ``expand``, counts once)
plus the bytes of its distinct tensor outputs. Views and metadata-only ops (``view``,
``_unsafe_view``, ``transpose``, ``t``, ``permute``, ``expand``, ``slice``, ``select``,
``detach``, ``alias``, ``as_strided``, ... — every op whose schema returns an alias of an input
— and ``size``/``stride``/``empty`` and friends) move 0 bytes. In-place ops read and write their
``self`` (``add_``: 3 operands); write-only destinations (``copy_``'s and ``fill_``'s ``self``,
``out=``) are counted as written only. So an fp32 ``(m, k) @ (k, n)`` moves ``4·(mk + kn + mn)``
bytes and an elementwise add of two fp32 ``(n,)`` tensors ``12·n``.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary
from torch.utils.flop_counter import FlopCounterMode

from harness.instruments.outputs import first_tensor
from harness.instruments.traffic import ByteCounterMode

__all__ = [
    "EXTRA_FORMULAS",
    "FUSED_ATTENTION",
    "UNCOUNTED_CONTRACTIONS",
    "AttentionCall",
    "DependencyTrace",
    "FlopCount",
    "FlopFormulaError",
    "FusedAttention",
    "TracedOp",
    "UncountedFlopsError",
    "causal_scores",
    "count_flops",
    "count_model",
    "count_params",
    "dependency_trace",
    "einsum_flops",
    "fused_attention_call",
    "mha_flops",
    "sdpa_backward_flops",
    "sdpa_flops",
]

aten = torch.ops.aten


class FlopFormulaError(RuntimeError):
    """A registered formula could not evaluate its arguments (raised outside :func:`count_flops`,
    which records it as a gap instead)."""


class UncountedFlopsError(RuntimeError):
    """A count met work it cannot count (see :attr:`FlopCount.gaps`); its totals would be a lower bound."""

    def __init__(self, gaps: dict[str, str]) -> None:
        self.gaps = dict(gaps)
        super().__init__("MACs cannot be counted: " + "; ".join(f"{op} ({why})" for op, why in gaps.items()))


@dataclass(frozen=True)
class CountedCall:
    """One dispatched op that counted work, in dispatch order: its packet name, its FLOPs (the same formula the
    totals use) and its first output's shape."""

    op: str
    flops: int
    out_shape: tuple[int, ...]

    @property
    def macs(self) -> int:
        return self.flops // 2


@dataclass(frozen=True)
class FlopCount:
    """The result of a count. ``flops`` is 2 per multiply-accumulate; ``macs = flops // 2``.

    ``bytes_moved`` is the operator-level memory traffic of the same pass (see the module
    docstring: each op reads its operands and writes its results once, no cross-op reuse).
    ``gaps``: ops whose work could not be counted (op → why); when any, ``flops``/``macs`` are a
    lower bound and ``complete`` is False (only ``allow_gaps=True`` returns such a count).
    """

    flops: int
    macs: int
    by_op: dict[str, int]      # flops per aten op packet name, e.g. "aten.addmm"
    by_module: dict[str, int]  # flops per module, to ``module_depth`` (1: the root and its children)
    bytes_moved: int = 0
    bytes_by_op: dict[str, int] = field(default_factory=dict)   # bytes moved per aten op packet name
    gaps: dict[str, str] = field(default_factory=dict)          # op -> why its work is not counted
    calls: tuple[CountedCall, ...] = ()                         # with ``calls=True``: each counting op, in order

    @property
    def complete(self) -> bool:
        """Whether every op's work was counted (no gaps)."""
        return not self.gaps

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte (``flops / bytes_moved``); NaN when nothing moved."""
        return self.flops / self.bytes_moved if self.bytes_moved else math.nan

    @property
    def gflops(self) -> float:
        return self.flops / 1e9

    @property
    def gmacs(self) -> float:
        return self.macs / 1e9


# --------------------------------------------------------------------------------------------
# Formulas. Each returns FLOPs (2 per MAC). Shape-level helpers first, then the op formulas.
# --------------------------------------------------------------------------------------------

def _mm(m: int, k: int, n: int) -> int:
    """(m, k) @ (k, n)."""
    return 2 * m * k * n


def sdpa_flops(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int]) -> int:
    """Forward attention matmuls for q (..., Hq, Lq, D), k (..., Hkv, Lk, D), v (..., Hkv, Lk, Dv).

    QKᵀ + AV = 2·B·Hq·Lq·Lk·(D + Dv); Hkv may divide Hq (GQA/MQA): every query head still does
    its own Lq×Lk score matrix. Causal/masked attention is counted full (see module docstring).
    """
    *batch, hq, lq, d = q_shape
    hkv, lk, dk = k_shape[-3], k_shape[-2], k_shape[-1]
    dv = v_shape[-1]
    if dk != d or v_shape[-2] != lk or v_shape[-3] != hkv or hkv <= 0 or hq % hkv:
        raise ValueError(f"incompatible attention shapes q={tuple(q_shape)} k={tuple(k_shape)} v={tuple(v_shape)}")
    bh = math.prod(batch) * hq
    return bh * (_mm(lq, d, lk) + _mm(lq, lk, dv))


def sdpa_backward_flops(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int]) -> int:
    """Backward attention matmuls, the stock counter's 5: scores recomputed (Lq·Lk·D), dP = dO·Vᵀ
    (Lq·Lk·Dv), dV = Pᵀ·dO (Lk·Lq·Dv), dQ = dS·K (Lq·Lk·D), dK = dSᵀ·Q (Lk·Lq·D); per query head."""
    sdpa_flops(q_shape, k_shape, v_shape)  # shape check
    *batch, hq, lq, d = q_shape
    lk, dv = k_shape[-2], v_shape[-1]
    return math.prod(batch) * hq * 2 * lq * lk * (3 * d + 2 * dv)


def _seq_lens(t: torch.Tensor) -> list[int]:
    """Sequence lengths, one per batch element, of a (B, L, E) / (L, E) / nested (B, *, E) tensor."""
    if t.is_nested:
        return [int(s[0]) for s in t._nested_tensor_size().tolist()]
    if t.dim() == 2:
        return [int(t.shape[0])]
    return [int(t.shape[1])] * int(t.shape[0])


def mha_flops(q_lens: Sequence[int], k_lens: Sequence[int], e_in: int, e: int, e_out_proj: int) -> int:
    """A full multi-head attention: q/k/v projections (E_in -> E each), QKᵀ and AV over E total
    head width (independent of the head count), and the out-projection (E -> E_out)."""
    total = 0
    for lq, lk in zip(q_lens, k_lens, strict=True):
        total += _mm(lq, e_in, e) + 2 * _mm(lk, e_in, e)   # in-projection
        total += _mm(lq, e, lk) + _mm(lq, lk, e)            # QKᵀ, AV (all heads together)
        total += _mm(lq, e, e_out_proj)                      # out-projection
    return total


def _mha_op(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
            *args, **kwargs) -> int:
    """aten._native_multi_head_attention: qkv_weight (3E, E_in), proj_weight (E_out, E)."""
    e = qkv_weight.shape[0] // 3
    return mha_flops(_seq_lens(query), _seq_lens(key), int(qkv_weight.shape[1]), int(e), int(proj_weight.shape[0]))


def _encoder_layer_op(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                      norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                      ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, *args, **kwargs) -> int:
    """aten._transformer_encoder_layer_fwd: self-attention as above + linear1 (F, E) + linear2 (E, F)."""
    lens = _seq_lens(src)
    attn = _mha_op(src, src, src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
    return attn + 2 * sum(lens) * (ffn_weight_1.numel() + ffn_weight_2.numel())


def _rnn_layer_op(input, weight0, weight1, *args, **kwargs) -> int:
    """aten.mkldnn_rnn_layer (one layer, one direction): every token does x·W_ihᵀ and h·W_hhᵀ."""
    tokens = input.numel() // input.shape[-1]
    return 2 * tokens * (weight0.numel() + weight1.numel())


def _rnn_layer_backward_op(input, weight1, weight2, *args, **kwargs) -> int:
    """aten.mkldnn_rnn_layer_backward: gradients w.r.t. the inputs (x, h) and the weights = 2x forward."""
    return 2 * _rnn_layer_op(input, weight1, weight2)


def _conv_fwd(x: Sequence[int], w: Sequence[int], y: Sequence[int], transposed: bool) -> int:
    """The stock forward convention: one MAC per (output position [input position if transposed],
    weight element) pair; w is (C_out, C_in/groups, *k), or (C_in, C_out/groups, *k) if transposed,
    so ``prod(w)`` already carries the 1/groups."""
    return 2 * x[0] * math.prod((x if transposed else y)[2:]) * math.prod(w)


def _conv_backward_op(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                      groups, output_mask, *args, **kwargs) -> int:
    """aten.convolution_backward, replacing the stock formula, which ignores ``groups`` in the
    weight gradient (a depthwise conv's grad_weight came out C times too large: efficientnet_b0's
    fwd+bwd counted 42x its forward). grad_input and grad_weight are each a contraction over the
    same (position, weight element) pairs as the forward, so each costs exactly the forward;
    grad_bias is a reduction (0). Equal to the stock count when groups == 1."""
    fwd = _conv_fwd(x, w, grad_out, transposed)
    return fwd * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _mm_op(a, b, *args, **kwargs) -> int:
    return _mm(a[0], a[1], b[1])


def _addmm_like_op(self_shape, a, b, *args, **kwargs) -> int:
    return _mm(a[0], a[1], b[1])


def _mv_op(a, x, *args, **kwargs) -> int:
    return _mm(a[0], a[1], 1)


def _addmv_op(self_shape, a, x, *args, **kwargs) -> int:
    return _mm(a[0], a[1], 1)


def _dot_op(x, y, *args, **kwargs) -> int:
    return 2 * x[0]


def _addbmm_op(self_shape, b1, b2, *args, **kwargs) -> int:
    return b1[0] * _mm(b1[1], b1[2], b2[2])


# --------------------------------------------------------------------------------------------
# Fused attention ops: every SDPA kernel's aten op, forward and backward, GQA-aware
# --------------------------------------------------------------------------------------------

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
    from torch._subclasses.fake_tensor import is_fake
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


def _fused_attention_op(packet: Any, *args: Any, **kwargs: Any) -> int:
    """The FLOP formula of a fused attention op (its default overload's schema names the arguments; q, k, v
    and the packed-batch offsets sit at the same places in every overload)."""
    call = fused_attention_call(packet.default, args, kwargs)
    if call is None:
        raise ValueError(f"{packet} is not a fused attention op")
    return 2 * call.dense_macs


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------

def _shape(x: Any) -> Any:
    return x.shape if isinstance(x, torch.Tensor) else x


_GAPS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("flop_gaps", default=None)


def _record_gap(op: str, why: str) -> None:
    """Record ``op`` as uncounted in the active :func:`count_flops`; raise when there is none."""
    gaps = _GAPS.get()
    if gaps is None:
        raise FlopFormulaError(f"{op}: {why}")
    gaps.setdefault(op, why)


def _registered(formula: Callable[..., int], ops: Sequence[Any], raw: bool) -> Callable[..., int]:
    """Adapt ``formula`` to FlopCounterMode's calling convention (tensors in, ``out_val=`` kw).

    ``raw`` formulas get the tensors, the others their shapes. A formula that raises is a gap of the
    active :func:`count_flops` (the op adds nothing and the count is marked incomplete), or, outside
    one, a :class:`FlopFormulaError` naming the op — never a silent 0.
    """
    names = ", ".join(str(op) for op in ops)

    @functools.wraps(formula)
    def counted(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        try:
            if not raw:
                args, kwargs = tree_map(_shape, (args, kwargs))
            return int(formula(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - the failure becomes a gap (or FlopFormulaError), not a crash
            _record_gap(names, f"formula failed: {e!r}")
            return 0

    counted._get_raw = True  # FlopCounterMode(custom_mapping=...) then passes the tensors as they are
    counted.formula = formula
    return counted


_TABLE: list[tuple[Sequence[Any], Callable[..., int], bool]] = [
    ([aten.convolution_backward], _conv_backward_op, False),
    ([aten._native_multi_head_attention], _mha_op, True),
    ([aten._transformer_encoder_layer_fwd], _encoder_layer_op, True),
    ([aten.mkldnn_rnn_layer], _rnn_layer_op, True),
    ([aten.mkldnn_rnn_layer_backward], _rnn_layer_backward_op, True),
    ([aten._int_mm], _mm_op, False),
    ([aten._addmm_activation], _addmm_like_op, False),
    ([aten.mv], _mv_op, False),
    ([aten.addmv], _addmv_op, False),
    ([aten.dot, aten.vdot], _dot_op, False),
    ([aten.addbmm], _addbmm_op, False),
]

EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {}
for _ops, _formula, _raw in _TABLE:
    _wrapped = _registered(_formula, _ops, _raw)
    for _op in _ops:
        EXTRA_FORMULAS[_op] = _wrapped
for _name in FUSED_ATTENTION:
    _op = getattr(aten, _name)
    EXTRA_FORMULAS[_op] = _registered(functools.partial(_fused_attention_op, _op), [_op], True)
del _ops, _formula, _raw, _wrapped, _op, _name


# --------------------------------------------------------------------------------------------
# einsum: a contraction torch lowers to an elementwise mul when the contracted length is 1
# --------------------------------------------------------------------------------------------

def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> int | None:
    """FLOPs of an einsum as torch computes it. One operand: a reduction or transpose, 0. Two operands:
    indices found in one operand only (and not in the output) are summed away first (a reduction, 0),
    then the rest is one batched matmul of 2·∏(sizes of the remaining indices) — if any index is
    contracted (in both operands, not in the output); with none it is elementwise or an outer product, 0.
    Three or more: 0 when no index is contracted, else ``None`` (the cost depends on the contraction
    order torch picks: not computable here, a gap for the caller). ``None`` too for a malformed equation."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes) or not shapes:
        return None
    if len(shapes) == 1:
        return 0
    if len(shapes) > 2:
        letters = [set(t.replace("...", "")) for t in terms]
        seen = [c for t in letters for c in t]
        out = set(rhs.replace("...", "")) if arrow else {c for c in seen if seen.count(c) == 1}
        shared = {c for c in seen if seen.count(c) > 1}
        return 0 if not shared - out else None
    n_ell = max((len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = [chr(0x100 + i) for i in range(n_ell)]          # one private letter per broadcast dimension
    sizes: dict[str, int] = {}
    subs = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            head, _, tail = term.partition("...")
            mine = ell[n_ell - (len(shape) - len(head) - len(tail)):]
            letters = [*head, *mine, *tail]
        else:
            letters = list(term)
        if len(letters) != len(shape):
            return None
        for letter, size in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
        subs.append(set(letters))
    if arrow:
        head, _, tail = rhs.partition("...")
        out = {*head, *(ell if "..." in rhs else ()), *tail}
    else:                                                 # implicit output: indices seen once, and ...
        seen = [c for term in terms for c in term.replace("...", "")]
        out = {c for c in seen if seen.count(c) == 1} | set(ell)
    a, b = subs
    if not (a & b) - out:
        return 0
    kept = out | (a & b)
    return 2 * math.prod(sizes[c] for c in kept)


@contextlib.contextmanager
def _einsum_counted(counter: FlopCounterMode) -> Iterator[None]:
    """While active, ``torch.einsum`` adds :func:`einsum_flops` to ``counter`` when its dispatched ops
    counted nothing (a contracted length of 1, lowered to a mul); an einsum that reached a matmul is left
    to the stock formulas; one whose cost :func:`einsum_flops` cannot give is a gap (see
    :func:`_record_gap`). A plain function swap, not a TorchFunctionMode: an active mode would make
    ``has_torch_function`` true and turn off the fused fast paths (nn.MultiheadAttention's) being counted."""
    original = torch.functional.einsum

    def einsum(*args: Any) -> torch.Tensor:
        before = counter.get_total_flops()
        out = original(*args)
        if counter.get_total_flops() == before and args and isinstance(args[0], str):
            operands = args[1:]
            if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
                operands = tuple(operands[0])
            if all(isinstance(t, torch.Tensor) for t in operands):
                flops = einsum_flops(args[0], [t.shape for t in operands])
                if flops is None:
                    _record_gap("aten.einsum", f"{args[0]!r} on {len(operands)} operands was lowered to "
                                               "elementwise ops; its contraction cannot be costed")
                elif flops:
                    for parent in set(counter.mod_tracker.parents):
                        counter.flop_counts[parent][aten.einsum] += flops
        return out

    torch.einsum = torch.functional.einsum = einsum
    try:
        yield
    finally:
        torch.einsum = torch.functional.einsum = original


# --------------------------------------------------------------------------------------------
# Gaps: work no formula counts
# --------------------------------------------------------------------------------------------

UNCOUNTED_CONTRACTIONS: frozenset[str] = frozenset({
    "_grouped_mm", "_scaled_grouped_mm", "_trilinear", "_cudnn_rnn", "_cudnn_rnn_backward", "miopen_rnn",
    "miopen_rnn_backward", "mkldnn_linear",
    "mkldnn_convolution", "_cslt_sparse_mm", "_sparse_mm", "_sparse_addmm", "sparse_sampled_addmm",
    "_weight_int8pack_mm", "_weight_int4pack_mm", "_sparse_semi_structured_linear", "_sparse_semi_structured_mm",
    "_sparse_semi_structured_addmm"})
"""aten ops (packet names) that do matmul work and that neither the stock counter nor
:data:`EXTRA_FORMULAS` has a formula for: a count that meets one records a gap."""

_NO_ARITHMETIC_NAMESPACES = frozenset({"aten", "prim", "prims", "profiler", "_c10d_functional", "c10d",
                                       "c10d_functional", "_dtensor"})


class _GapMode(TorchDispatchMode):
    """Beneath the FLOP counter: records as gaps the ops in :data:`UNCOUNTED_CONTRACTIONS` and ops outside
    aten (custom ops) that take a floating-point tensor, when no formula is registered for them."""

    def __init__(self, registry: dict[Any, Any]) -> None:
        super().__init__()
        self.registry = registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = getattr(func, "_overloadpacket", func)
        if func not in self.registry and packet not in self.registry:
            name = getattr(packet, "__name__", "")
            namespace = getattr(func, "namespace", "aten")
            if namespace == "aten" and name in UNCOUNTED_CONTRACTIONS:
                _record_gap(str(packet), "does matmul work; no FLOP formula")
            elif namespace not in _NO_ARITHMETIC_NAMESPACES and any(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in tree_leaves((args, kwargs))):
                _record_gap(str(packet), "custom op: no FLOP formula, its work is unknown")
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

class _CallMode(TorchDispatchMode):
    """Above the FLOP counter: each op it dispatches that added FLOPs, with what it added (the counter's own
    figure for that op, so the calls and the totals never disagree) and its output's shape."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter
        self.calls: list[CountedCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.counter.get_total_flops()
        out = func(*args, **(kwargs or {}))
        added = self.counter.get_total_flops() - before
        if added:
            first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
            shape = tuple(first.shape) if first is not None else ()
            self.calls.append(CountedCall(str(getattr(func, "_overloadpacket", func)), int(added), shape))
        return out


def _result(counter: FlopCounterMode, traffic: ByteCounterMode, gaps: dict[str, str],
            module_depth: int | None, calls: Sequence[CountedCall] = ()) -> FlopCount:
    counts = counter.get_flop_counts()
    flops = int(counter.get_total_flops())
    by_op = {str(op): int(v) for op, v in counts.get("Global", {}).items() if v}
    by_module = {name: int(sum(ops.values())) for name, ops in counts.items()
                 if name != "Global" and (module_depth is None or name.count(".") <= module_depth)}
    return FlopCount(flops=flops, macs=flops // 2, by_op=by_op, by_module=by_module,
                     bytes_moved=int(traffic.bytes_moved), bytes_by_op=dict(traffic.by_op), gaps=dict(gaps),
                     calls=tuple(calls))


def count_flops(fn: Callable[[], object], *, allow_gaps: bool = False, module_depth: int | None = 1,
                calls: bool = False) -> FlopCount:
    """Run ``fn()`` under FlopCounterMode with :data:`EXTRA_FORMULAS` and return the count.

    The same pass also counts ``bytes_moved`` (:class:`ByteCounterMode`, beneath the FLOP counter,
    so it sees the ops that actually run after any decomposition). Works with real and fake
    tensors alike. Work that cannot be counted (see the module docstring) raises
    :class:`UncountedFlopsError` naming the ops, after ``fn`` has run; with ``allow_gaps=True`` the
    count comes back with its ``gaps`` instead. ``by_module`` keeps module names to ``module_depth``
    dots (1: the root and its children; None: every module). ``calls=True`` also records each dispatched op that
    counted work, in order (:class:`CountedCall`; an einsum the counter costs at the Python API,
    :func:`_einsum_counted`, is in the totals but not among the calls).
    """
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
    traffic = ByteCounterMode()
    recorder = _CallMode(counter) if calls else contextlib.nullcontext()
    gaps: dict[str, str] = {}
    token = _GAPS.set(gaps)
    try:
        with traffic, _GapMode(counter.flop_registry), counter, _einsum_counted(counter), recorder:
            fn()
    finally:
        _GAPS.reset(token)
    if gaps and not allow_gaps:
        raise UncountedFlopsError(gaps)
    return _result(counter, traffic, gaps, module_depth, recorder.calls if calls else ())


def count_model(model: nn.Module, inputs: tuple | torch.Tensor, mode: Literal["fwd", "fwd_bwd"] = "fwd", *,
                allow_gaps: bool = False, module_depth: int | None = 1) -> FlopCount:
    """Count ``model(*inputs)``: ``"fwd"`` under ``torch.no_grad()``; ``"fwd_bwd"`` the forward with
    grad plus ``out.float().sum().backward()`` (``out``: the output, its ``logits``, or its first
    tensor). Train/eval is the caller's choice (eval + no_grad selects fused fast paths such as
    MultiheadAttention's; they count the same). Parameters' ``.grad`` are restored afterwards.
    ``allow_gaps`` and ``module_depth`` as in :func:`count_flops`.
    """
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    opts = {"allow_gaps": allow_gaps, "module_depth": module_depth}
    if mode == "fwd":
        def run() -> None:
            with torch.no_grad():
                model(*inputs)
        return count_flops(run, **opts)
    if mode == "fwd_bwd":
        params = list(model.parameters())
        saved = [p.grad for p in params]

        def run() -> None:
            with torch.enable_grad():
                first_tensor(model(*inputs)).float().sum().backward()
        try:
            return count_flops(run, **opts)
        finally:
            for p, g in zip(params, saved):
                p.grad = g
    raise ValueError(f"unknown mode {mode!r}; expected 'fwd' or 'fwd_bwd'")


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared ones once); works on meta and fake models."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# Dependency depth: the sequential steps of a run, measured
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TracedOp:
    """One dispatched op: its packet name, the bytes of its tensor outputs and its dependency depth."""

    name: str
    out_bytes: int
    depth: int
    out_shapes: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class DependencyTrace:
    """Every op of a run in dispatch order. ``depth``: the longest chain of dependent compute ops."""

    ops: tuple[TracedOp, ...]

    @property
    def depth(self) -> int:
        return max((op.depth for op in self.ops), default=0)


class _DepthMode(TorchDispatchMode):
    """Gives every tensor an op produces the depth 1 + the deepest of its tensor inputs (a view or a
    metadata op inherits its input's depth: it computes nothing); records each op."""

    def __init__(self) -> None:
        super().__init__()
        self.depths: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> depth, by identity
        self.ops: list[TracedOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = str(getattr(func, "_overloadpacket", func))
        computes = not getattr(func, "is_view", False) and name.split(".")[-1] not in _PASSIVE_OPS
        depth = max((self.depths.get(t, 0) for t in ins), default=0) + int(computes)
        for t in outs:
            self.depths[t] = max(depth, self.depths.get(t, 0))
        nbytes = sum(t.numel() * t.element_size() for t in outs) if computes else 0
        self.ops.append(TracedOp(name, nbytes, depth, tuple(tuple(t.shape) for t in outs)))
        return out


_PASSIVE_OPS = frozenset({"size", "sym_size", "stride", "sym_stride", "numel", "dim", "is_contiguous",
                          "empty", "empty_like", "empty_strided", "new_empty", "_unsafe_view", "detach",
                          "lift_fresh", "_local_scalar_dense", "zeros", "zeros_like"})


def dependency_trace(fn: Callable[[], object]) -> DependencyTrace:
    """The ops ``fn()`` dispatches (real or fake tensors), each with its output bytes and its depth in
    the run's data-dependency graph: ``trace.depth`` is the number of sequential compute steps a
    forward takes however many cores run it (a recurrence grows it with every token, a parallel
    layer does not). Tensors made before ``fn`` (weights, inputs) have depth 0."""
    mode = _DepthMode()
    with mode:
        fn()
    return DependencyTrace(tuple(mode.ops))
