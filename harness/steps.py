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


def make_step(model: nn.Module, inputs: tuple, mode: str) -> Callable[[], None]:
    """One timed unit: a no-grad forward, or forward + backward of sum(output)."""
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
    return step


def cast_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
