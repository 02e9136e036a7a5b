"""C24: a small ViT vs a small CNN of matched forward MACs, trained from scratch on growing subsets.

Two image sets, both available offline: scikit-learn's handwritten digits (shipped with the
package) and procedurally generated shapes (made here from a seed). For every data set × training
subset size × model × seed a fresh model is built from the architecture registry ("vit-micro" and
"resnet-micro" with overridden widths) and trained with AdamW under the same step budget, the same
learning-rate schedule and the same (light, translation-only) augmentation; test accuracy on a fixed
held-out set is recorded. The gap CNN − ViT per size per seed lets a caller check whether the CNN
wins at small sizes and whether the gap shrinks as data grows.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.claims.experiments.optim import adamw, lr_at
from harness.flops import count_model, count_params
from harness.registry import resolve
from harness.spec import Workload

DATA = (
    "Two small image sets, nothing downloaded. (a) scikit-learn's handwritten digits: 1,797 greyscale "
    "8×8 images of 10 classes, upsampled bilinearly to 16×16 and replicated to 3 channels; a fixed "
    "stratified 30% test split (540 images) and a 1,257-image training pool. (b) Procedurally generated "
    "shapes: 6 classes (disc, ring, filled square, square frame, triangle, cross) drawn at random "
    "position, scale and rotation, in a random colour on a random colour background with low-frequency "
    "texture and pixel noise, rendered at 32×32 (2× supersampled); a fixed 1,000-image test set and a "
    "training pool from a different fixed seed. Models are trained from scratch on class-balanced "
    "subsets of growing size (digits 50–1,257; shapes 100–2,000 in the quick run, up to 8,000 in the "
    "full one) — all far below the ~100k-image scale the claim is about; the models have ~0.3–2 M "
    "forward MACs per image and tens of thousands of parameters."
)

SHAPE_CLASSES: tuple[str, ...] = ("disc", "ring", "square", "frame", "triangle", "cross")
_DIGITS_TEST_SEED = 2024          # fixed split, independent of the run seeds
_SHAPES_TRAIN_SEED = 1001         # fixed training pool
_SHAPES_TEST_SEED = 2002          # fixed held-out test set


@dataclass(frozen=True)
class ModelWidths:
    """The ViT ("vit-micro" overrides) and CNN ("resnet-micro" overrides) used on one data set."""

    vit_patch: int = 4
    vit_d_model: int = 32
    vit_layers: int = 2
    vit_heads: int = 2
    vit_d_ff: int = 64
    cnn_width: int = 8
    cnn_stages: int = 2
    cnn_blocks: int = 1


@dataclass(frozen=True)
class Setup:
    """Every size of the experiment. Steps per run: clamp(ceil(epochs · n / batch), min_steps, max_steps)."""

    digits_img: int = 16
    digits_subsets: tuple[int, ...] = (50, 150, 500, 1257)
    digits_models: ModelWidths = ModelWidths(cnn_width=5, cnn_stages=3, cnn_blocks=1)
    shapes_img: int = 32
    shapes_subsets: tuple[int, ...] = (100, 500, 2000)
    shapes_test: int = 1000
    shapes_models: ModelWidths = ModelWidths(cnn_width=6, cnn_stages=3, cnn_blocks=1)
    batch: int = 64
    epochs: float = 30.0
    min_steps: int = 150
    max_steps: int = 600
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_frac: float = 0.1          # linear warm-up, then cosine decay to 0
    shift_px: int = 2                 # random translation augmentation (both models); 0: none
    eval_batch: int = 500
    datasets: tuple[str, ...] = ("digits", "shapes")

    def steps_for(self, n: int) -> int:
        return int(min(self.max_steps, max(self.min_steps, math.ceil(self.epochs * n / self.batch))))


QUICK = Setup()
FULL = Setup(shapes_subsets=(100, 500, 2000, 8000), epochs=40.0, min_steps=300, max_steps=2000)


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------

def _to_rgb(x: np.ndarray) -> Tensor:
    """(N, S, S) greyscale in [0, 1] → (N, 3, S, S) float32, standardised with fixed constants."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return ((t - 0.5) / 0.5).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


