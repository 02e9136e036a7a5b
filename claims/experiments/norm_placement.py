"""C17: pre-norm trains more stably than post-norm and is less sensitive to the learning rate.

Two measurements on a synthetic copy task (Xiong et al. 2020, "On Layer Normalization
in the Transformer Architecture"):

(a) gradient norm at initialisation of the first and the last block's parameters, for several
    depths, pre- vs post-norm (their Theorem 1: post-LN's last-layer gradient does not shrink
    with depth, pre-LN's shrinks like 1/√L);
(b) a short training grid learning rate × warm-up × depth, pre vs post: final held-out loss per
    seed, divergence flags, and the spread of final loss across learning rates.

The task helpers here (``make_batch``, ``train``, ...) are shared with :mod:`attn_scaling`.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.claims.experiments.lm_train import build_lm
from harness.claims.experiments.optim import lr_at
from harness.flops import count_params


# ------------------------------------------------------------------------------------------------
# The task: copy a random sequence
# ------------------------------------------------------------------------------------------------

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


def answer_positions(task: Task) -> Tensor:
    """Positions whose next token is scored: the separator and the second copy but its last token."""
    return torch.arange(task.length, 2 * task.length)


def task_loss(model: nn.Module, tokens: Tensor, task: Task) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy on the second copy, accuracy on it)."""
    pos = answer_positions(task)
    logits = model(tokens)[:, pos]                                                            # (B, n, V)
    target = tokens[:, pos + 1]                                                               # (B, n)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
    acc = (logits.argmax(-1) == target).float().mean()
    return loss, acc


def build(task: Task, seed: int, **cfg: Any) -> nn.Module:
    """A decoder from the registry (``decoder-tiny`` with ``cfg`` overrides), initialised with ``seed``."""
    return build_lm(seed, vocab_size=task.vocab, max_seq_len=max(64, task.seq_len), **cfg)


@torch.no_grad()
def evaluate(model: nn.Module, held_out: Tensor, task: Task) -> tuple[float, float]:
    was = model.training
    model.eval()
    loss, acc = task_loss(model, held_out, task)
    model.train(was)
    return float(loss), float(acc)


def train(model: nn.Module, task: Task, *, steps: int, batch: int, lr: float, warmup: int, seed: int,
          held_out: Tensor, probe_at: tuple[int, ...] = ()) -> dict[str, Any]:
    """Adam (β = 0.9, 0.98; no weight decay, no clipping) on fresh batches drawn from ``seed``.

    Returns initial and final held-out loss/accuracy, the held-out loss at each step in ``probe_at``,
    and whether training produced a non-finite loss (then it stops there; the final loss is inf).
    """
    g = torch.Generator().manual_seed(10_000 + seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    init_loss, init_acc = evaluate(model, held_out, task)
    probes: dict[str, float] = {}
    nonfinite = False
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss, _ = task_loss(model, make_batch(task, batch, g), task)
        if not torch.isfinite(loss):
            nonfinite = True
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step + 1 in probe_at:
            probes[str(step + 1)] = evaluate(model, held_out, task)[0]
    final_loss, final_acc = evaluate(model, held_out, task) if not nonfinite else (math.inf, 0.0)
    if not math.isfinite(final_loss):
        nonfinite, final_loss, final_acc = True, math.inf, 0.0
    for k in map(str, probe_at):
        probes.setdefault(k, math.inf if nonfinite else final_loss)
    return dict(init_loss=init_loss, init_acc=init_acc, final_loss=final_loss, final_acc=final_acc,
                nonfinite=nonfinite, probes=probes)


def finite_or_none(x: float) -> float | None:
    """JSON has no inf/NaN: non-finite values are reported as None."""
    return x if math.isfinite(x) else None


def result_header(claim: str, setup: Any, seeds: tuple[int, ...]) -> dict[str, Any]:
    """The fields every tiny-task experiment's result starts with: claim, setup, seeds, trivial loss."""
    return {"claim": claim, "setup": asdict(setup),
            "seeds": list(seeds), "trivial_loss": setup.task.trivial_loss}


def per_seed_results(runs: list[dict[str, Any]]) -> dict[str, list]:
    """``train``'s results over seeds as lists per key (JSON-safe): init/final loss, final accuracy, non-finite."""
    return {"init_loss": [r["init_loss"] for r in runs],
            "final_loss": [finite_or_none(r["final_loss"]) for r in runs],
            "final_acc": [r["final_acc"] for r in runs],
            "nonfinite": [r["nonfinite"] for r in runs]}


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------

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


def block_grad_norms(model: nn.Module) -> tuple[float, float]:
    """(first block's, last block's) parameter-gradient L2 norm."""
    def norm(block: nn.Module) -> float:
        return float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in block.parameters()
                                    if p.grad is not None)))
    blocks = model.stack.blocks
    return norm(blocks[0]), norm(blocks[-1])


