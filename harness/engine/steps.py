"""What one measured call is: a no-grad forward, or forward + backward of a scalar loss."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def first_tensor(out: Any) -> torch.Tensor:
    """The tensor to backpropagate from: the output itself, ``logits`` if any, else the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    items = out.values() if isinstance(out, Mapping) else out if isinstance(out, (list, tuple)) else ()
    for item in items:
        try:
            return first_tensor(item)
        except TypeError:
            continue
    raise TypeError(f"no tensor in model output of type {type(out).__name__}")


def make_step(model: nn.Module, inputs: tuple, mode: str, compile: str = "none") -> Callable[[], None]:
    """One timed unit: a no-grad forward, or forward + backward of sum(output).

    ``compile`` is the workload's (harness.engine.compiled). A compiled ``model``'s step first marks a new iteration
    for CUDA graph trees (``torch.compiler.cudagraph_mark_step_begin``: a replay may reuse the memory of the
    previous call's outputs, which the step drops; without CUDA graphs the mark is a counter increment). An
    eager step is exactly what it was. Mode "train_step" is :func:`harness.engine.training.make_train_step`'s."""
    if mode not in ("fwd", "fwd_bwd"):
        raise ValueError(f"make_step runs 'fwd' or 'fwd_bwd', not {mode!r} (train_step: harness.engine.training)")
    if mode == "fwd":
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(*inputs)
    else:
        model.train()

        def step() -> None:
            model.zero_grad(set_to_none=True)
            first_tensor(model(*inputs)).float().sum().backward()
    if compile == "none":
        return step
    inner = step

    def compiled_step() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        inner()
    return compiled_step


def cast_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
