"""C17: pre-norm trains more stably than post-norm and is less sensitive to the learning rate.

Two measurements on the synthetic copy task of :mod:`claims.experiments.copy_task` (Xiong et al. 2020,
"On Layer Normalization in the Transformer Architecture"):

(a) gradient norm at initialisation of the first and the last block's parameters, for several
    depths, pre- vs post-norm (their Theorem 1: post-LN's last-layer gradient does not shrink
    with depth, pre-LN's shrinks like 1/√L);
(b) a short training grid learning rate × warm-up × depth, pre vs post: final held-out loss per
    seed, divergence flags, and the spread of final loss across learning rates.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from claims.experiments.copy_task import Task, build, held_out, make_batch, outcome, task_loss, train
from claims.experiments.runner import Experiment, Fields, Seeds, per_seed, sweep, timed
from harness.flops import count_params


@dataclass(frozen=True)
class Setup:
    task: Task
    d_model: int
    n_heads: int
    # (a) gradient norm at init
    grad_depths: tuple[int, ...]
    grad_batch: int
    # (b) training grid
    lrs: tuple[float, ...]
    warmups: tuple[float, ...]          # fraction of steps
    depths: tuple[int, ...]
    steps: int
    batch: int
    held_out: int


QUICK = Setup(task=Task(), d_model=32, n_heads=4, grad_depths=(2, 4, 8, 16), grad_batch=64,
              lrs=(3e-3, 1e-2, 3e-2), warmups=(0.0, 0.1), depths=(2, 6), steps=120, batch=32,
              held_out=512)
FULL = replace(QUICK, d_model=64, steps=300, lrs=(1e-3, 3e-3, 1e-2, 3e-2), grad_depths=(2, 4, 8, 16, 32))

PLACEMENTS = ("pre", "post")

DATA = (
    "Synthetic copy task generated in code: 8 random symbols (of 16), a separator, the same 8 symbols "
    "again (17 tokens, vocabulary 17); loss and accuracy on the second copy only, which needs attention "
    "8 positions back (context-free chance: ln 16 = 2.77 nats, accuracy 1/16). Fresh training batches "
    "of 32 per step, a fixed held-out set of 512 sequences. Models: decoder-tiny from the registry at "
    "d_model 32 (QUICK; 64 FULL), 4 heads, sinusoidal positions, pre- vs post-LayerNorm (post has no "
    "final norm), PyTorch default init. (a) gradient norms at init on one batch of 64 at depths 2, 4, 8, "
    "16; (b) Adam (β2 0.98, no clipping, no weight decay, linear warm-up then cosine decay) for 120 "
    "steps (QUICK; 300 FULL) on the grid lr {3e-3, 1e-2, 3e-2} × warm-up {0, 10% of steps} × depth "
    "{2, 6}, 3 seeds: 72 short runs, 26k-77k parameters each."
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


def never_learned(r: dict[str, Any], task: Task) -> bool:
    """The run stayed finite and below its initial loss but never beat the context-free predictor
    (ln n_values): it did not learn, which is not the same as diverging."""
    return not diverged(r, task) and r["final_loss"] >= task.trivial_loss


def cell_name(placement: str, depth: int, lr: float, warmup: float) -> str:
    return f"{placement}/L{depth}/lr{lr:g}/wu{warmup:g}"


def training_grid(setup: Setup, seeds: Seeds) -> dict[str, Any]:
    task, held = setup.task, held_out(setup.task, setup.held_out)
    cells = {cell_name(p, d, lr, wu): dict(placement=p, depth=d, lr=lr, warmup=wu)
             for p in PLACEMENTS for d in setup.depths for lr in setup.lrs for wu in setup.warmups}

    def trial(cell: dict[str, Any], seed: int) -> Fields:
        model = _build(setup, seed, cell["depth"], norm_placement=cell["placement"])
        r = train(model, task, steps=setup.steps, batch=setup.batch, lr=cell["lr"],
                  warmup=round(cell["warmup"] * setup.steps), seed=seed, held_out=held)
        return {**outcome(r), "diverged": diverged(r, task), "never_learned": never_learned(r, task)}

    runs = sweep(cells, seeds, trial)
    return {name: {**cell, **runs[name], "divergence_rate": sum(runs[name]["diverged"]) / len(seeds)}
            for name, cell in cells.items()}


def summarise(cells: dict[str, Any], setup: Setup, seeds: Seeds) -> dict[str, Any]:
    """Divergence rates per placement, and the sensitivity to the learning rate.

    Sensitivity, per placement, per seed: for every (depth, warm-up) the spread of final loss across
    the learning rates — max − min, and std — averaged over (depth, warm-up). A run's loss is capped
    at its init loss (a non-finite run counts as its init loss), so one blow-up does not turn the
    spread into inf. ``loss_by_lr`` and ``warmup_gain`` (loss without warm-up − with it) likewise.
    """
    def capped(c: dict[str, Any], i: int) -> float:
        x = c["final_loss"][i]
        return c["init_loss"][i] if x is None else min(x, c["init_loss"][i])

    out: dict[str, Any] = {"divergence_rate": {}, "nonfinite_rate": {}, "lr_spread": {}, "lr_std": {},
                           "best_loss": {}, "worst_loss": {}, "loss_by_lr": {}, "warmup_gain": {},
                           "divergence_rate_by_warmup": {}}
    for placement in PLACEMENTS:
        mine = [c for c in cells.values() if c["placement"] == placement]
        flags = [d for c in mine for d in c["diverged"]]
        out["divergence_rate"][placement] = sum(flags) / len(flags)
        out["divergence_rate_by_warmup"][placement] = {
            f"{wu:g}": sum(d for c in mine if c["warmup"] == wu for d in c["diverged"])
            / sum(len(c["diverged"]) for c in mine if c["warmup"] == wu) for wu in setup.warmups}
        stalls = [d for c in mine for d in c["never_learned"]]
        out.setdefault("never_learned_rate", {})[placement] = sum(stalls) / len(stalls)
        nf = [d for c in mine for d in c["nonfinite"]]
        out["nonfinite_rate"][placement] = sum(nf) / len(nf)
        spread, std, best, worst = [], [], [], []
        for i in range(len(seeds)):
            s_i, d_i = [], []
            for depth in setup.depths:
                for wu in setup.warmups:
                    losses = torch.tensor([capped(cells[cell_name(placement, depth, lr, wu)], i)
                                           for lr in setup.lrs])
                    s_i.append(float(losses.max() - losses.min()))
                    d_i.append(float(losses.std()) if len(losses) > 1 else 0.0)
            spread.append(sum(s_i) / len(s_i))
            std.append(sum(d_i) / len(d_i))
            best.append(min(capped(c, i) for c in mine))
            worst.append(max(capped(c, i) for c in mine))
        out["lr_spread"][placement] = spread
        out["lr_std"][placement] = std
        out["best_loss"][placement] = best
        out["worst_loss"][placement] = worst
        # per lr: final loss (capped) per seed, averaged over depth and warm-up
        out["loss_by_lr"][placement] = {
            f"{lr:g}": [sum(capped(cells[cell_name(placement, d, lr, wu)], i)
                            for d in setup.depths for wu in setup.warmups)
                        / (len(setup.depths) * len(setup.warmups)) for i in range(len(seeds))]
            for lr in setup.lrs}
        # loss without warm-up − loss with the longest warm-up, per seed, averaged over depth and lr
        if len(setup.warmups) > 1:
            lo, hi = min(setup.warmups), max(setup.warmups)
            def gain(i: int) -> float:
                diffs = [capped(cells[cell_name(placement, d, lr, lo)], i)
                         - capped(cells[cell_name(placement, d, lr, hi)], i)
                         for d in setup.depths for lr in setup.lrs]
                return sum(diffs) / len(diffs)
            out["warmup_gain"][placement] = [gain(i) for i in range(len(seeds))]
    return out


def measure(setup: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    grads, t_grad = timed(grad_norm_at_init, setup, seeds)
    cells, t_grid = timed(training_grid, setup, seeds)
    params = {str(d): count_params(_build(setup, 0, d)) for d in sorted({*setup.grad_depths, *setup.depths})}
    return ({"trivial_loss": setup.task.trivial_loss, "grad_norm_at_init": grads, "grid": cells,
             "summary": summarise(cells, setup, seeds)},
            {"params": params, "steps": setup.steps, "seq_len": setup.task.seq_len, "batch": setup.batch,
             "runs": len(cells) * len(seeds), "wall_seconds_grad": t_grad, "wall_seconds_grid": t_grid})


EXPERIMENT = Experiment("C17", QUICK, FULL, measure)
run = EXPERIMENT.run