def digits_data(img_size: int = 16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x_train, y_train, x_test, y_test): the fixed stratified 70/30 split of scikit-learn's digits,
    upsampled to ``img_size``² and replicated to 3 channels (values standardised around 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = d.images.astype(np.float32) / 16.0                                   # (1797, 8, 8) in [0, 1]
    y = d.target.astype(np.int64)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.3, stratify=y,
                                           random_state=_DIGITS_TEST_SEED)
    x = _to_rgb(images)
    if img_size != 8:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    yt = torch.from_numpy(y)
    return x[idx_train], yt[idx_train], x[idx_test], yt[idx_test]


def _shape_masks(labels: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside-masks (N, H, W) of each image's class in its local (rotated, scaled) coordinates."""
    r = np.sqrt(u * u + v * v)
    m = np.maximum(np.abs(u), np.abs(v))
    masks = {
        "disc": r <= 1.0,
        "ring": (r <= 1.0) & (r >= 0.6),
        "square": m <= 0.85,
        "frame": (m <= 0.9) & (m >= 0.55),
        "triangle": (v >= -0.55) & (v <= 1.0 - np.sqrt(3.0) * np.abs(u) + 0.05),
        "cross": ((np.abs(u) <= 0.3) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.3) & (np.abs(u) <= 1.0)),
    }
    out = np.zeros(u.shape, dtype=bool)
    for k, name in enumerate(SHAPE_CLASSES):
        sel = labels == k
        out[sel] = masks[name][sel]
    return out


