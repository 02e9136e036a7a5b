"""One model's MACs per module from three counters side by side: ours, torch's stock one and fvcore's.

* **ours**: :func:`harness.instruments.flops.count_flops` itself (``FlopCounterMode`` +
  :data:`harness.instruments.flops.EXTRA_FORMULAS` + the einsum fix; work it cannot count raises, never a 0),
  per module at every depth (``module_depth=None``).
* **torch**: ``torch.utils.flop_counter.FlopCounterMode`` with its default registry, nothing added.
* **fvcore**: ``fvcore.nn.FlopCountAnalysis`` (a ``torch.jit`` trace; forward only). Its docs say it
  counts "one fused multiply-add as one flop", so its matmul-class ops (conv, linear, (add)mm, bmm,
  matmul, einsum: :data:`FVCORE_MAC_OPS`) are MACs already. Its other handles count elementwise work
  (``batch_norm``, ``layer_norm``, ``adaptive_avg_pool2d``, ``upsample_*``...) that the other two
  count 0; those are left out of its MACs and kept apart in :attr:`FlopTable.fvcore_elementwise`.

Everything is in MACs: torch's counters give FLOPs = 2·MACs and are halved here. A figure is
``None`` where a counter has none for a module (a module never called, e.g. ``out_proj`` under
``nn.MultiheadAttention``'s fused fast path; fvcore in ``fwd_bwd`` mode; fvcore's trace failing),
never a 0 standing in for "unknown". A module that is not called itself but whose children are
(a ``ModuleList``) gets the sum of its children, as fvcore does.

The model runs for real (``torch.jit`` cannot trace fake tensors): once per counter, in eval +
``no_grad`` for ``fwd`` and train + ``sum(out).backward()`` for ``fwd_bwd``
(:func:`harness.engine.steps.make_step`, the step a run times). fvcore always traces eval + ``no_grad``.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from harness.instruments.flops import EXTRA_FORMULAS, count_flops
from harness.contract.spec import MODES, ArchSpec, Workload
from harness.engine.models import real_case
from harness.engine.steps import make_step

with warnings.catch_warnings():   # fvcore.nn's import jit-scripts a loss: a FutureWarning on every bench start
    warnings.simplefilter("ignore")
    from fvcore.nn import FlopCountAnalysis

OUR_REGISTRY = {**flop_registry, **EXTRA_FORMULAS}
"""The ops the project's counter has a formula for (torch's stock ones and :data:`EXTRA_FORMULAS`)."""

__all__ = ["FVCORE_MAC_OPS", "FlopRow", "FlopTable", "UnsupportedOp", "build_real", "flop_table", "relative_spread"]

FVCORE_MAC_OPS: frozenset[str] = frozenset({"conv", "linear", "addmm", "bmm", "matmul", "mm", "einsum"})
"""fvcore's op names (as in ``by_operator()``) whose counts are multiply-accumulates."""


def relative_spread(values: tuple[int | None, ...]) -> float:
    """``(max - min) / max`` of the figures that exist (0 with fewer than two, or all 0)."""
    have = [v for v in values if v is not None]
    if len(have) < 2 or max(have) == 0:
        return 0.0
    return (max(have) - min(have)) / max(have)


@dataclass(frozen=True)
class FlopRow:
    """One module: its path in the model (``""``: the model itself), class, and MACs per counter."""

    path: str
    kind: str
    ours: int | None
    torch: int | None
    fvcore: int | None

    @property
    def depth(self) -> int:
        """0 for the model, 1 for its children, ..."""
        return 0 if not self.path else self.path.count(".") + 1

    def differs(self, tolerance: float = 0.01) -> bool:
        """Whether two of the counters' figures differ by more than ``tolerance`` (relative)."""
        return relative_spread((self.ours, self.torch, self.fvcore)) > tolerance


@dataclass(frozen=True)
class UnsupportedOp:
    """An op fvcore has no handle for (it counts it 0), its calls, and whether ours has a formula for it."""

    name: str          # fvcore's spelling, e.g. "aten::_native_multi_head_attention"
    calls: int
    ours_formula: bool


