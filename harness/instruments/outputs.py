"""What a model returned, as the tensor the instruments and the steps backpropagate from."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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