def shapes_data(n: int, seed: int, img_size: int = 32, chunk: int = 1000) -> tuple[Tensor, Tensor]:
    """``n`` images (N, 3, S, S) of :data:`SHAPE_CLASSES`, class-balanced (label = i mod 6, then
    shuffled), each shape at random position, scale and rotation in a random colour over a random
    colour background with low-frequency texture and pixel noise. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    k = len(SHAPE_CLASSES)
    labels = rng.permutation(np.arange(n) % k).astype(np.int64)
    hi = 2 * img_size                                                             # supersampled side
    coords = (np.arange(hi) + 0.5) / hi * img_size                                # pixel units
    xs_all = []
    for start in range(0, n, chunk):
        lab = labels[start:start + chunk]
        b = len(lab)
        scale = rng.uniform(0.22, 0.38, size=b) * img_size                        # shape radius in px
        cx = rng.uniform(scale + 1, img_size - scale - 1)
        cy = rng.uniform(scale + 1, img_size - scale - 1)
        theta = rng.uniform(0, 2 * np.pi, size=b)
        dx = coords[None, None, :] - cx[:, None, None]
        dy = coords[None, :, None] - cy[:, None, None]
        c, s = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None]
        u = (c * dx + s * dy) / scale[:, None, None]
        v = (-s * dx + c * dy) / scale[:, None, None]
        mask = _shape_masks(lab, u, v).astype(np.float32)
        mask = mask.reshape(b, img_size, 2, img_size, 2).mean(axis=(2, 4))       # anti-aliased (B, S, S)
        # colours: background and foreground differ by at least 0.4 in mean intensity
        bg = rng.uniform(0.0, 1.0, size=(b, 3))
        delta = rng.uniform(0.4, 0.8, size=(b, 1)) * rng.choice([-1.0, 1.0], size=(b, 1))
        fg = np.clip(bg + delta + rng.normal(0, 0.15, size=(b, 3)), 0.0, 1.0)
        # low-frequency texture: a 4×4 random grid upsampled bilinearly
        grid = torch.from_numpy(rng.normal(0, 1, size=(b, 3, 4, 4)).astype(np.float32))
        tex = F.interpolate(grid, size=(img_size, img_size), mode="bilinear", align_corners=False).numpy()
        amp = rng.uniform(0.03, 0.12, size=(b, 1, 1, 1))
        img = bg[:, :, None, None] * (1 - mask[:, None]) + fg[:, :, None, None] * mask[:, None]
        img = img + amp * tex + rng.normal(0, 0.04, size=img.shape)
        xs_all.append(((np.clip(img, 0.0, 1.0) - 0.5) / 0.5).astype(np.float32))
    x = torch.from_numpy(np.concatenate(xs_all)) if xs_all else torch.zeros(0, 3, img_size, img_size)
    return x, torch.from_numpy(labels)


def balanced_subset(y: Tensor, n: int, seed: int) -> Tensor:
    """Indices of ``n`` training examples, class-balanced (round-robin over classes in a seeded
    per-class order); nested: the first n of a larger subset for the same seed."""
    if n > len(y):
        raise ValueError(f"subset of {n} asked from a pool of {len(y)}")
    g = torch.Generator().manual_seed(10_000 + seed)
    per_class = [idx[torch.randperm(len(idx), generator=g)] for idx in
                 (torch.nonzero(y == c).flatten() for c in torch.unique(y))]
    order = []
    for r in range(max(len(p) for p in per_class)):
        order.extend(int(p[r]) for p in per_class if r < len(p))
    return torch.tensor(order[:n], dtype=torch.long)


# ------------------------------------------------------------------------------------------------
# Models and their cost
# ------------------------------------------------------------------------------------------------

def model_specs(img_size: int, widths: ModelWidths, num_classes: int) -> dict[str, object]:
    """{"vit": ArchSpec, "cnn": ArchSpec} resolved from the registry with this data set's sizes."""
    return {
        "vit": resolve("vit-micro", img_size=img_size, patch_size=widths.vit_patch, d_model=widths.vit_d_model,
                       n_layers=widths.vit_layers, n_heads=widths.vit_heads, d_ff=widths.vit_d_ff,
                       num_classes=num_classes),
        "cnn": resolve("resnet-micro", img_size=img_size, width=widths.cnn_width, n_stages=widths.cnn_stages,
                       blocks=widths.cnn_blocks, num_classes=num_classes),
    }


def model_costs(img_size: int, widths: ModelWidths, num_classes: int) -> dict[str, dict[str, int]]:
    """Per model: params and forward MACs per image, counted (harness.flops) and from the spec's formula."""
    out = {}
    for name, spec in model_specs(img_size, widths, num_classes).items():
        model = spec.build(spec.config).eval()
        counted = count_model(model, torch.zeros(1, 3, img_size, img_size))
        formula = spec.cost(spec.config, Workload(batch_size=1, img_size=img_size))
        out[name] = {"params": count_params(model), "macs": counted.macs, "macs_formula": formula["macs"]}
    return out


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------

def _shift(x: Tensor, px: int, g: torch.Generator) -> Tensor:
    """Random translation by up to ``px`` pixels per image (pad by edge replication, crop)."""
    if px <= 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (px, px, px, px), mode="replicate")
    ox = torch.randint(0, 2 * px + 1, (b,), generator=g)
    oy = torch.randint(0, 2 * px + 1, (b,), generator=g)
    rows = (oy[:, None] + torch.arange(h)[None, :])                                # (B, H)
    cols = (ox[:, None] + torch.arange(w)[None, :])                                # (B, W)
    bi = torch.arange(b)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]       # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


