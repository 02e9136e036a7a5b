"""C43: residual connections are essential for training a deep stack (000: "ALWAYS use residual connections
(essential for training)!"; "Mistake 5: No Residual Connections — Symptom: Training diverges or converges very
slowly").

The same registry decoder (pre-norm) is trained twice per seed on the synthetic copy task of
:mod:`claims.experiments.copy_task`: as built (``x + f(norm(x))``) and with every skip removed
(``f(norm(x))``, the same norms and weights: :class:`NoSkip`). Measured per seed: the held-out loss after
training, and the first block's gradient norm at initialisation. A deep stack is the claim's case; a 2-block
stack is the control.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from claims.experiments.copy_task import Task, build, held_out, make_batch, outcome, task_loss, train
from claims.experiments.runner import Experiment, Fields, Seeds, per_seed


@dataclass(frozen=True)
class Setup:
    task: Task
    d_model: int
    n_heads: int
    deep: int                  # blocks of the claim's deep stack
    shallow: int               # blocks of the control
    steps: int
    batch: int
    lr: float
    warmup: int
    held_out: int
    grad_batch: int


QUICK = Setup(task=Task(), d_model=32, n_heads=4, deep=12, shallow=2, steps=60, batch=32, lr=3e-3, warmup=6,
              held_out=512, grad_batch=64)
FULL = replace(QUICK, deep=24, steps=200, warmup=20)

DATA = ("Synthetic copy task generated in code (8 random symbols of 16, a separator, the same 8 again; loss on the "
        "second copy, context-free chance ln 16 = 2.77 nats). decoder-tiny from the registry at d_model 32, 4 heads, "
        "pre-norm, 12 blocks (QUICK; 24 FULL) and 2 blocks (control), each trained as built and with every skip "
        "connection removed (the same norms and initial weights): Adam (β 0.9, 0.98), lr 3e-3, 10 % warm-up then "
        "cosine, 60 steps (QUICK; 200 FULL) of 32 fresh sequences, held-out loss on 512 fixed sequences; the first "
        "block's gradient norm at initialisation on one batch of 64.")

VARIANTS = ("residual", "plain")


class NoSkip(nn.Module):
    """A :class:`architectures.layers.blocks.PreNorm` without its skip: ``f(norm(x))`` instead of
    ``x + f(norm(x))`` (the same norm module and dropout): the claim's counterfactual."""

    def __init__(self, pre: nn.Module) -> None:
        super().__init__()
        self.norm, self.drop = pre.norm, pre.drop

    def forward(self, x: Tensor, sublayer) -> Tensor:
        return self.drop(sublayer(self.norm(x)))


def without_skips(model: nn.Module) -> nn.Module:
    """Every block's two residual wrappers replaced by :class:`NoSkip` (in place); returns ``model``."""
    for block in model.stack.blocks:
        block.res_attn, block.res_mlp = NoSkip(block.res_attn), NoSkip(block.res_mlp)
    return model


def make(s: Setup, depth: int, variant: str, seed: int) -> nn.Module:
    model = build(s.task, seed, d_model=s.d_model, n_heads=s.n_heads, n_layers=depth, norm_placement="pre")
    return without_skips(model) if variant == "plain" else model


def first_grad(model: nn.Module, s: Setup, seed: int) -> float:
    """L2 norm of the first block's parameter gradient on one batch at initialisation."""
    loss, _ = task_loss(model, make_batch(s.task, s.grad_batch, torch.Generator().manual_seed(seed)), s.task)
    loss.backward()
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.stack.blocks[0].parameters()
                         if p.grad is not None))
    model.zero_grad(set_to_none=True)
    return norm


def trial(s: Setup, depth: int, variant: str, seed: int, ho: Tensor) -> Fields:
    model = make(s, depth, variant, seed)
    g = first_grad(model, s, seed)
    run = train(model, s.task, steps=s.steps, batch=s.batch, lr=s.lr, warmup=s.warmup, seed=seed, held_out=ho)
    return {**outcome(run), "first_grad": g}


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    ho = held_out(s.task, s.held_out)
    models = {str(d): {v: per_seed([trial(s, d, v, seed, ho) for seed in seeds]) for v in VARIANTS}
              for d in (s.shallow, s.deep)}
    return ({"models": models, "deep": s.deep, "shallow": s.shallow, "chance_loss": s.task.trivial_loss},
            {"runs": 2 * 2 * len(seeds), "steps": s.steps})


EXPERIMENT = Experiment("C43", QUICK, FULL, measure)
run = EXPERIMENT.run
