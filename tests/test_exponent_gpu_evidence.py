"""The one fit-range rule (harness.analysis.fits.fit_scaling) on the first H100 run: a launch-bound floor of ~4.4 ms for
n ≤ 1024 must not flatten the exponent of eager attention (the all-points fit read 0.96 on that run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analysis.fits import fit_loglog, fit_scaling

DATA = json.loads((Path(__file__).parent / "data" / "h100_attention_scaling.json").read_text())


def _xy(line: str, column: int) -> tuple[list[float], list[float]]:
    pts = DATA[line]
    return [p[0] for p in pts], [p[column] for p in pts]


def test_eager_mha_time_exponent_is_fitted_over_the_scaling_regime() -> None:
    x, y = _xy("eager MHA fwd", 1)
    fit = fit_scaling(x, y)
    assert fit is not None
    assert 1.7 <= fit.exponent <= 2.0, str(fit)
    assert fit.x_min >= 2048 and fit.x_max == 16384
    assert [p[0] for p in fit.floor] == [256, 512, 1024]            # the launch-bound floor, reported apart
    assert fit.floor_y == pytest.approx(4.38, abs=0.05)
    naive = fit_loglog(x, y)
    assert naive is not None and naive.exponent < 1.3             # what one fit over every point says


def test_eager_mha_memory_exponent_and_sdpa_stays_below_it() -> None:
    eager = fit_scaling(*_xy("eager MHA fwd", 2))
    sdpa = fit_scaling(*_xy("sdpa MHA fwd", 2))
    assert eager is not None and sdpa is not None
    assert 1.6 <= eager.exponent <= 2.0, str(eager)                # the (h, n, n) scores
    assert sdpa.exponent < 1.0 < eager.fit.ci_low                   # the fused kernel keeps no n² scores
