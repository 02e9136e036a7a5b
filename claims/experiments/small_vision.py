"""C24: a small ViT vs a small CNN of matched forward MACs, trained from scratch on growing subsets.

Two image sets, both available offline (:mod:`claims.experiments.vision_data`): the UCI handwritten
digits shipped with the package and procedurally generated shapes (made from a seed). For every data
set × training subset size × seed × model a fresh model is built from the architecture registry
("vit-micro" and "resnet-micro" with overridden widths) and trained with AdamW under the same step
budget, the same learning-rate schedule and the same (light, translation-only) augmentation; test
accuracy on a fixed held-out set is recorded. The gap CNN − ViT per size per seed lets a caller check
whether the CNN wins at small sizes and whether the gap shrinks as data grows.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claims.experiments.runner import Experiment, Fields, Seeds, sweep, timed
from claims.experiments.train import CPU, adamw, fit, lr_at
from claims.experiments.vision_data import SHAPE_CLASSES, balanced_subset, digits_data, shapes_data
from harness.engine.models import materialize
from harness.instruments.flops import count_model, count_params
from harness.contract.registry import resolve
from harness.contract.spec import Workload

DATA = (
    "Two small image sets, nothing downloaded. (a) The UCI handwritten digits (shipped with the package): "
    "1,797 greyscale 8×8 images of 10 classes, upsampled bilinearly to 16×16 and replicated to 3 channels; "
    "a fixed stratified 30% test split (540 images) and a 1,257-image training pool. (b) Procedurally generated "
    "shapes: 6 classes (disc, ring, filled square, square frame, triangle, cross) drawn at random "
    "position, scale and rotation, in a random colour on a random colour background with low-frequency "
    "texture and pixel noise, rendered at 32×32 (2× supersampled); a fixed 1,000-image test set and a "
    "training pool from a different fixed seed. Models are trained from scratch on class-balanced "
    "subsets of growing size (digits 50–1,257; shapes 100–2,000 in the quick run, up to 8,000 in the "
    "full one; the quick run trains the digits only) — all far below the ~100k-image scale the claim is about; the models have ~0.3–2 M "
    "forward MACs per image and tens of thousands of parameters. On the digits a small Swin (2 stages × 2 "
    "blocks, 4×4 windows, MACs matched) is trained too, on the smallest subset in the quick run. The digits' "
    "smallest subset is trained with 7 more seeds (100…106): 10 per model there."
)

SHAPES_TRAIN_SEED = 1001          # fixed training pool
SHAPES_TEST_SEED = 2002           # fixed held-out test set


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
    swin_patch: int = 2               # Swin ("swin-t" overridden): 2 stages of 2 blocks, 4×4 windows
    swin_embed: int = 8
    swin_heads: int = 2
    swin_window: int = 4


@dataclass(frozen=True)
class Setup:
    """Every size of the experiment. Steps per run: clamp(ceil(epochs · n / batch), min_steps, max_steps)."""

    digits_img: int = 16
    digits_subsets: tuple[int, ...] = (50, 150, 500, 1257)
    digits_models: ModelWidths = ModelWidths(cnn_width=5, cnn_stages=3, cnn_blocks=1)
    swin_datasets: tuple[str, ...] = ("digits",)     # Swin is many small ops: ~5× the ViT's step time here
    swin_sizes: int = 1                               # trained on the smallest ``swin_sizes`` subsets only
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
    extra_seeds: int = 0              # more seeds (EXTRA_SEED0, EXTRA_SEED0 + 1, …) at the smallest subset

    def steps_for(self, n: int) -> int:
        return int(min(self.max_steps, max(self.min_steps, math.ceil(self.epochs * n / self.batch))))


EXTRA_SEED0 = 100                 # the extra seeds' numbers: distinct from the caller's seeds (0, 1, 2)
# QUICK trains the digits only (the shapes, read by no rule, are in FULL) and spends part of the time saved on 7
# more seeds at the digits' smallest subset, where most of C24's rules read the accuracies: 10 seeds there
# (150 steps per model; the largest subset's 590 steps per model would cost more than the shapes saved).
QUICK = Setup(datasets=("digits",), extra_seeds=7)
FULL = Setup(shapes_subsets=(100, 500, 2000, 8000), epochs=40.0, min_steps=300, max_steps=2000, swin_sizes=4,
             extra_seeds=7)


# ------------------------------------------------------------------------------------------------
# Models and their cost
# ------------------------------------------------------------------------------------------------

def model_specs(img_size: int, widths: ModelWidths, num_classes: int, swin: bool = False) -> dict[str, object]:
    """{"vit": ArchSpec, "cnn": ArchSpec[, "swin": ArchSpec]} resolved from the registry with this data set's
    sizes (forward MACs matched within ~25 %: see the record's ``scale.models``)."""
    out = {
        "vit": resolve("vit-micro", img_size=img_size, patch_size=widths.vit_patch, d_model=widths.vit_d_model,
                       n_layers=widths.vit_layers, n_heads=widths.vit_heads, d_ff=widths.vit_d_ff,
                       num_classes=num_classes),
        "cnn": resolve("resnet-micro", img_size=img_size, width=widths.cnn_width, n_stages=widths.cnn_stages,
                       blocks=widths.cnn_blocks, num_classes=num_classes),
    }
    if swin:
        out["swin"] = resolve("swin-t", img_size=img_size, patch_size=widths.swin_patch, embed_dim=widths.swin_embed,
                              depths=(2, 2), n_heads=widths.swin_heads, window_size=widths.swin_window,
                              num_classes=num_classes)
    return out


def model_costs(img_size: int, widths: ModelWidths, num_classes: int, swin: bool = False) -> dict[str, dict[str, int]]:
    """Per model: params and forward MACs per image, counted (harness.instruments.flops) and from the spec's formula."""
    out = {}
    for name, spec in model_specs(img_size, widths, num_classes, swin).items():
        model = materialize(spec, Workload(), CPU).eval()
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


def _batches(n: int, bs: int, g: torch.Generator) -> Iterator[Tensor]:
    """Index batches of ``bs`` from epoch after epoch of seeded permutations of range(n) (a short tail dropped)."""
    while True:
        perm = torch.randperm(n, generator=g)
        for pos in range(0, n - bs + 1, bs):
            yield perm[pos:pos + bs]


def train_eval(spec, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor,
               setup: Setup, seed: int) -> float:
    """Build ``spec`` from scratch (seeded), train it on (x_train, y_train) with AdamW for
    ``setup.steps_for(n)`` steps, each batch randomly shifted; return test accuracy."""
    model = materialize(spec, Workload(), CPU, seed=seed)
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1))
    n = len(y_train)
    steps = setup.steps_for(n)
    warm = max(1, int(setup.warmup_frac * steps))
    batches = _batches(n, min(setup.batch, n), g)

    def loss_at(step: int) -> Tensor:
        idx = next(batches)
        return F.cross_entropy(model(_shift(x_train[idx], setup.shift_px, g)), y_train[idx])

    fit(model, adamw(model, setup.lr, setup.weight_decay), steps, lambda t: lr_at(t, steps, setup.lr, warm), loss_at)
    return evaluate(model, x_test, y_test, setup.eval_batch)


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, batch: int = 500) -> float:
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, len(y), batch))
    return correct / len(y)


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------

