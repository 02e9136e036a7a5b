"""C07: scaling q·k by 1/√d_k keeps Var(q·k) ≈ 1; without it the softmax saturates and gradients vanish.

(a) Numeric, no training: unit-variance q and k at several d_k — the variance of q·k unscaled and
    scaled, the share of saturated softmax rows (max probability > 0.99), and the mean Frobenius
    norm of the softmax Jacobian diag(p) − p pᵀ per row (the gradient that flows through softmax).
(b) A short training run on the copy task of :mod:`norm_placement` with a large head dim, scaled
    (the default 1/√d_head) vs unscaled (``attn_scale=1.0``): held-out loss/accuracy at fixed steps
    and at the end, and the gradient norm of the q/k projection weights at the first step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from architectures.layers.attention import causal_mask

from harness.claims.experiments.norm_placement import (
    Task, build, finite_or_none, make_batch, per_seed_results, result_header, task_loss, train)
from harness.flops import count_params


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


def numeric(setup: Setup, seeds: tuple[int, ...]) -> dict[str, Any]:
    """Per d_k: every statistic as a list over seeds."""
    res: dict[str, Any] = {}
    for d_k in setup.d_ks:
        per_seed = [softmax_stats(d_k, setup.n_keys, setup.n_rows, setup.saturation, setup.vanish_tol, s)
                    for s in seeds]
        res[str(d_k)] = {key: [r[key] for r in per_seed] for key in per_seed[0]}
    # reference: the Jacobian norm of the uniform distribution over n_keys, the unsaturated extreme
    n = setup.n_keys
    res["uniform_jacobian"] = math.sqrt(1 / n - 2 / n ** 2 + 1 / n ** 2)
    return res


# ------------------------------------------------------------------------------------------------
# (b) training
# ------------------------------------------------------------------------------------------------

def qk_grad_norms(model: torch.nn.Module) -> tuple[float, float]:
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
    hd, h = attn.head_dim, attn.n_heads
    q, k = seen["qkv"][..., :h * hd], seen["qkv"][..., h * hd:h * hd + attn.n_kv_heads * hd]
    q = q.view(b, t, h, hd).transpose(1, 2)
    k = k.view(b, t, attn.n_kv_heads, hd).transpose(1, 2).repeat_interleave(h // attn.n_kv_heads, 1)
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(hd) if scale is None else scale)   # (B, H, T, T)
    keep = causal_mask(t, t, s.device)
    p = s.masked_fill(~keep, float("-inf")).softmax(-1)[:, :, 1:]                    # rows with ≥ 2 keys
    return dict(grad_q=gq, grad_k=gk, logit_std=float(s[..., keep].std()),
                saturated=float((p.max(-1).values > setup.saturation).float().mean()))


def training(setup: Setup, seeds: tuple[int, ...]) -> dict[str, Any]:
    task = setup.task
    held_out = make_batch(task, setup.held_out, torch.Generator().manual_seed(999_999))
    res: dict[str, Any] = {}
    for name, scale in VARIANTS.items():
        probes, runs = [], []
        for seed in seeds:
            model = build(task, seed, d_model=setup.d_model, n_heads=setup.n_heads,
                          n_layers=setup.n_layers, attn_scale=scale)
            probes.append(init_probe(model, setup, scale, seed))          # train() zeroes its grads
            runs.append(train(model, task, steps=setup.steps, batch=setup.batch, lr=setup.lr,
                              warmup=round(setup.warmup * setup.steps), seed=seed, held_out=held_out,
                              probe_at=setup.probe_at))
        res[name] = {
            "attn_scale": scale,
            "init_grad_q": [p["grad_q"] for p in probes],
            "init_grad_k": [p["grad_k"] for p in probes],
            "init_logit_std": [p["logit_std"] for p in probes],
            "init_saturated": [p["saturated"] for p in probes],
            "loss_at": {k: [finite_or_none(r["probes"][k]) for r in runs] for k in map(str, setup.probe_at)},
            **per_seed_results(runs),
        }
    return res


def run(quick: bool = True, seeds: tuple[int, ...] = (0, 1, 2), setup: Setup | None = None) -> dict:
    setup = setup or (QUICK if quick else FULL)
    seeds = tuple(seeds)
    t0 = time.perf_counter()
    num = numeric(setup, seeds)
    t1 = time.perf_counter()
    trained = training(setup, seeds)
    t2 = time.perf_counter()
    params = count_params(build(setup.task, 0, d_model=setup.d_model, n_heads=setup.n_heads,
                                n_layers=setup.n_layers))
    return {
        **result_header("C07", setup, seeds),
        "numeric": num,
        "training": trained,
        "scale": {"params": params, "d_head": setup.d_model // setup.n_heads, "steps": setup.steps,
                  "seq_len": setup.task.seq_len, "batch": setup.batch,
                  "wall_seconds": time.perf_counter() - t0,
                  "wall_seconds_numeric": t1 - t0, "wall_seconds_training": t2 - t1},
    }
