"""What one measured call is: the :class:`Step` protocol every workload mode implements, and its two simplest
members, a no-grad forward (:class:`Forward`) and forward + backward of a scalar loss (:class:`ForwardBackward`);
a training step (:class:`harness.engine.training.TrainStep`) and a generation
(:class:`harness.engine.generation.Generation`) are steps too (:data:`harness.engine.modes.STEPS` maps a
workload's mode to its class)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from harness.contract.spec import Workload
from harness.engine.compiled import mark_batch_dynamic
from harness.instruments import memory
from harness.instruments.outputs import first_tensor
from harness.instruments.timing import TimingResult


class Counted(Protocol):
    """What a MAC count answers (:class:`harness.instruments.flops.FlopCount`): complete or not, and its MACs."""

    complete: bool
    macs: int


Count = Callable[[Callable[[], object]], Counted]
"""Counts the MACs of one call of a callable on fake tensors (:func:`harness.instruments.flops.count_flops`)."""


class Step:
    """One measured call of a workload mode, and everything a run needs to know about it — the same small
    interface for every mode, so that the runner never asks which mode it holds:

    * :meth:`for_workload` (the eager step of a built model and its inputs) and :meth:`inputs_workload` (the
      workload whose inputs it takes);
    * ``__call__``: the callable that is timed;
    * :meth:`compile`: how it compiles (the same step calling its compiled form);
    * :meth:`counts` and :meth:`flop_figures`: what it counts beside MACs (on fake tensors), and
      :data:`forward_cost` (whether an architecture's analytic cost of one forward applies);
    * :meth:`figures`: what it derives from its timed calls (tokens/s, a training step's rates, ...);
    * :meth:`state_bytes` and :meth:`memory`: its memory by kind.
    """

    mode: ClassVar[str] = ""
    """The workload mode (:data:`harness.contract.spec.MODES`) this class steps."""
    forward_cost: ClassVar[bool] = True
    """Whether :attr:`harness.contract.spec.ArchSpec.cost` (one forward of ``seq_len`` tokens) describes a call."""

    @classmethod
    def inputs_workload(cls, w: Workload) -> Workload:
        """The workload whose inputs (``ArchSpec.make_inputs``) the step takes: ``w`` itself here."""
        return w

    @classmethod
    def for_workload(cls, model: nn.Module, inputs: tuple, w: Workload) -> Step:
        """The eager step of ``model`` on ``inputs`` (made for :meth:`inputs_workload`) for workload ``w``."""
        raise NotImplementedError

    def __call__(self) -> None:
        raise NotImplementedError

    def compile(self, w: Workload, wrap: Callable[[nn.Module], nn.Module]) -> Step:
        """The same step calling its compiled form (``w.compile`` is not "none"); ``wrap`` compiles the step's
        model (kept with it: one compile per model for all its batches, harness.engine.models.ModelCache)."""
        raise NotImplementedError

    def counts(self, w: Workload, count: Count | None) -> dict[str, float]:
        """Figures counted on fake tensors beside the step's own MACs (run inside the fake mode; ``count``: the
        MAC counter, None when the case counts no FLOPs): none here."""
        return {}

    @classmethod
    def flop_figures(cls, w: Workload, counted: Mapping[str, float],
                     flops_of: Callable[[Workload], float]) -> dict[str, float]:
        """FLOP figures derived from the step's counted ``flops`` and ``params`` (``flops_of(w2)``: the counted
        FLOPs of another workload's step, on fake tensors): none here."""
        return {}

    def state_bytes(self) -> int:
        """Bytes the step keeps alive besides the model's and the inputs' (a generation's state): 0 here."""
        return 0

    def figures(self, timed: TimingResult, w: Workload, metrics: Mapping[str, float]) -> tuple[dict[str, float], str]:
        """The figures of the timed calls beyond the timing's own (``metrics``: those recorded so far), and a note
        saying why one is missing ("" when none is): none here."""
        return {}, ""

    def memory(self, static_before: int, device: torch.device) -> dict[str, float]:
        """The memory pass (separate from timing): allocator peaks on CUDA, the tensor peak and RSS on the CPU;
        ``activation_peak_bytes`` (the peak above the ``static_before`` bytes alive before the step) and
        ``peak_bytes`` on both."""
        if device.type == "cuda":
            out = {k: float(v) for k, v in memory.measure_peak_cuda(self, device).items()}
            out["peak_bytes"] = out["cuda_max_allocated_bytes"]
            # the same metric on every device: the step's peak above what was alive before it (params, inputs, ...)
            out["activation_peak_bytes"] = float(memory.activation_peak_cuda(out))
            return out
        peak = memory.measure_peak_cpu(self)
        out = {"activation_peak_bytes": float(peak["tensor_peak_bytes"]),
               "peak_bytes": float(static_before + self.state_bytes() + peak["tensor_peak_bytes"])}
        if peak.get("rss_hwm_bytes") is not None:
            out["rss_hwm_bytes"] = float(peak["rss_hwm_bytes"])
            out["rss_delta_bytes"] = float(peak["rss_hwm_bytes"] - peak["rss_before_bytes"])
        return out


class Forward(Step):
    """A no-grad forward of ``model`` (put in eval mode) on ``inputs``. ``compiled``: the model is a compiled wrapper
    (harness.engine.compiled), and each call first marks a new iteration for CUDA graph trees
    (``torch.compiler.cudagraph_mark_step_begin``: a replay may reuse the memory of the previous call's outputs,
    which the step drops; without CUDA graphs the mark is a counter increment)."""

    mode = "fwd"

    def __init__(self, model: nn.Module, inputs: tuple, compiled: bool = False) -> None:
        self.model, self.inputs, self.compiled = model, inputs, compiled
        model.eval()

    @classmethod
    def for_workload(cls, model: nn.Module, inputs: tuple, w: Workload) -> Forward:
        return cls(model, inputs)

    def __call__(self) -> None:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            self.model(*self.inputs)

    def compile(self, w: Workload, wrap: Callable[[nn.Module], nn.Module]) -> Forward:
        """The step calling ``wrap(model)``; the inputs' batch dimension marked dynamic first, so that one compiled
        graph serves every batch > 1 (:func:`harness.engine.compiled.mark_batch_dynamic`)."""
        mark_batch_dynamic(self.inputs, w.batch_size)
        return type(self)(wrap(self.model), self.inputs, compiled=True)


class ForwardBackward(Forward):
    """Forward + backward of sum(output) (its ``logits`` or first tensor, :func:`first_tensor`), ``model`` in train
    mode, gradients set to None first."""

    mode = "fwd_bwd"

    def __init__(self, model: nn.Module, inputs: tuple, compiled: bool = False) -> None:
        super().__init__(model, inputs, compiled)
        model.train()

    def __call__(self) -> None:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        self.model.zero_grad(set_to_none=True)
        first_tensor(self.model(*self.inputs)).float().sum().backward()


def make_step(model: nn.Module, inputs: tuple, mode: str, compile: str = "none") -> Forward:
    """One timed unit of mode "fwd" (:class:`Forward`) or "fwd_bwd" (:class:`ForwardBackward`) of ``model`` as it is
    (``compile``: the workload's; not "none" when ``model`` is a compiled wrapper). A run builds every mode's step
    from its class (:func:`harness.engine.modes.step_for`)."""
    if mode not in ("fwd", "fwd_bwd"):
        raise ValueError(f"make_step runs 'fwd' or 'fwd_bwd', not {mode!r} (train_step: harness.engine.training)")
    return (Forward if mode == "fwd" else ForwardBackward)(model, inputs, compile != "none")


def cast_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