@lru_cache(maxsize=2)
def load(name: str, setup: Setup) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, ModelWidths, tuple[int, ...]]:
    """(x_train, y_train, x_test, y_test, classes, img_size, widths, subsets) of one data set (kept: every trial
    of a process reads the same tensors, never writes them)."""
    if name == "digits":
        xtr, ytr, xte, yte = digits_data(setup.digits_img)
        return xtr, ytr, xte, yte, 10, setup.digits_img, setup.digits_models, setup.digits_subsets
    if name == "shapes":
        xtr, ytr = shapes_data(max(setup.shapes_subsets), SHAPES_TRAIN_SEED, setup.shapes_img)
        xte, yte = shapes_data(setup.shapes_test, SHAPES_TEST_SEED, setup.shapes_img)
        return xtr, ytr, xte, yte, len(SHAPE_CLASSES), setup.shapes_img, setup.shapes_models, setup.shapes_subsets
    raise ValueError(f"unknown data set {name!r}; expected 'digits' or 'shapes'")


def subset_trial(name: str, setup: Setup, n: int, seed: int) -> Fields:
    """Every model of data set ``name`` trained on its balanced subset of ``n`` images drawn with ``seed``: per
    model, the test accuracy (Swin only at the smallest ``setup.swin_sizes`` subsets). Module-level: a worker
    process runs it, loading the data itself."""
    xtr, ytr, xte, yte, k, img, widths, subsets = load(name, setup)
    with_swin = name in setup.swin_datasets
    swin_at = set(sorted(subsets)[:setup.swin_sizes]) if with_swin else set()
    idx = balanced_subset(ytr, n, seed)
    return {m: train_eval(spec, xtr[idx], ytr[idx], xte, yte, setup, seed)
            for m, spec in model_specs(img, widths, k, with_swin).items() if m != "swin" or n in swin_at}