def train_eval(spec, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor,
               setup: Setup, seed: int) -> float:
    """Build ``spec`` from scratch (seeded), train it on (x_train, y_train) with AdamW for
    ``setup.steps_for(n)`` steps, return test accuracy."""
    torch.manual_seed(seed)
    model: nn.Module = spec.build(spec.config)
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1))
    n = len(y_train)
    steps = setup.steps_for(n)
    opt = adamw(model, setup.lr, setup.weight_decay)
    warm = max(1, int(setup.warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_at(t, steps, 1.0, warm))   # × setup.lr
    bs = min(setup.batch, n)
    perm, pos = torch.randperm(n, generator=g), 0
    model.train()
    for _ in range(steps):
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=g), 0
        idx = perm[pos:pos + bs]
        pos += bs
        xb = _shift(x_train[idx], setup.shift_px, g)
        loss = F.cross_entropy(model(xb), y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return evaluate(model, x_test, y_test, setup.eval_batch)


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, batch: int = 500) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, len(y), batch))
    return correct / len(y)


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------

def _load(name: str, setup: Setup) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, ModelWidths, tuple[int, ...]]:
    if name == "digits":
        xtr, ytr, xte, yte = digits_data(setup.digits_img)
        return xtr, ytr, xte, yte, 10, setup.digits_img, setup.digits_models, setup.digits_subsets
    if name == "shapes":
        xtr, ytr = shapes_data(max(setup.shapes_subsets), _SHAPES_TRAIN_SEED, setup.shapes_img)
        xte, yte = shapes_data(setup.shapes_test, _SHAPES_TEST_SEED, setup.shapes_img)
        return xtr, ytr, xte, yte, len(SHAPE_CLASSES), setup.shapes_img, setup.shapes_models, setup.shapes_subsets
    raise ValueError(f"unknown data set {name!r}; expected 'digits' or 'shapes'")


def run(quick: bool = True, seeds: tuple[int, ...] = (0, 1, 2), setup: Setup | None = None) -> dict:
    """Accuracy of the matched-MAC ViT and CNN per data set × subset size × seed.

    Returns ``{"setup": ..., "seeds": [...], "datasets": {name: {"subsets": [n...],
    "acc": {"vit": {str(n): [per-seed]}, "cnn": {...}}, "gap": {str(n): [cnn − vit per seed]},
    "acc_largest": {"vit": [...], "cnn": [...]}, "chance": float, "scale": {...}}}, "scale": {...}}``.
    """
    setup = setup or (QUICK if quick else FULL)
    seeds = tuple(int(s) for s in seeds)
    t_all = time.perf_counter()
    out: dict = {"setup": dataclasses.asdict(setup), "seeds": list(seeds), "datasets": {}}
    scale: dict = {"datasets": {}}
    for name in setup.datasets:
        t0 = time.perf_counter()
        xtr, ytr, xte, yte, k, img, widths, subsets = _load(name, setup)
        specs = model_specs(img, widths, k)
        costs = model_costs(img, widths, k)
        acc = {m: {str(n): [] for n in subsets} for m in specs}
        for n in subsets:
            for seed in seeds:
                idx = balanced_subset(ytr, n, seed)
                for m, spec in specs.items():
                    acc[m][str(n)].append(train_eval(spec, xtr[idx], ytr[idx], xte, yte, setup, seed))
        gap = {str(n): [c - v for c, v in zip(acc["cnn"][str(n)], acc["vit"][str(n)])] for n in subsets}
        largest = str(max(subsets))
        ds_scale = {
            "img_size": img, "num_classes": k, "train_pool": len(ytr), "test_size": len(yte),
            "subsets": list(subsets), "steps": {str(n): setup.steps_for(n) for n in subsets},
            "batch": setup.batch, "models": costs,
            "mac_ratio_vit_over_cnn": costs["vit"]["macs"] / costs["cnn"]["macs"],
            "wall_s": time.perf_counter() - t0,
        }
        out["datasets"][name] = {
            "subsets": list(subsets), "chance": 1.0 / k, "acc": acc, "gap": gap,
            "acc_largest": {m: list(acc[m][largest]) for m in specs}, "scale": ds_scale,
        }
        scale["datasets"][name] = ds_scale
    scale["wall_s"] = time.perf_counter() - t_all
    out["scale"] = scale
    return out