@dataclass(frozen=True)
class FlopTable:
    """The three counters' MACs: totals, per-module rows (tree order), and what fvcore left out."""

    model: str
    mode: str
    ours: int
    torch: int
    fvcore: int | None
    rows: tuple[FlopRow, ...]
    fvcore_elementwise: tuple[tuple[str, int], ...] = ()   # fvcore's non-MAC counts, left out: (op, count)
    fvcore_unsupported: tuple[UnsupportedOp, ...] = ()
    fvcore_note: str | None = None                         # why fvcore has no figure ("not run", ...)

    def differing(self, tolerance: float = 0.01) -> tuple[FlopRow, ...]:
        """The rows whose counters differ by more than ``tolerance``."""
        return tuple(r for r in self.rows if r.differs(tolerance))

    def as_dict(self) -> dict[str, Any]:
        """The table as plain JSON types (MACs; rows with their depth)."""
        return {"model": self.model, "mode": self.mode, "unit": "MACs",
                "totals": {"ours": self.ours, "torch": self.torch, "fvcore": self.fvcore},
                "rows": [{"path": r.path, "kind": r.kind, "depth": r.depth, "ours": r.ours, "torch": r.torch,
                          "fvcore": r.fvcore} for r in self.rows],
                "fvcore_elementwise_left_out": dict(self.fvcore_elementwise),
                "fvcore_unsupported": [{"op": u.name, "calls": u.calls, "ours_formula": u.ours_formula}
                                       for u in self.fvcore_unsupported],
                "fvcore_note": self.fvcore_note}

    def row(self, path: str) -> FlopRow:
        """The row of the module at ``path`` (KeyError if it is not in the table)."""
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(path)


def build_real(spec: ArchSpec, workload: Workload) -> tuple[nn.Module, tuple]:
    """``spec``'s model and inputs for ``workload``, real tensors on the CPU: the one build
    (:func:`harness.engine.models.materialize`, checkpointing and dtype included) as a run makes it."""
    return real_case(spec, workload, torch.device("cpu"))


def _by_path(flops_by_module: dict[str, int], root: str) -> dict[str, int]:
    """MACs per module path (the root's class-name prefix dropped) from FLOPs per module-tracker name."""
    out: dict[str, int] = {}
    for name, flops in flops_by_module.items():
        if name == "Global":
            continue
        path = "" if name == root else name.removeprefix(root + ".")
        out[path] = int(flops) // 2
    return out


@contextlib.contextmanager
def _calls_recorded(called: set[int]) -> Iterator[None]:
    """Add the id of every module whose forward runs meanwhile to ``called``."""
    hook = register_module_forward_pre_hook(lambda mod, args: called.add(id(mod)))
    try:
        yield
    finally:
        hook.remove()


def _run_stock(step: Callable[[], None]) -> FlopCounterMode:
    """Run ``step`` under torch's FlopCounterMode with its stock registry, nothing added (the outside check)."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter


def _fvcore(model: nn.Module, inputs: tuple) -> tuple[FlopCountAnalysis | None, str | None]:
    """fvcore's analysis, traced (eval, no_grad) with its warnings silenced; or None and why not."""
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = (FlopCountAnalysis(model, inputs).unsupported_ops_warnings(False)
                        .uncalled_modules_warnings(False).tracer_warnings("none"))
            analysis.by_module_and_operator()   # the trace runs here
    except Exception as exc:  # noqa: BLE001 - fvcore's failure to trace is reported, not raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"could not trace the model ({type(exc).__name__}: {first[:200]})"
    return analysis, None


def _aten_packet(name: str) -> Any:
    """The aten op packet of a jit op name (``"aten::addmm"``), or None for any other namespace."""
    ns, sep, op = name.partition("::")
    return getattr(torch.ops.aten, op, None) if sep and ns == "aten" else None


