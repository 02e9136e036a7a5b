"""The digits shipped with the C24 experiment (claims/experiments/data/digits.csv.gz): the file is the one
its README describes, it loads to the expected arrays, and the fixed stratified split is what it says."""
from __future__ import annotations

import hashlib
import re
from importlib import resources

import numpy as np
import pytest

from claims.experiments import vision_data as vd

DATA = resources.files("claims.experiments").joinpath("data")


def test_shipped_file_is_the_one_the_readme_names():
    readme = DATA.joinpath("README.md").read_text(encoding="utf-8")
    documented = re.search(r"sha256 `([0-9a-f]{64})`", readme)
    assert documented, "data/README.md names no sha256"
    assert hashlib.sha256(DATA.joinpath("digits.csv.gz").read_bytes()).hexdigest() == documented.group(1)


def test_loaded_arrays_shape_range_and_classes():
    images, labels = vd.load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.dtype == np.int64 and labels.dtype == np.int64
    assert images.min() == 0 and images.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert len(np.unique(images.reshape(len(images), -1), axis=0)) > 1700     # real images, not a constant


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return vd.load_digits()[1]


def test_split_sizes_and_strata(labels):
    train, test = vd.stratified_split(labels)
    assert (len(train), len(test)) == (1257, 540)
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))    # a partition
    per_class, in_test = np.bincount(labels, minlength=10), np.bincount(labels[test], minlength=10)
    assert (in_test > 0).all() and (per_class - in_test > 0).all()
    assert np.all(np.abs(in_test - 0.3 * per_class) < 1.0)


def test_split_is_deterministic_and_seeded(labels):
    a = vd.stratified_split(labels)
    b = vd.stratified_split(labels)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    other = vd.stratified_split(labels, seed=vd.DIGITS_SPLIT_SEED + 1)
    assert len(other[1]) == 540 and not np.array_equal(other[1], a[1])


@pytest.mark.parametrize("n_per_class,fraction",
                         [((7, 5, 3), 0.3), ((10, 10), 0.5), ((1, 2, 9, 4), 0.25), ((50, 50), 0.07)])
def test_split_rounds_by_largest_remainder(n_per_class, fraction):
    y = np.repeat(np.arange(len(n_per_class)), n_per_class)
    _, test = vd.stratified_split(y, fraction, seed=0)
    assert len(test) == -(-round(fraction * 100) * len(y) // 100)       # ⌈fraction · N⌉ in exact arithmetic
    counts = np.bincount(y[test], minlength=len(n_per_class))
    assert np.all(np.abs(counts - fraction * np.array(n_per_class)) < 1.0)
