"""The synthetic copy task of the C17 (norm placement) and C07 (attention scaling) experiments.

A sequence is ``length`` random symbols, a separator, the same symbols again; the loss is on the second
copy, so it cannot be learnt without attending back ``length + 1`` positions. :func:`train` trains a
registry decoder on fresh batches with Adam (no weight decay, no clipping) under the shared schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claims.experiments.lm_train import build_lm
from claims.experiments.runner import Fields, finite_or_none
from claims.experiments.train import adamw, fit, lr_at

HELD_OUT_SEED = 999_999


@dataclass(frozen=True)
class Task:
    """Copy: ``length`` random symbols from [1, n_symbols], a separator 0, the same symbols again.

    Sequence length 2·length + 1. The loss and accuracy are on the second copy only (each symbol
    predicted from the position before it), so the task cannot be solved without attending back
    ``length + 1`` positions; a context-free predictor gets ln(n_symbols).
    """

    n_symbols: int = 16
    length: int = 8

    @property
    def vocab(self) -> int:
        return self.n_symbols + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.length + 1

    @property
    def trivial_loss(self) -> float:
        """Cross-entropy of the best predictor that ignores the context: uniform over the symbols."""
        return math.log(self.n_symbols)


def make_batch(task: Task, batch: int, g: torch.Generator) -> Tensor:
    """(batch, seq_len) token ids drawn with ``g``."""
    x = torch.randint(1, task.n_symbols + 1, (batch, task.length), generator=g)
    return torch.cat([x, torch.zeros(batch, 1, dtype=torch.long), x], dim=1)


def held_out(task: Task, n: int) -> Tensor:
    """The fixed held-out set of ``n`` sequences (its own seed)."""
    return make_batch(task, n, torch.Generator().manual_seed(HELD_OUT_SEED))


def task_loss(model: nn.Module, tokens: Tensor, task: Task) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy on the second copy, accuracy on it)."""
    pos = torch.arange(task.length, 2 * task.length)          # the separator and the copy but its last token
    logits = model(tokens)[:, pos]                                                            # (B, n, V)
    target = tokens[:, pos + 1]                                                               # (B, n)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
    acc = (logits.argmax(-1) == target).float().mean()
    return loss, acc


def build(task: Task, seed: int, **cfg: Any) -> nn.Module:
    """A decoder from the registry (``decoder-tiny`` with ``cfg`` overrides), initialised with ``seed``."""
    return build_lm(seed, vocab_size=task.vocab, max_seq_len=max(64, task.seq_len), **cfg)


@torch.no_grad()
def evaluate(model: nn.Module, tokens: Tensor, task: Task) -> tuple[float, float]:
    """Loss and accuracy on ``tokens`` in eval mode (the model's mode is restored)."""
    was = model.training
    model.eval()
    loss, acc = task_loss(model, tokens, task)
    model.train(was)
    return float(loss), float(acc)


def train(model: nn.Module, task: Task, *, steps: int, batch: int, lr: float, warmup: int, seed: int,
          held_out: Tensor, probe_at: tuple[int, ...] = ()) -> dict[str, Any]:
    """Adam (β = 0.9, 0.98; no weight decay, no clipping) on fresh batches drawn from ``seed``.

    Returns initial and final held-out loss/accuracy, the held-out loss at each step in ``probe_at``,
    and whether training produced a non-finite loss (then it stops there; the final loss is inf).
    """
    g = torch.Generator().manual_seed(10_000 + seed)
    init_loss, init_acc = evaluate(model, held_out, task)
    probes: dict[str, float] = {}

    def probe(step: int) -> None:
        if step + 1 in probe_at:
            probes[str(step + 1)] = evaluate(model, held_out, task)[0]

    losses = fit(model, adamw(model, lr, 0.0, betas=(0.9, 0.98)), steps, lambda step: lr_at(step, steps, lr, warmup),
                 lambda step: task_loss(model, make_batch(task, batch, g), task)[0], stop_nonfinite=True,
                 after_step=probe)
    nonfinite = bool(losses) and not math.isfinite(losses[-1])
    final_loss, final_acc = evaluate(model, held_out, task) if not nonfinite else (math.inf, 0.0)
    if not math.isfinite(final_loss):
        nonfinite, final_loss, final_acc = True, math.inf, 0.0
    for k in map(str, probe_at):
        probes.setdefault(k, math.inf if nonfinite else final_loss)
    return dict(init_loss=init_loss, init_acc=init_acc, final_loss=final_loss, final_acc=final_acc,
                nonfinite=nonfinite, probes=probes)


def outcome(run: dict[str, Any]) -> Fields:
    """A :func:`train` result's JSON-safe per-seed fields: init/final loss, final accuracy, non-finite."""
    return {"init_loss": run["init_loss"], "final_loss": finite_or_none(run["final_loss"]),
            "final_acc": run["final_acc"], "nonfinite": run["nonfinite"]}