def _filled(paths: list[str], called: set[str], counts: dict[str, int]) -> dict[str, int | None]:
    """Per path: the counter's figure if the module was called (0 if it counted nothing), the sum of
    its children's figures if it was not but some child was, else None."""
    out: dict[str, int | None] = {}
    for path in reversed(paths):                      # children come after their parent
        if path in called:
            out[path] = counts.get(path, 0)
            continue
        prefix = f"{path}." if path else ""
        kids = [out[p] for p in paths if p.startswith(prefix) and p != path
                and "." not in p[len(prefix):] and out.get(p) is not None]
        out[path] = sum(kids) if kids else counts.get(path)
    return out


def flop_table(model: nn.Module, inputs: tuple | torch.Tensor, depth: int | None = None, mode: str = "fwd",
               fvcore: bool = True) -> FlopTable:
    """The MACs of ``model(*inputs)`` per module (down to ``depth``; None: all) by ours, torch, fvcore.

    ``mode``: ``"fwd"`` (eval, no_grad) or ``"fwd_bwd"`` (train, forward + backward of the output's
    sum); fvcore counts forward only and has no figure in ``fwd_bwd``. ``fvcore=False`` skips it.
    The model's train/eval flag and its parameters' ``.grad`` are restored afterwards.
    """
    if mode not in MODES or mode == "train_step":   # a training step's count: the runner's (harness.engine.training)
        raise ValueError(f"unknown mode {mode!r}; expected 'fwd' or 'fwd_bwd'")
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    was_training = model.training
    params = list(model.parameters())
    saved = [p.grad for p in params]
    called_ids: set[int] = set()
    try:
        with _calls_recorded(called_ids):
            ours = count_flops(make_step(model, inputs, mode), module_depth=None)     # the project's counter
        stock = _run_stock(make_step(model, inputs, mode))
        analysis, note = _fvcore(model, inputs) if fvcore and mode == "fwd" else (None, None)
    finally:
        model.train(was_training)
        for p, g in zip(params, saved):
            p.grad = g
    if not fvcore:
        note = "not run"
    elif mode != "fwd":
        note = "counts the forward only: no figure for fwd_bwd"

    modules = list(model.named_modules())
    paths = [p for p, _ in modules]
    kinds = {p: type(m).__name__ for p, m in modules}
    called = {p for p, m in modules if id(m) in called_ids}
    root = type(model).__name__
    ours_raw = _by_path(ours.by_module, root)
    torch_raw = _by_path({name: sum(ops.values()) for name, ops in stock.get_flop_counts().items()}, root)
    extra = [p for p in {**ours_raw, **torch_raw} if p not in kinds]   # names the module tracker made up
    ours_by = {**ours_raw, **_filled(paths, called, ours_raw)}
    torch_by = {**torch_raw, **_filled(paths, called, torch_raw)}
    fv_by: dict[str, int | None] = {}
    elementwise: dict[str, int] = {}
    unsupported: tuple[UnsupportedOp, ...] = ()
    fv_total: int | None = None
    if analysis is not None:
        uncalled = analysis.uncalled_modules()
        per_op = analysis.by_module_and_operator()
        fv_by = {p: (None if p in uncalled else int(sum(v for op, v in ops.items() if op in FVCORE_MAC_OPS)))
                 for p, ops in per_op.items()}
        fv_total = fv_by.get("")
        elementwise = {op: int(v) for op, v in per_op.get("", {}).items() if op not in FVCORE_MAC_OPS and v}
        unsupported = tuple(sorted(
            (UnsupportedOp(name, int(n), _aten_packet(name) in OUR_REGISTRY)
             for name, n in analysis.unsupported_ops().items()),
            key=lambda u: (not u.ours_formula, -u.calls, u.name)))

    rows = tuple(FlopRow(p, kinds.get(p, "?"), ours_by.get(p), torch_by.get(p), fv_by.get(p))
                 for p in [*paths, *extra] if depth is None or (0 if not p else p.count(".") + 1) <= depth)
    return FlopTable(model=root, mode=mode, ours=ours.macs, torch=stock.get_total_flops() // 2,
                     fvcore=fv_total, rows=rows, fvcore_elementwise=tuple(sorted(elementwise.items())),
                     fvcore_unsupported=unsupported, fvcore_note=note)

