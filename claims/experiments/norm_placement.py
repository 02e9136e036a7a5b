"""C17: pre-norm trains more stably than post-norm and is less sensitive to the learning rate.

Two measurements on the synthetic copy task of :mod:`claims.experiments.copy_task` (Xiong et al. 2020,
"On Layer Normalization in the Transformer Architecture"):

(a) gradient norm at initialisation of the first and the last block's parameters, for several
    depths, pre- vs post-norm (their Theorem 1: post-LN's last-layer gradient does not shrink
    with depth, pre-LN's shrinks like 1/√L);
(b) the published setting's shape at small scale: a deep stack trained with Adam at high learning rates
    and NO warm-up (Xiong et al.: post-LN without warm-up fails, pre-LN does not need it), every learning
    rate × run seed trained with each placement (a pair). A run FAILS when it diverged (non-finite, or
    ended above its initial loss) or never beat the context-free predictor (ln 16) by 0.1 nats
    (:data:`CHANCE_MARGIN`): it did not learn the task. The probe compares the failure rates over the
    pairs (exact paired bootstrap) and states the smallest gap the grid could have detected (:mod:`claims.power`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from claims.experiments.copy_task import Task, build, held_out, make_batch, outcome, task_loss, train
from claims.experiments.runner import Experiment, Fields, Seeds, per_seed, sweep, timed
from harness.instruments.flops import count_params


@dataclass(frozen=True)
class Setup:
    task: Task
    d_model: int
    n_heads: int
    # (a) gradient norm at init
    grad_depths: tuple[int, ...]
    grad_batch: int
    # (b) training grid: every learning rate × run, each placement, no warm-up
    lrs: tuple[float, ...]
    depth: int
    steps: int
    batch: int
    held_out: int
    repeats: int = 1                    # runs per seed (run seed = seed + 1000·r): more pairs for the same seeds


QUICK = Setup(task=Task(), d_model=32, n_heads=4, grad_depths=(2, 4, 8, 16), grad_batch=64,
              lrs=(3e-3, 1e-2, 3e-2), depth=8, steps=100, batch=32, held_out=256, repeats=2)
FULL = replace(QUICK, d_model=64, steps=300, lrs=(1e-3, 3e-3, 1e-2, 3e-2), grad_depths=(2, 4, 8, 16, 32),
               depth=12, held_out=512, repeats=3)

PLACEMENTS = ("pre", "post")

DATA = (
    "Synthetic copy task generated in code: 8 random symbols (of 16), a separator, the same 8 symbols "
    "again (17 tokens, vocabulary 17); loss and accuracy on the second copy only, which needs attention "
    "8 positions back (context-free chance: ln 16 = 2.77 nats, accuracy 1/16). Fresh training batches "
    "of 32 per step, a fixed held-out set of 256 sequences (512 FULL). Models: decoder-tiny from the registry "
    "at d_model 32 (QUICK; 64 FULL), 4 heads, sinusoidal positions, pre- vs post-LayerNorm (post has no "
    "final norm), PyTorch default init. (a) gradient norms at init on one batch of 64 at depths 2, 4, 8, "
    "16; (b) 8 layers (12 FULL), Adam (β2 0.98, no clipping, no weight decay) with NO warm-up (cosine decay "
    "from the peak) for 100 steps (QUICK; 300 FULL) at lr {3e-3, 1e-2, 3e-2} (QUICK; and 1e-3 FULL), 2 runs "
    "per seed (3 FULL): 18 pairs of runs per placement over seeds 0, 1, 2."
)


def _build(setup: Setup, seed: int, depth: int, **cfg: Any) -> nn.Module:
    return build(setup.task, seed, d_model=setup.d_model, n_heads=setup.n_heads, n_layers=depth, **cfg)


# ------------------------------------------------------------------------------------------------
# (a) gradient norms at initialisation
# ------------------------------------------------------------------------------------------------

def block_grad_norms(model: nn.Module) -> tuple[float, float]:
    """(first block's, last block's) parameter-gradient L2 norm."""
    def norm(block: nn.Module) -> float:
        return float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in block.parameters()
                                    if p.grad is not None)))
    blocks = model.stack.blocks
    return norm(blocks[0]), norm(blocks[-1])


def grad_probe(setup: Setup, depth: int, placement: str, seed: int) -> Fields:
    """One batch through a fresh model: the first/last block's gradient norm, and the residual stream's
    growth through the stack (RMS of the last block's output / of the first block's input)."""
    model = _build(setup, seed, depth, norm_placement=placement)
    seen: dict[str, Tensor] = {}
    blocks = model.stack.blocks
    hooks = [blocks[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0])),
             blocks[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("out", o))]
    loss, _ = task_loss(model, make_batch(setup.task, setup.grad_batch, torch.Generator().manual_seed(seed)),
                        setup.task)
    loss.backward()
    for h in hooks:
        h.remove()
    first, last = block_grad_norms(model)
    rms = lambda x: float(x.detach().pow(2).mean().sqrt())  # noqa: E731
    return {"first_layer": first, "last_layer": last, "residual_growth": rms(seen["out"]) / rms(seen["in"])}


def grad_norm_at_init(setup: Setup, seeds: Seeds) -> dict[str, Any]:
    """Per depth, per placement: :func:`grad_probe`'s values as lists over seeds (Xiong et al.'s 1/√L for
    pre-LN comes from the residual growth)."""
    return {str(d): {p: per_seed([grad_probe(setup, d, p, seed) for seed in seeds]) for p in PLACEMENTS}
            for d in setup.grad_depths}


# ------------------------------------------------------------------------------------------------
# (b) the training grid
# ------------------------------------------------------------------------------------------------

def diverged(r: dict[str, Any], task: Task) -> bool:
    """The run blew up: its loss became non-finite or ended worse than at initialisation."""
    return bool(r["nonfinite"] or r["final_loss"] > r["init_loss"])


CHANCE_MARGIN = 0.1
"""Nats a run must end below the context-free predictor's loss to count as having learned: a post-norm run
stuck at chance ends at 2.73–2.77 (ln 16 = 2.77), a pre-norm run at the same setting well below 2.67."""


def never_learned(r: dict[str, Any], task: Task) -> bool:
    """The run stayed finite and below its initial loss but never beat the context-free predictor
    (ln n_values) by :data:`CHANCE_MARGIN`: it did not learn, which is not the same as diverging."""
    return not diverged(r, task) and r["final_loss"] >= task.trivial_loss - CHANCE_MARGIN


def failed(r: dict[str, Any], task: Task) -> bool:
    """The run did not learn the task: it diverged or never beat the context-free predictor."""
    return diverged(r, task) or never_learned(r, task)


def cell_name(placement: str, lr: float) -> str:
    return f"{placement}/lr{lr:g}"


def run_seeds(setup: Setup, seeds: Seeds) -> Seeds:
    """The runs behind each seed: seed + 1000·r for r < repeats (r = 0 is the seed itself)."""
    return tuple(s + 1000 * r for s in seeds for r in range(setup.repeats))


def grid_trial(setup: Setup, cell: dict[str, Any], seed: int) -> Fields:
    """One run of the grid: ``cell``'s placement and learning rate from ``seed``, its outcome and flags
    (module-level: a worker process runs it)."""
    task = setup.task
    model = _build(setup, seed, cell["depth"], norm_placement=cell["placement"])
    r = train(model, task, steps=setup.steps, batch=setup.batch, lr=cell["lr"], warmup=0, seed=seed,
              held_out=held_out(task, setup.held_out))
    return {**outcome(r), "diverged": diverged(r, task), "never_learned": never_learned(r, task),
            "failed": failed(r, task)}


def training_grid(setup: Setup, seeds: Seeds) -> dict[str, Any]:
    """Per placement × learning rate, per run (:func:`run_seeds`, the same runs for both placements: pairs):
    the train outcome and the diverged / never_learned / failed flags. No warm-up."""
    cells = {cell_name(p, lr): dict(placement=p, depth=setup.depth, lr=lr, warmup=0.0)
             for p in PLACEMENTS for lr in setup.lrs}
    runs = sweep(cells, run_seeds(setup, seeds), partial(grid_trial, setup))
    return {name: {**cell, **runs[name], "failure_rate": sum(runs[name]["failed"]) / len(runs[name]["failed"])}
            for name, cell in cells.items()}


def summarise(cells: dict[str, Any], setup: Setup) -> dict[str, Any]:
    """Per placement: the failure, divergence and never-learned rates over every run, the failure rate per
    learning rate, and the sensitivity to the learning rate — per run, the spread (max − min) of final loss
    across the learning rates, a run's loss capped at its initial loss (a non-finite run counts as its
    initial loss) so one blow-up does not make the spread inf."""
    def capped(c: dict[str, Any], i: int) -> float:
        x = c["final_loss"][i]
        return c["init_loss"][i] if x is None else min(x, c["init_loss"][i])

    runs = len(next(iter(cells.values()))["failed"])
    out: dict[str, Any] = {key: {} for key in ("failure_rate", "divergence_rate", "never_learned_rate",
                                               "failure_rate_by_lr", "lr_spread")}
    for placement in PLACEMENTS:
        mine = [c for c in cells.values() if c["placement"] == placement]
        for key, flag in (("failure_rate", "failed"), ("divergence_rate", "diverged"),
                          ("never_learned_rate", "never_learned")):
            flags = [f for c in mine for f in c[flag]]
            out[key][placement] = sum(flags) / len(flags)
        out["failure_rate_by_lr"][placement] = {f"{c['lr']:g}": c["failure_rate"] for c in mine}
        out["lr_spread"][placement] = [
            max(capped(cells[cell_name(placement, lr)], i) for lr in setup.lrs)
            - min(capped(cells[cell_name(placement, lr)], i) for lr in setup.lrs) for i in range(runs)]
    return out


def measure(setup: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    grads, t_grad = timed(grad_norm_at_init, setup, seeds)
    cells, t_grid = timed(training_grid, setup, seeds)
    params = {str(d): count_params(_build(setup, 0, d)) for d in sorted({*setup.grad_depths, setup.depth})}
    return ({"trivial_loss": setup.task.trivial_loss, "grad_norm_at_init": grads, "grid": cells,
             "run_seeds": list(run_seeds(setup, seeds)), "summary": summarise(cells, setup)},
            {"params": params, "steps": setup.steps, "seq_len": setup.task.seq_len, "batch": setup.batch,
             "runs": len(cells) * len(run_seeds(setup, seeds)), "wall_seconds_grad": t_grad,
             "wall_seconds_grid": t_grid})


EXPERIMENT = Experiment("C17", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
