"""The optimiser pieces the experiments share: a warm-up + cosine learning-rate schedule and AdamW's
usual split (weight decay on matrices only)."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def adamw(model: nn.Module, lr: float, weight_decay: float, **kw: Any) -> torch.optim.AdamW:
    """AdamW with ``weight_decay`` on parameters of ≥ 2 dims (weights) and none on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, **kw)
