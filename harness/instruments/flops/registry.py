"""The formulas the FLOP counter adds to the stock ``FlopCounterMode`` (:data:`EXTRA_FORMULAS`), and the
book of the work no formula counts (gaps).

What the stock counter (torch 2.14) misses and :data:`EXTRA_FORMULAS` adds:

* Every fused attention op, forward and backward (:data:`harness.instruments.flops.attention.FUSED_ATTENTION`):
  the SDPA kernels ``aten._scaled_dot_product_{flash_attention_for_cpu, flash_attention, efficient_attention,
  cudnn_attention, fused_attention_overrideable}`` (+ ``_backward``), the raw kernels they call
  (``_flash_attention_*``, ``_efficient_attention_*``, ``_cudnn_attention_*``, (B, L, H, D) or packed
  variable-length layouts) and MPS's ``_scaled_dot_product_attention_math_for_mps``. The CPU one the
  stock counter counts 0; the CUDA ones it counts, but torch 2.11's formulas assert Hq == Hkv
  ("query/key/value shapes are incompatible": every bf16 GQA case on the H100 failed in the fake
  pass). k/v keep their Hkv heads under ``enable_gqa=True``; these formulas handle Hq != Hkv and
  count the dense score matrix with the query heads. Ops missing from a torch build are
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

A formula that cannot read its arguments (e.g. a nested tensor on fake storage) is a gap of the active count
(:func:`collect_gaps`); outside one (a bare ``FlopCounterMode`` with :data:`EXTRA_FORMULAS`) it raises
:class:`FlopFormulaError` naming the op. :data:`UNCOUNTED_CONTRACTIONS` lists the ops that do matmul work and
have no formula.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from harness.instruments.flops.attention import FUSED_ATTENTION, fused_attention_flops
from harness.instruments.flops.formulas import (
    _addbmm_op,
    _addmm_like_op,
    _addmv_op,
    _conv_backward_op,
    _dot_op,
    _encoder_layer_op,
    _mha_op,
    _mm_op,
    _mv_op,
    _rnn_layer_backward_op,
    _rnn_layer_op,
)

__all__ = ["EXTRA_FORMULAS", "UNCOUNTED_CONTRACTIONS", "FlopFormulaError", "collect_gaps", "record_gap"]

aten = torch.ops.aten


class FlopFormulaError(RuntimeError):
    """A registered formula could not evaluate its arguments (raised outside a count, which records it as a
    gap instead: :func:`collect_gaps`)."""


def _shape(x: Any) -> Any:
    return x.shape if isinstance(x, torch.Tensor) else x


_GAPS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("flop_gaps", default=None)


def record_gap(op: str, why: str) -> None:
    """Record ``op`` as uncounted in the active count (:func:`collect_gaps`); raise
    :class:`FlopFormulaError` when there is none."""
    gaps = _GAPS.get()
    if gaps is None:
        raise FlopFormulaError(f"{op}: {why}")
    gaps.setdefault(op, why)


@contextlib.contextmanager
def collect_gaps() -> Iterator[dict[str, str]]:
    """While active, :func:`record_gap` records into the dict it yields (op → why) instead of raising."""
    gaps: dict[str, str] = {}
    token = _GAPS.set(gaps)
    try:
        yield gaps
    finally:
        _GAPS.reset(token)


def _registered(formula: Callable[..., int], ops: Sequence[Any], raw: bool) -> Callable[..., int]:
    """Adapt ``formula`` to FlopCounterMode's calling convention (tensors in, ``out_val=`` kw).

    ``raw`` formulas get the tensors, the others their shapes. A formula that raises is a gap of the
    active count (:func:`collect_gaps`: the op adds nothing and the count is marked incomplete), or, outside
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
            record_gap(names, f"formula failed: {e!r}")
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
    EXTRA_FORMULAS[_op] = _registered(functools.partial(fused_attention_flops, _op), [_op], True)
del _ops, _formula, _raw, _wrapped, _op, _name


UNCOUNTED_CONTRACTIONS: frozenset[str] = frozenset({
    "_grouped_mm", "_scaled_grouped_mm", "_trilinear", "_cudnn_rnn", "_cudnn_rnn_backward", "miopen_rnn",
    "miopen_rnn_backward", "mkldnn_linear",
    "mkldnn_convolution", "_cslt_sparse_mm", "_sparse_mm", "_sparse_addmm", "sparse_sampled_addmm",
    "_weight_int8pack_mm", "_weight_int4pack_mm", "_sparse_semi_structured_linear", "_sparse_semi_structured_mm",
    "_sparse_semi_structured_addmm"})
"""aten ops (packet names) that do matmul work and that neither the stock counter nor
:data:`EXTRA_FORMULAS` has a formula for: a count that meets one records a gap."""
