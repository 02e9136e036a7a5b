"""C07: scaling q·k by 1/√d_k keeps Var(q·k) ≈ 1; without it the softmax saturates and gradients vanish.

(a) Numeric, no training: unit-variance q and k at several d_k — the variance of q·k unscaled and
    scaled, the share of saturated softmax rows (max probability > 0.99), and the mean Frobenius
    norm of the softmax Jacobian diag(p) − p pᵀ per row (the gradient that flows through softmax).
(b) A short training run on the copy task of :mod:`claims.experiments.copy_task` with a large head dim,
    scaled (the default 1/√d_head) vs unscaled (``attn_scale=1.0``): held-out loss/accuracy at fixed
    steps and at the end, and the gradient norm of the q/k projection weights at the first step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from architectures.layers.attention import causal_mask
from architectures.transformer import counterfactual
from claims.experiments.copy_task import Task, build, held_out, make_batch, outcome, task_loss, train
from claims.experiments.runner import Experiment, Fields, Seeds, finite_or_none, per_seed, sweep, timed
from harness.instruments.flops import count_params


@dataclass(frozen=True)
class Setup:
    # (a) numeric
    d_ks: tuple[int, ...]
    n_keys: int
    n_rows: int
    saturation: float                # a row is saturated when its max probability exceeds this
    vanish_tol: float                # a row's gradient has vanished when ‖J‖_F is below this
    # (b) training
    task: Task
    d_model: int
    n_heads: int                     # head dim = d_model / n_heads
    n_layers: int
    steps: int
    probe_at: tuple[int, ...]
    batch: int
    lr: float
    warmup: float                    # fraction of steps
    held_out: int


QUICK = Setup(d_ks=(16, 64, 256, 1024), n_keys=128, n_rows=512, saturation=0.99, vanish_tol=1e-3,
              task=Task(), d_model=128, n_heads=1, n_layers=2, steps=200, probe_at=(25, 50, 100),
              batch=32, lr=3e-3, warmup=0.1, held_out=512)
FULL = replace(QUICK, n_rows=2048, d_model=256, steps=400, probe_at=(25, 50, 100, 200))

VARIANTS = {"scaled": None, "unscaled": 1.0}        # attn_scale: None = 1/√d_head

DATA = (
    "(a) Gaussian q and k with unit-variance entries generated in code: for d_k in {16, 64, 256, 1024}, "
    "512 query rows against 128 keys per seed (QUICK; 2048 rows FULL), softmax over the 128 keys. "
    "(b) The synthetic copy task of the norm-placement experiment (8 random symbols of 16, a separator, "
    "the same 8 again; loss on the second copy; fresh batches of 32, a fixed held-out set of 512): "
    "decoder-tiny from the registry at d_model 128 with one head (d_head 128; FULL: 256), 2 pre-norm "
    "layers, about 0.4M parameters, Adam lr 3e-3 with 10% warm-up and cosine decay for 200 steps "
    "(QUICK; 400 FULL), scaled (1/√d_head) vs unscaled (attn_scale = 1.0), 3 seeds."
)


# ------------------------------------------------------------------------------------------------
# (a) numeric
# ------------------------------------------------------------------------------------------------

def jacobian_frobenius(p: Tensor) -> Tensor:
    """‖diag(p) − p pᵀ‖_F per row of p (..., n), in closed form: √(Σp² − 2Σp³ + (Σp²)²)."""
    s2 = (p * p).sum(-1)
    return (s2 - 2 * (p ** 3).sum(-1) + s2 * s2).clamp_min(0).sqrt()


def softmax_stats(d_k: int, n_keys: int, n_rows: int, saturation: float, vanish_tol: float,
                  seed: int) -> dict[str, float]:
    """Variance of the logits; share of saturated rows; the softmax Jacobian's Frobenius norm per row
    (mean, median, and the share of rows where it is below ``vanish_tol``); mean max probability.

    The mean of ‖J‖_F is not monotone in saturation: it is 0 for a one-hot row, ≈ 1/√n for a
    uniform one, and largest (up to 1/√2) for rows split between two keys — which unscaled logits
    produce often. The median and the vanished share show the bimodal collapse."""
    g = torch.Generator().manual_seed(seed * 7919 + d_k)
    q = torch.randn(n_rows, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(n_keys, d_k, generator=g, dtype=torch.float64)
    raw = q @ k.T                                                  # (rows, keys)
    out: dict[str, float] = {}
    for name, scores in (("unscaled", raw), ("scaled", raw / math.sqrt(d_k))):
        p = scores.softmax(-1)
        out[f"var_{name}"] = float(scores.var())
        out[f"saturated_{name}"] = float((p.max(-1).values > saturation).double().mean())
        jac = jacobian_frobenius(p)
        out[f"jacobian_{name}"] = float(jac.mean())
        out[f"jacobian_median_{name}"] = float(jac.median())
        out[f"vanished_{name}"] = float((jac < vanish_tol).double().mean())
        out[f"max_prob_{name}"] = float(p.max(-1).values.mean())
    return out


def numeric(setup: Setup, seeds: Seeds) -> dict[str, Any]:
    """Per d_k: every statistic as a list over seeds."""
    res: dict[str, Any] = {str(d_k): per_seed([softmax_stats(d_k, setup.n_keys, setup.n_rows, setup.saturation,
                                                             setup.vanish_tol, s) for s in seeds])
                           for d_k in setup.d_ks}
    # reference: the Jacobian norm of the uniform distribution over n_keys, the unsaturated extreme
    n = setup.n_keys
    res["uniform_jacobian"] = math.sqrt(1 / n - 2 / n ** 2 + 1 / n ** 2)
    return res


# ------------------------------------------------------------------------------------------------
# (b) training
# ------------------------------------------------------------------------------------------------

def qk_grad_norms(model: nn.Module) -> tuple[float, float]:
    """(q, k) projection weight-gradient norms over all layers (self-attention's fused qkv)."""
    gq = gk = 0.0
    for block in model.stack.blocks:
        w = block.attn.qkv.weight.grad                              # (d + 2·Hkv·hd, d)
        d = w.shape[1]
        kv = block.attn.n_kv_heads * block.attn.head_dim
        gq += float((w[:d] ** 2).sum())
        gk += float((w[d:d + kv] ** 2).sum())
    return math.sqrt(gq), math.sqrt(gk)


def init_probe(model: nn.Module, setup: Setup, scale: float | None, seed: int) -> dict[str, float]:
    """At init (``model`` untrained), on one training batch: q/k gradient norms, and the first layer's
    attention logits' std and saturated-row share (causal rows with ≥ 2 keys)."""
    seen: dict[str, Tensor] = {}
    attn = model.stack.blocks[0].attn
    hook = attn.qkv.register_forward_hook(lambda m, a, o: seen.__setitem__("qkv", o.detach()))
    batch = make_batch(setup.task, setup.batch, torch.Generator().manual_seed(10_000 + seed))
    loss, _ = task_loss(model, batch, setup.task)
    loss.backward()
    hook.remove()
    gq, gk = qk_grad_norms(model)
    b, t, _ = seen["qkv"].shape
    hd, h, hkv = attn.head_dim, attn.n_heads, attn.n_kv_heads
    q, k = seen["qkv"][..., :h * hd], seen["qkv"][..., h * hd:(h + hkv) * hd]           # (B, T, H·hd), (B, T, Hkv·hd)
    q = q.view(b, t, h, hd).transpose(1, 2)                                            # (B, H, T, hd)
    k = k.view(b, t, hkv, hd).transpose(1, 2).repeat_interleave(h // hkv, 1)          # (B, H, T, hd)
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(hd) if scale is None else scale)   # (B, H, T, T)
    keep = causal_mask(t, t, s.device)
    p = s.masked_fill(~keep, float("-inf")).softmax(-1)[:, :, 1:]                    # rows with ≥ 2 keys
    return {"init_grad_q": gq, "init_grad_k": gk, "init_logit_std": float(s[..., keep].std()),
            "init_saturated": float((p.max(-1).values > setup.saturation).float().mean())}


def _build(setup: Setup, seed: int) -> nn.Module:
    return build(setup.task, seed, d_model=setup.d_model, n_heads=setup.n_heads, n_layers=setup.n_layers)


def training(setup: Setup, seeds: Seeds) -> dict[str, Any]:
    """Per variant (scaled, unscaled): the init probe, the held-out loss at ``probe_at`` and the final
    outcome, as lists over seeds."""
    held = held_out(setup.task, setup.held_out)

    def trial(scale: float | None, seed: int) -> Fields:
        model = counterfactual(_build(setup, seed), attn_scale=scale)
        probe = init_probe(model, setup, scale, seed)                   # train() zeroes its grads
        r = train(model, setup.task, steps=setup.steps, batch=setup.batch, lr=setup.lr,
                  warmup=round(setup.warmup * setup.steps), seed=seed, held_out=held, probe_at=setup.probe_at)
        return {**probe, "loss_at": {k: finite_or_none(r["probes"][k]) for k in map(str, setup.probe_at)},
                **outcome(r)}

    runs = sweep(VARIANTS, seeds, trial)
    return {name: {"attn_scale": VARIANTS[name], **r} for name, r in runs.items()}


def measure(setup: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    num, t_num = timed(numeric, setup, seeds)
    trained, t_train = timed(training, setup, seeds)
    return ({"trivial_loss": setup.task.trivial_loss, "numeric": num, "training": trained},
            {"params": count_params(_build(setup, 0)), "d_head": setup.d_model // setup.n_heads,
             "steps": setup.steps, "seq_len": setup.task.seq_len, "batch": setup.batch,
             "wall_seconds_numeric": t_num, "wall_seconds_training": t_train})


EXPERIMENT = Experiment("C07", QUICK, FULL, measure)
run = EXPERIMENT.run
