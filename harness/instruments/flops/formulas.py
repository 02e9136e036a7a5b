"""The analytic FLOP formulas: shape in, FLOPs out (2 per multiply-accumulate), no counting machinery.

Conventions (the stock ``torch.utils.flop_counter`` counter's, kept unchanged):

* Only matmul-like work is counted (convolutions, matmuls, attention). Elementwise ops, norms, softmax,
  activations, reductions and bias adds are 0. ``macs = flops // 2`` is what vision papers and
  torchvision's ``meta["_ops"]`` report (GMACs).
* Attention counts QKᵀ and AV over the *full* score matrix. A causal (``is_causal=True``) or
  masked attention is counted like an unmasked one, n² and not n(n+1)/2, as the stock kernels'
  formulas do (it is also what the eager ``softmax(QKᵀ)V`` reference computes). Under GQA/MQA
  the attention matmuls are counted with the *query* heads (each query head attends over its
  shared k/v head); k/v heads only enter the k/v projections.
* Attention backward uses the stock convention of 5 matmuls (recomputed scores, dV, dP, dQ,
  dK), i.e. 2.5x the forward attention matmuls when the head dims are equal.

The ``_*_op`` functions take an aten op's arguments (tensors, or their shapes: see
:mod:`harness.instruments.flops.registry`, which registers them); the public ones take shapes.
The fused attention kernels' formulas are in :mod:`harness.instruments.flops.attention`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["einsum_flops", "mha_flops", "sdpa_backward_flops", "sdpa_flops"]


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

