"""The MAC counter: one counting pass (``FlopCounterMode`` with :data:`EXTRA_FORMULAS`, the einsum fix, the gap
book and the byte counter) over a callable or a model.

Counting is shape-only, so it runs on fake tensors (:mod:`harness.instruments.fake`) at no cost: build the
model with ``build_fake`` and make the inputs inside the same mode, then call
:func:`count_model` (inside or outside ``with mode``: both count the same). Real and fake
tensors give identical counts (``by_module`` included).

``torch.einsum`` whose contracted indices all have length 1: torch lowers it to an elementwise
``mul`` (no matmul reaches the dispatcher), so the stock counter sees 0 although the same
einsum at length ≥ 2 is a counted ``bmm``. :func:`_einsum_counted` wraps ``torch.einsum`` at
the Python API and, when the ops it dispatched counted nothing, adds :func:`einsum_flops` under
``aten.einsum`` (forward only: its backward is elementwise too and stays uncounted).

**A count that cannot be computed is a gap, never 0.** Elementwise ops count 0 by convention
(:mod:`harness.instruments.flops.formulas`); work the counter *cannot* count is recorded in
:attr:`FlopCount.gaps` (op → why), and :func:`count_flops` / :func:`count_model` raise
:class:`UncountedFlopsError` naming those ops unless called with ``allow_gaps=True`` (then the totals are a
lower bound, and ``complete`` is False). Three kinds of gap:

* a formula that cannot read its arguments (e.g. a nested tensor on fake storage);
* an op that does matmul work but has no formula (:data:`UNCOUNTED_CONTRACTIONS`: ``_grouped_mm``,
  ``_trilinear``, cuDNN's ``_cudnn_rnn``, ...), or an op outside aten (a custom op: its work is
  unknown) that takes a floating-point tensor;
* an einsum lowered to elementwise ops whose contraction :func:`einsum_flops` cannot cost (three or
  more operands with a contracted index).

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
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from harness.instruments.flops.formulas import einsum_flops
from harness.instruments.flops.registry import EXTRA_FORMULAS, UNCOUNTED_CONTRACTIONS, collect_gaps, record_gap
from harness.instruments.outputs import first_tensor
from harness.instruments.traffic import ByteCounterMode

__all__ = ["CountedCall", "FlopCount", "UncountedFlopsError", "count_flops", "count_model", "count_params"]

aten = torch.ops.aten


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
# einsum: a contraction torch lowers to an elementwise mul when the contracted length is 1
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _einsum_counted(counter: FlopCounterMode) -> Iterator[None]:
    """While active, ``torch.einsum`` adds :func:`einsum_flops` to ``counter`` when its dispatched ops
    counted nothing (a contracted length of 1, lowered to a mul); an einsum that reached a matmul is left
    to the stock formulas; one whose cost :func:`einsum_flops` cannot give is a gap (see
    :func:`harness.instruments.flops.registry.record_gap`). A plain function swap, not a TorchFunctionMode: an active mode would make
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
                    record_gap("aten.einsum", f"{args[0]!r} on {len(operands)} operands was lowered to "
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
                record_gap(str(packet), "does matmul work; no FLOP formula")
            elif namespace not in _NO_ARITHMETIC_NAMESPACES and any(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in tree_leaves((args, kwargs))):
                record_gap(str(packet), "custom op: no FLOP formula, its work is unknown")
        return func(*args, **kwargs)



# --------------------------------------------------------------------------------------------
# The count
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
    with collect_gaps() as gaps, traffic, _GapMode(counter.flop_registry), counter, _einsum_counted(counter), \
            recorder:
        fn()
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