def dataset(name: str, setup: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    """One data set: per model, per subset size, the test accuracy per seed; the gap CNN − ViT; its scale."""
    _, ytr, _, yte, k, img, widths, subsets = load(name, setup)
    with_swin = name in setup.swin_datasets
    specs = model_specs(img, widths, k, with_swin)
    costs = model_costs(img, widths, k, with_swin)
    trial = partial(subset_trial, name, setup)
    runs = sweep({str(n): n for n in subsets}, seeds, trial)             # {str(n): {model: [per seed]}}
    extra = tuple(range(EXTRA_SEED0, EXTRA_SEED0 + setup.extra_seeds))
    seeds_at = {str(n): list(seeds) for n in subsets}
    for n in (min(subsets),) if extra else ():
        more = sweep({str(n): n}, extra, trial)[str(n)]                   # appended after the caller's seeds
        runs[str(n)] = {m: list(runs[str(n)][m]) + list(more[m]) for m in runs[str(n)]}
        seeds_at[str(n)] += list(extra)
    acc = {m: {n: runs[n][m] for n in runs if m in runs[n]} for m in specs}
    gap = {n: [c - v for c, v in zip(acc["cnn"][n], acc["vit"][n])] for n in runs}
    largest = str(max(subsets))
    scale = {"img_size": img, "num_classes": k, "train_pool": len(ytr), "test_size": len(yte),
             "subsets": list(subsets), "steps": {str(n): setup.steps_for(n) for n in subsets},
             "batch": setup.batch, "models": costs,
             "mac_ratio_vit_over_cnn": costs["vit"]["macs"] / costs["cnn"]["macs"]}
    return {"subsets": list(subsets), "chance": 1.0 / k, "acc": acc, "gap": gap, "seeds_at": seeds_at,
            "test_size": len(yte),
            "acc_largest": {m: list(acc[m][largest]) for m in specs if largest in acc[m]}}, scale


def measure(setup: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    """Per data set (``setup.datasets``) the fields of :func:`dataset`, its scale alongside (also
    gathered under the record's ``scale``) with the seconds it took."""
    datasets, scales = {}, {}
    for name in setup.datasets:
        (fields, scale), seconds = timed(dataset, name, setup, seeds)
        scales[name] = {**scale, "wall_seconds": seconds}
        datasets[name] = {**fields, "scale": scales[name]}
    return {"datasets": datasets}, {"datasets": scales}


EXPERIMENT = Experiment("C24", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
