"""Bytes moved: operator-level memory traffic, the roofline model's denominator.

:class:`ByteCounterMode` (a dispatch mode) adds, for every aten op, the bytes of its distinct tensor
inputs read and outputs written, once each, with no cache reuse between ops; views, metadata queries and
allocations move 0 bytes, and ops that overwrite ``self`` without reading it (``copy_``, ``fill_``…) do
not count the read. :func:`harness.instruments.flops.count_flops` runs it beneath the FLOP counter in the same pass.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["ByteCounterMode", "count_bytes", "op_bytes", "tensor_traffic_bytes"]


_METADATA_OPS = {  # read shapes/strides or allocate without touching memory: 0 bytes
    "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel", "sym_numel",
    "dim", "is_contiguous", "sym_is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
    "is_same_size", "_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "empty_permuted", "resize_", "resize_as_", "set_", "_resize_output_", "_nested_tensor_size",
    "_nested_tensor_strides", "_nested_tensor_storage_offsets", "record_stream", "_has_compatible_shallow_copy_type",
}
_WRITE_ONLY_SELF = {  # in-place ops that overwrite ``self`` without reading it
    "copy_", "fill_", "zero_", "uniform_", "normal_", "random_", "exponential_", "bernoulli_", "geometric_",
    "log_normal_", "cauchy_", "_copy_from", "_copy_from_and_resize",
}


def tensor_traffic_bytes(t: torch.Tensor) -> int:
    """Bytes an op reads or writes for ``t``: the elements it addresses × element size.

    A dimension of stride 0 (a broadcast made by ``expand``) is one element wide in memory, so
    it counts once. Tensors without strides (nested, sparse) count ``numel × element size``;
    anything unreadable counts 0.
    """
    try:
        if t.layout == torch.strided and not t.is_nested:
            n = 1
            for size, stride in zip(t.shape, t.stride()):
                n *= 1 if (stride == 0 and size > 0) else int(size)
            return int(n) * t.element_size()
        return int(t.numel()) * t.element_size()
    except Exception:  # noqa: BLE001 - a traffic count must not crash a benchmark
        return 0


def _distinct_tensors(tree: Any) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            seen.setdefault(id(leaf), leaf)
    return list(seen.values())


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes one dispatched aten op moves: its distinct tensor inputs read + its tensor outputs written.

    0 for views (every op whose schema returns an alias of an input: ``view``, ``transpose``,
    ``expand``, ``slice``, ``detach``, ...) and metadata/allocation ops (``size``, ``empty``,
    ``_unsafe_view``, ...). ``out=`` tensors and the ``self`` of write-only in-place ops
    (``copy_``, ``fill_``, ``zero_``, ...) are counted as written, not read.
    """
    if getattr(func, "is_view", False) or getattr(func, "namespace", "aten") == "prim":
        return 0
    name = getattr(getattr(func, "_overloadpacket", None), "__name__", "") or ""
    if name in _METADATA_OPS:
        return 0
    read_args: Any = args[1:] if (name in _WRITE_ONLY_SELF and args) else args
    read_kwargs = {k: v for k, v in (kwargs or {}).items() if k != "out"}
    reads = _distinct_tensors((read_args, read_kwargs))
    writes = _distinct_tensors(out)
    return sum(tensor_traffic_bytes(t) for t in reads) + sum(tensor_traffic_bytes(t) for t in writes)


class ByteCounterMode(TorchDispatchMode):
    """Sums :func:`op_bytes` over every aten op dispatched while active (real or fake tensors).

    ``bytes_moved``: the total; ``by_op``: per op packet name (``"aten.mm"``). This is the traffic
    if each op reads its operands and writes its results once from memory, with no cache reuse
    across ops: the standard roofline "operational intensity" model (see the module docstring).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes_moved = 0
        self.by_op: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            n = op_bytes(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - a traffic count must not crash a benchmark
            n = 0
        if n:
            self.bytes_moved += n
            self.by_op[str(func._overloadpacket)] += n
        return out


def count_bytes(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """``(bytes_moved, by_op)`` of ``fn()`` under :class:`ByteCounterMode` alone (no FLOP counting)."""
    mode = ByteCounterMode()
    with mode:
        fn()
    return mode.bytes_moved, dict(mode.by_op)
