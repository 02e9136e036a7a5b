"""What one measured call is (:class:`Step`): a no-grad forward, or forward + backward of a scalar loss, here; a
training step (:class:`harness.engine.training.TrainStep`) and a generation
(:class:`harness.engine.generation.Generation`) are steps too."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from harness.contract.spec import Workload
from harness.instruments import memory
from harness.instruments.outputs import first_tensor
from harness.instruments.timing import TimingResult


class Step:
    """One measured call, the callable a run times, and what a run records of it beside its time — the same small
    interface for every mode, so that the runner never asks which mode it holds."""

    def __call__(self) -> None:
        raise NotImplementedError

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

    def __init__(self, model: nn.Module, inputs: tuple, compiled: bool = False) -> None:
        self.model, self.inputs, self.compiled = model, inputs, compiled
        model.eval()

    def __call__(self) -> None:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            self.model(*self.inputs)


class ForwardBackward(Forward):
    """Forward + backward of sum(output) (its ``logits`` or first tensor, :func:`first_tensor`), ``model`` in train
    mode, gradients set to None first."""

    def __init__(self, model: nn.Module, inputs: tuple, compiled: bool = False) -> None:
        super().__init__(model, inputs, compiled)
        model.train()

    def __call__(self) -> None:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        self.model.zero_grad(set_to_none=True)
        first_tensor(self.model(*self.inputs)).float().sum().backward()


def make_step(model: nn.Module, inputs: tuple, mode: str, compile: str = "none") -> Forward:
    """One timed unit of mode "fwd" (:class:`Forward`) or "fwd_bwd" (:class:`ForwardBackward`); ``compile`` is the
    workload's (harness.engine.compiled). Mode "train_step" is :func:`harness.engine.training.make_train_step`'s."""
    if mode not in ("fwd", "fwd_bwd"):
        raise ValueError(f"make_step runs 'fwd' or 'fwd_bwd', not {mode!r} (train_step: harness.engine.training)")
    return (Forward if mode == "fwd" else ForwardBackward)(model, inputs, compile != "none")


def cast_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
