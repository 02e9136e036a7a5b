"""The one comparison of two timings (harness.analysis.comparison): its levels, its equivalence rule and what it
could see."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.analysis.comparison import (FLOOR, Timing, compare_exact, compare_samples, compare_timings, from_log,
                                         judge, mde)


def _timing(rng: np.random.Generator, processes: int = 1, rounds: int = 4, per: int = 10, scale: float = 1.0,
            sd: float = 0.03, process_sd: float = 0.0) -> Timing:
    samples, counts = [], []
    for _ in range(processes):
        luck = rng.normal(0.0, process_sd)
        for _ in range(rounds):
            samples += list(2e-3 * scale * np.exp(luck + rng.normal(0.0, sd, per)))
            counts.append(per)
    return Timing.of(samples, counts, processes)


@given(st.floats(0.5, 2.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.booleans(), st.floats(0.01, 0.3))
def test_an_interval_that_reaches_past_the_floor_is_never_unchanged(ratio, down, up, significant, floor):
    lo, hi = ratio * math.exp(-down), ratio * math.exp(up)
    verdict = judge(ratio, lo, hi, significant, floor)
    if lo < 1 / (1 + floor) - 1e-9 or hi > 1 + floor + 1e-9:
        assert verdict != "unchanged"
    else:
        assert verdict == "unchanged"


def test_a_point_estimate_within_the_floor_with_a_wide_interval_is_inconclusive():
    """1.017 [0.750, 1.378]: a 38 % slowdown is inside the interval, so nothing is shown."""
    c = from_log(math.log(1.017), math.log(1.378 / 0.750) / (2 * 1.96), math.inf, level="processes", n_a=5, n_b=5)
    assert c.verdict == "inconclusive" and c.mde > 0.38
    assert c.summary.startswith("no regression seen (could see ≥ ")


def test_verdicts_within_one_process():
    rng = np.random.default_rng(5)
    a = 1e-3 * (1 + 0.02 * rng.standard_normal(100))
    slow = compare_samples(a, 1.3e-3 * (1 + 0.02 * rng.standard_normal(100)))
    assert slow.verdict == "regressed" and slow.level == "one process" and slow.ci_low < slow.ratio < slow.ci_high
    assert slow.ratio == pytest.approx(1.3, rel=0.02) and slow.n_a == 100
    assert compare_samples(a, 0.7e-3 * (1 + 0.02 * rng.standard_normal(100))).verdict == "improved"
    same = compare_samples(a, a)
    assert same.verdict == "unchanged" and same.ratio == 1.0 and same.summary == "unchanged within 5 %"
    assert compare_samples(a, a * 1.01).verdict == "unchanged"     # 1 %, tightly known: within the floor


def test_comparison_is_reproducible_and_rejects_empty():
    rng = np.random.default_rng(6)
    a, b = rng.lognormal(0, 0.3, 40), rng.lognormal(0.1, 0.3, 40)
    assert compare_samples(a, b) == compare_samples(a, b)
    with pytest.raises(ValueError):
        compare_samples([], [1.0])
    with pytest.raises(ValueError):
        compare_samples([1.0], [])


@pytest.mark.parametrize("spread", [0.02, 0.1, 0.3])
def test_the_one_process_interval_agrees_with_a_hand_written_percentile_bootstrap(spread: float):
    rng = np.random.default_rng(7)
    a, b = rng.lognormal(0.0, spread, 40), rng.lognormal(0.2, spread, 30)
    got = compare_samples(a, b, n_boot=4000)
    ref = np.random.default_rng(1)
    ratios = [np.median(ref.choice(b, b.size)) / np.median(ref.choice(a, a.size)) for _ in range(4000)]
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    width = hi - lo
    assert abs(got.ci_low - lo) < 0.25 * width and abs(got.ci_high - hi) < 0.25 * width


def test_the_level_is_the_highest_both_sides_allow():
    rng = np.random.default_rng(8)
    five, one = _timing(rng, processes=5, rounds=2), _timing(rng, processes=1, rounds=6)
    assert compare_timings(five, _timing(rng, processes=5, rounds=2)).level == "processes"
    paired = compare_timings(five, _timing(rng, processes=5, rounds=2), paired=True)
    assert paired.level == "processes" and paired.paired and paired.units_text == "5 paired processes"
    assert compare_timings(five, one).level == "rounds"
    assert compare_timings(one, _timing(rng, rounds=6), paired=True).units_text == "6 paired rounds"
    flat = Timing.of(one.samples_s)
    assert compare_timings(flat, one).level == "one process"
    occ = Timing.of(five.samples_s, five.rounds, 5, [[2.0, 2.1], [2.05, 1.98], [2.2, 2.1]])
    over = compare_timings(occ, five)
    assert over.level == "occasions" and over.n_a == 3 and over.units_text == "3 baseline occasions"
    assert compare_timings(occ, five, paired=True).level == "processes"      # side by side: the occasions do not apply
    assert compare_exact(100, 120).level == "exact" and compare_exact(100, 120).verdict == "regressed"
    assert compare_exact(100, 103).verdict == "unchanged" and compare_exact(100, 103).mde == pytest.approx(FLOOR)


def test_mde_never_below_the_floor_and_grows_with_the_spread():
    assert mde(0.0, 10) == pytest.approx(FLOOR)
    assert FLOOR < mde(0.01, 10) < mde(0.05, 10) < mde(0.05, 3)
    assert mde(math.inf, 4) == math.inf


def test_the_inverse_reads_the_same_comparison_the_other_way():
    rng = np.random.default_rng(9)
    c = compare_timings(_timing(rng, processes=5, rounds=2), _timing(rng, processes=5, rounds=2, scale=1.5))
    inv = c.inverse()
    assert c.verdict == "regressed" and inv.verdict == "improved"
    assert inv.ratio == pytest.approx(1 / c.ratio) and inv.ci_low == pytest.approx(1 / c.ci_high)
    assert inv.mde == c.mde and inv.a_ms == c.b_ms