def grad_norm_at_init(setup: Setup, seeds: tuple[int, ...]) -> dict[str, Any]:
    """Per depth, per placement: lists over seeds of the first/last block's gradient norm at init, and
    the residual stream's growth through the stack (RMS of the last block's output / of the first
    block's input) — Xiong et al.'s 1/√L for pre-LN comes from that growth."""
    out: dict[str, Any] = {}
    for depth in setup.grad_depths:
        row: dict[str, Any] = {}
        for placement in PLACEMENTS:
            first, last, growth = [], [], []
            for seed in seeds:
                model = build(setup.task, seed, d_model=setup.d_model, n_heads=setup.n_heads,
                              n_layers=depth, norm_placement=placement)
                seen: dict[str, Tensor] = {}
                blocks = model.stack.blocks
                hooks = [blocks[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0])),
                         blocks[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("out", o))]
                batch = make_batch(setup.task, setup.grad_batch, torch.Generator().manual_seed(seed))
                loss, _ = task_loss(model, batch, setup.task)
                loss.backward()
                for h in hooks:
                    h.remove()
                f, l = block_grad_norms(model)
                first.append(f)
                last.append(l)
                rms = lambda x: float(x.detach().pow(2).mean().sqrt())  # noqa: E731
                growth.append(rms(seen["out"]) / rms(seen["in"]))
            row[placement] = {"first_layer": first, "last_layer": last, "residual_growth": growth}
        out[str(depth)] = row
    return out


def diverged(r: dict[str, Any], task: Task) -> bool:
    """Non-finite, worse than at init, or not better than the context-free predictor (ln n_values)."""
    return r["nonfinite"] or r["final_loss"] > r["init_loss"] or r["final_loss"] >= task.trivial_loss


def cell_name(placement: str, depth: int, lr: float, warmup: float) -> str:
    return f"{placement}/L{depth}/lr{lr:g}/wu{warmup:g}"


def training_grid(setup: Setup, seeds: tuple[int, ...]) -> dict[str, Any]:
    task = setup.task
    held_out = make_batch(task, setup.held_out, torch.Generator().manual_seed(999_999))
    cells: dict[str, Any] = {}
    for placement in PLACEMENTS:
        for depth in setup.depths:
            for lr in setup.lrs:
                for wu in setup.warmups:
                    runs = []
                    for seed in seeds:
                        model = build(task, seed, d_model=setup.d_model, n_heads=setup.n_heads,
                                      n_layers=depth, norm_placement=placement)
                        runs.append(train(model, task, steps=setup.steps, batch=setup.batch, lr=lr,
                                          warmup=round(wu * setup.steps), seed=seed, held_out=held_out))
                    flags = [diverged(r, task) for r in runs]
                    cells[cell_name(placement, depth, lr, wu)] = dict(
                        placement=placement, depth=depth, lr=lr, warmup=wu, **per_seed_results(runs),
                        diverged=flags, divergence_rate=sum(flags) / len(flags))
    return cells


def summarise(cells: dict[str, Any], setup: Setup, seeds: tuple[int, ...]) -> dict[str, Any]:
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


def run(quick: bool = True, seeds: tuple[int, ...] = (0, 1, 2), setup: Setup | None = None) -> dict:
    setup = setup or (QUICK if quick else FULL)
    seeds = tuple(seeds)
    t0 = time.perf_counter()
    grads = grad_norm_at_init(setup, seeds)
    t1 = time.perf_counter()
    cells = training_grid(setup, seeds)
    t2 = time.perf_counter()
    summary = summarise(cells, setup, seeds)
    params = {str(d): count_params(build(setup.task, 0, d_model=setup.d_model, n_heads=setup.n_heads,
                                         n_layers=d)) for d in sorted({*setup.grad_depths, *setup.depths})}
    return {
        **result_header("C17", setup, seeds),
        "grad_norm_at_init": grads,
        "grid": cells,
        "summary": summary,
        "scale": {"params": params, "steps": setup.steps, "seq_len": setup.task.seq_len,
                  "batch": setup.batch, "runs": len(cells) * len(seeds),
                  "wall_seconds": time.perf_counter() - t0,
                  "wall_seconds_grad": t1 - t0, "wall_seconds_grid": t2 - t1},
    }
