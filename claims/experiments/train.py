"""How every experiment trains: one warm-up + cosine learning-rate schedule, one optimiser setup (AdamW
with weight decay on matrices only) and one training loop. The caller owns torch's thread count."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

CPU = torch.device("cpu")       # where the experiments build their models (harness.engine.models.materialize)


def lr_at(step: int, steps: int, lr: float, warmup: int, floor: float = 0.0) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``floor · lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999)
          ) -> torch.optim.AdamW:
    """AdamW with ``weight_decay`` on parameters of ≥ 2 dims (weights) and none on biases and norms
    (``weight_decay=0`` is plain Adam)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=betas)


def fit(model: nn.Module, opt: torch.optim.Optimizer, steps: int, lr: Callable[[int], float],
        loss_at: Callable[[int], Tensor], *, clip: float | None = None, stop_nonfinite: bool = False,
        after_step: Callable[[int], None] | None = None) -> list[float]:
    """``steps`` optimiser steps on ``loss_at(step)`` at learning rate ``lr(step)``, clipping the gradient
    norm to ``clip`` when given; ``after_step(step)`` runs after each update. Returns the loss of every
    step; with ``stop_nonfinite`` a non-finite loss ends training before its update (it is the last one
    returned). The model is left in eval mode."""
    model.train()
    losses: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr(step)
        loss = loss_at(step)
        losses.append(loss.item())
        if stop_nonfinite and not math.isfinite(losses[-1]):
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if after_step is not None:
            after_step(step)
    model.eval()
    return losses
