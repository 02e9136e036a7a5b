"""The two small image sets of the C24 experiment, both offline: the handwritten digits shipped in
``data/digits.csv.gz`` (see data/README.md) with a fixed stratified split, and procedurally drawn
shapes made from a seed; plus the class-balanced training subsets drawn from either."""
from __future__ import annotations

import gzip
import io
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

DIGITS_FILE = "data/digits.csv.gz"        # inside this package: 1,797 rows of 64 pixels (0..16), then the label
DIGITS_SPLIT_SEED = 2024                  # the fixed train/test split, independent of the run seeds
DIGITS_TEST_FRACTION = 0.3
_EPS = 1e-9
SHAPE_CLASSES: tuple[str, ...] = ("disc", "ring", "square", "frame", "triangle", "cross")


# ------------------------------------------------------------------------------------------------
# Digits
# ------------------------------------------------------------------------------------------------

def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images, labels): the shipped digits as int64 arrays of shape (1797, 8, 8), values 0..16, and (1797,)."""
    raw = resources.files("claims.experiments").joinpath(DIGITS_FILE).read_bytes()
    with gzip.open(io.BytesIO(raw), "rt") as fh:
        data = np.loadtxt(fh, delimiter=",", dtype=np.int64, ndmin=2)
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1]


def stratified_split(y: np.ndarray, test_fraction: float = DIGITS_TEST_FRACTION,
                     seed: int = DIGITS_SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices), both sorted: per class a seeded permutation, its first share to test.

    The test set has ⌈test_fraction · N⌉ examples, shared out over the classes by largest remainder
    (each class gets ⌊test_fraction · n_c⌋ or one more), so every class's test share is within one
    example of ``test_fraction``. Deterministic in ``seed``."""
    y = np.asarray(y)
    classes, counts = np.unique(y, return_counts=True)
    exact = test_fraction * counts
    n_test = np.floor(exact + _EPS).astype(np.int64)              # _EPS: 0.07 · 100 is 7.000000000000001
    extra = int(np.ceil(test_fraction * len(y) - _EPS)) - int(n_test.sum())
    n_test[np.argsort(-(exact - n_test), kind="stable")[:extra]] += 1
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:k] for c, k in zip(classes, n_test)])
    mask = np.zeros(len(y), dtype=bool)
    mask[test] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _to_rgb(x: np.ndarray) -> Tensor:
    """(N, S, S) greyscale in [0, 1] → (N, 3, S, S) float32, standardised with fixed constants."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return ((t - 0.5) / 0.5).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


def digits_data(img_size: int = 16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x_train, y_train, x_test, y_test): the fixed stratified 70/30 split of the digits (1,257 / 540),
    upsampled bilinearly to ``img_size``² and replicated to 3 channels (values standardised to mean 0)."""
    images, y = load_digits()
    idx_train, idx_test = stratified_split(y)
    x = _to_rgb(images.astype(np.float32) / 16.0)
    if img_size != 8:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    yt = torch.from_numpy(y)
    return x[idx_train], yt[idx_train], x[idx_test], yt[idx_test]


# ------------------------------------------------------------------------------------------------
# Procedural shapes
# ------------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------------
# Training subsets
# ------------------------------------------------------------------------------------------------

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
