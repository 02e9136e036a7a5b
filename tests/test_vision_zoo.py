"""suites/vision_zoo.toml: it loads (full and --quick), every line's architecture resolves, and each model's MACs
grow with the image as its design says.

The MAC exponent: each line is resolved as a run resolves it (the suite with ``img_size`` pinned by ``--set``, so
the size goes into configs that have one: ViT's position table, timm's ``img_size=``, CoAtNet's bias tables),
counted on fake tensors at three sides, and ``log MACs`` is fitted against ``log pixels`` (pixels = side²):

* convolutions (ResNet-50, ConvNeXt-T, LR-Net-50's local relation windows): every layer's work is per output
  pixel → exponent 1 (± 0.02; the classifier head is the only constant term);
* windowed attention (Swin-T: 7×7, Swin V2-T: 8×8 windows): attention per window is fixed, the number of
  windows ∝ pixels → exponent 1 (± 0.03) at sides where every stage's grid is whole windows (multiples of
  32·M: 224·k for Swin-T, 256·k for Swin V2-T; elsewhere the grids are padded);
* global or pooling attention: ViT-S/16 (N = pixels/16² tokens, QKᵀ and AV ∝ N² beside the ∝ N projections
  and MLP), CoAtNet-0 (global attention over its last two stages' maps), MViT v2-T (queries ∝ N, and keys and
  values pooled with fixed strides, so also ∝ N: QKᵀ ∝ N² with a smaller factor): MACs = a·P + b·P², whose
  local exponent 1 + b·P/(a + b·P) lies in (1, 2) and grows with the image — checked as a fitted exponent
  above 1.02 and below 2, with the exponent over the larger pair of sides above the one over the smaller pair.
"""
from __future__ import annotations

from functools import cache

import numpy as np
import pytest

pytest.importorskip("timm")            # the suite's MViT v2 line is timm's

from harness.contract import registry# noqa: E402
from harness.contract.suite import load_suite  # noqa: E402
from tests.helpers import counted_cost  # noqa: E402

SUITE = "suites/vision_zoo.toml"
LINES = ("resnet50", "lrnet-50", "convnext-t", "swin-t", "swin-v2-t", "vit-s16", "mvit-v2-t", "coatnet-0")
LINEAR = {"resnet50": 0.02, "lrnet-50": 0.02, "convnext-t": 0.02, "swin-t": 0.03, "swin-v2-t": 0.03}
SUPERLINEAR = ("vit-s16", "mvit-v2-t", "coatnet-0")
SIDES = {"swin-v2-t": (256, 512, 768)}          # whole 8×8 windows at every stage
DEFAULT_SIDES = (224, 448, 672)                  # whole 7×7 windows for Swin-T; multiples of 32 and of 16


def test_suite_loads_full_and_quick():
    full, quick = load_suite(SUITE), load_suite(SUITE, quick=True)
    assert full.name == quick.name == "vision_zoo"
    assert "timm" in full.description and "pip install" in full.description
    for suite, sides in ((full, [160, 224, 288]), (quick, [128, 192])):
        assert tuple(dict.fromkeys(c.line for c in suite.cases)) == LINES
        assert sorted({c.workload.img_size for c in suite.cases}) == sides
        assert len(suite.cases) == len(LINES) * len(sides)
        assert {(c.workload.batch_size, c.workload.dtype, c.workload.mode) for c in suite.cases} == {(1, "fp32", "fwd")}
        assert {c.metrics for c in suite.cases} == {("latency", "memory", "flops")}
    arch = {c.line: c.arch for c in full.cases}
    assert arch["swin-v2-t"] == "torchvision:swin_v2_t" and arch["mvit-v2-t"] == "timm:mvitv2_tiny"


@cache
def _cases(side: int) -> dict[str, object]:
    """The suite's case per line with img_size pinned to ``side`` (``bench run --set img_size=SIDE``)."""
    return {c.line: c for c in load_suite(SUITE, sets={"img_size": side}).cases}


def _macs(line: str, side: int) -> int:
    case = _cases(side)[line]
    spec = registry.resolve(case.arch, **dict(case.overrides))
    return counted_cost(spec, case.workload)[1]


@pytest.mark.parametrize("line", LINES)
def test_every_line_resolves_at_every_size(line):
    """Every line's architecture resolves with the suite's sizes (which also checks they pass its config rules)."""
    for quick in (False, True):
        for case in (c for c in load_suite(SUITE, quick=quick).cases if c.line == line):
            spec = registry.resolve(case.arch, **dict(case.overrides))
            if hasattr(spec.config, "img_size"):
                assert spec.config.img_size == case.workload.img_size


@pytest.mark.parametrize("line", LINES)
def test_mac_exponent_in_pixels_matches_the_design(line):
    sides = SIDES.get(line, DEFAULT_SIDES)
    macs = [_macs(line, s) for s in sides]
    log_pixels, log_macs = np.log(np.square(sides)), np.log(macs)
    exponent = float(np.polyfit(log_pixels, log_macs, 1)[0])
    if line in LINEAR:
        assert abs(exponent - 1) <= LINEAR[line], f"{line}: MACs ∝ pixels^{exponent:.3f}, expected 1"
    else:
        local = np.diff(log_macs) / np.diff(log_pixels)      # exponent over (s1, s2) and over (s2, s3)
        assert 1.02 < exponent < 2, f"{line}: MACs ∝ pixels^{exponent:.3f}, expected in (1, 2)"
        assert local[1] > local[0], f"{line}: local exponents {local} should grow with the image"
