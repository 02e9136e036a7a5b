"""The dependency trace: which ops a run dispatches and how deep each sits in its data-dependency graph.

:func:`dependency_trace` records every dispatched op of a run with its output bytes and its depth in
the run's data-dependency graph (the longest chain of compute ops leading to it): the sequential
steps of a forward, measured.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["DependencyTrace", "TracedOp", "dependency_trace"]


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
