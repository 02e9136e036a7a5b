"""C24 experiment (small-data ViT vs CNN): data generators, matched cost, the record's structure, a learning check.
The digits file and its split alone: tests/test_exp_digits.py."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from claims.experiments import small_vision as sv
from claims.experiments import vision_data as vd


def test_digits_split_fixed_stratified_and_shaped():
    xtr, ytr, xte, yte = vd.digits_data(16)
    assert xtr.shape == (1257, 3, 16, 16) and xte.shape == (540, 3, 16, 16)
    assert ytr.shape == (1257,) and yte.shape == (540,) and ytr.dtype == torch.int64
    assert torch.equal(xtr[:, 0], xtr[:, 1]) and torch.equal(xtr[:, 0], xtr[:, 2])     # grey replicated
    counts = torch.bincount(yte, minlength=10)
    assert counts.min() >= 50 and counts.max() <= 56                                    # stratified 30%
    assert -1.0 - 1e-6 <= float(xtr.min()) and float(xtr.max()) <= 1.0 + 1e-6
    again = vd.digits_data(16)
    assert torch.equal(again[0], xtr) and torch.equal(again[3], yte)


def test_shapes_deterministic_balanced_and_shaped():
    x, y = vd.shapes_data(60, seed=5, img_size=32)
    assert x.shape == (60, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (60,)
    assert torch.equal(torch.bincount(y, minlength=6), torch.full((6,), 10))
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    x2, y2 = vd.shapes_data(60, seed=5, img_size=32)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = vd.shapes_data(60, seed=6, img_size=32)
    assert not torch.equal(x, x3)
    # the shape is visible: the image varies more than pure pixel noise would
    assert float(x.std(dim=(1, 2, 3)).min()) > 0.1


def test_shape_masks_match_their_labels():
    # probe points (u, v) in local coordinates: origin, (0.8, 0), (0.7, 0.7), (0, -0.8)
    u = np.array([0.0, 0.8, 0.7, 0.0])[None, None, :].repeat(6, 0)
    v = np.array([0.0, 0.0, 0.7, -0.8])[None, None, :].repeat(6, 0)
    m = vd._shape_masks(np.arange(6), u, v)[:, 0, :]
    expected = {  # origin, (0.8,0), (0.7,0.7), (0,-0.8)
        "disc": [1, 1, 1, 1], "ring": [0, 1, 1, 1], "square": [1, 1, 1, 1],
        "frame": [0, 1, 1, 1], "triangle": [1, 0, 0, 0], "cross": [1, 1, 0, 1],
    }
    for k, name in enumerate(vd.SHAPE_CLASSES):
        assert m[k].astype(int).tolist() == expected[name], name


def test_balanced_subset_nested_deterministic():
    y = torch.arange(300) % 10
    a = vd.balanced_subset(y, 50, seed=0)
    assert torch.equal(torch.bincount(y[a], minlength=10), torch.full((10,), 5))
    assert torch.equal(vd.balanced_subset(y, 120, seed=0)[:50], a)
    assert torch.equal(vd.balanced_subset(y, 50, seed=0), a)
    assert not torch.equal(vd.balanced_subset(y, 50, seed=1), a)
    with pytest.raises(ValueError):
        vd.balanced_subset(y, 301, seed=0)


@pytest.mark.parametrize("setup", [sv.QUICK, sv.FULL], ids=["quick", "full"])
def test_vit_and_cnn_macs_matched(setup):
    for img, widths, k in ((setup.digits_img, setup.digits_models, 10),
                           (setup.shapes_img, setup.shapes_models, len(vd.SHAPE_CLASSES))):
        costs = sv.model_costs(img, widths, k)
        for c in costs.values():
            assert c["macs"] == c["macs_formula"] > 0
        ratio = costs["vit"]["macs"] / costs["cnn"]["macs"]
        assert 0.75 <= ratio <= 1.25, (img, ratio)


TINY = dataclasses.replace(sv.QUICK, digits_subsets=(20, 40), shapes_subsets=(12, 24), shapes_test=30,
                           shapes_img=16, batch=8, min_steps=2, max_steps=2, datasets=("digits", "shapes"),
                           extra_seeds=0)


def test_tiny_run_structure_and_determinism():
    seeds = (0, 1)
    r = sv.EXPERIMENT.run(seeds=seeds, setup=TINY)
    json.dumps(r)
    assert r["claim"] == "C24" and r["setup"] == dataclasses.asdict(TINY)
    assert r["seeds"] == [0, 1] and set(r["datasets"]) == {"digits", "shapes"}
    for name, subsets in (("digits", (20, 40)), ("shapes", (12, 24))):
        d = r["datasets"][name]
        assert d["subsets"] == list(subsets)
        for m in ("vit", "cnn"):
            assert set(d["acc"][m]) == {str(n) for n in subsets}
            for accs in d["acc"][m].values():
                assert len(accs) == len(seeds) and all(0.0 <= a <= 1.0 for a in accs)
            assert d["acc_largest"][m] == d["acc"][m][str(max(subsets))]
        for n in subsets:
            assert d["gap"][str(n)] == pytest.approx(
                [c - v for c, v in zip(d["acc"]["cnn"][str(n)], d["acc"]["vit"][str(n)])])
        s = d["scale"]
        assert s == r["scale"]["datasets"][name] and s["wall_seconds"] > 0
        assert s["steps"] == {str(n): 2 for n in subsets} and s["test_size"] == (540 if name == "digits" else 30)
        assert {"params", "macs"} <= set(s["models"]["vit"]) and s["models"]["cnn"]["macs"] > 0
    assert r["scale"]["wall_seconds"] > 0 and r["scale"]["datasets"]["shapes"]["img_size"] == 16
    again = sv.run(seeds=seeds, setup=dataclasses.replace(TINY, datasets=("shapes",)))
    assert again["datasets"]["shapes"]["acc"] == r["datasets"]["shapes"]["acc"]


def test_unknown_dataset_is_refused():
    with pytest.raises(ValueError, match="unknown data set"):
        sv.run(seeds=(0,), setup=dataclasses.replace(TINY, datasets=("cifar",)))


def test_cnn_learns_digits_with_small_budget():
    xtr, ytr, xte, yte = vd.digits_data(16)
    spec = sv.model_specs(16, sv.QUICK.digits_models, 10)["cnn"]
    setup = dataclasses.replace(sv.QUICK, min_steps=200, max_steps=200, batch=32)
    acc = sv.train_eval(spec, xtr, ytr, xte, yte, setup, seed=0)
    assert acc > 0.7
