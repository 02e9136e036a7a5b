"""Known inputs -> known outputs for harness.analysis.stats."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.analysis.stats import (NOISY_REL_IQR, Fit, fit_loglog, fit_scaling, median_ci_indices, summarize,
                           top_slope)


def test_summarize_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.lognormal(mean=-6.0, sigma=0.2, size=101)  # seconds, ~2.5 ms
    s = summarize(x.tolist())
    ms = x * 1e3
    q1, med, q3, p90, p99 = np.percentile(ms, [25, 50, 75, 90, 99])
    assert s["median_ms"] == pytest.approx(med)
    assert s["mean_ms"] == pytest.approx(ms.mean())
    assert s["stdev_ms"] == pytest.approx(ms.std(ddof=1))
    assert s["min_ms"] == pytest.approx(ms.min()) and s["max_ms"] == pytest.approx(ms.max())
    assert (s["q1_ms"], s["q3_ms"]) == pytest.approx((q1, q3))
    assert s["iqr_ms"] == pytest.approx(q3 - q1)
    assert (s["p90_ms"], s["p99_ms"]) == pytest.approx((p90, p99))
    assert s["rel_iqr"] == pytest.approx((q3 - q1) / med)
    assert s["n_samples"] == 101.0


def test_summarize_known_values() -> None:
    s = summarize([0.001, 0.002, 0.003, 0.004, 0.005])
    assert s["median_ms"] == pytest.approx(3.0)
    assert s["q1_ms"] == pytest.approx(2.0) and s["q3_ms"] == pytest.approx(4.0)
    assert s["rel_iqr"] == pytest.approx(2.0 / 3.0)
    assert s["noisy"] == 1.0
    # n = 5 is too small for a 95% order-statistic CI: falls back to min/max
    assert (s["ci_low_ms"], s["ci_high_ms"]) == pytest.approx((1.0, 5.0))


def test_summarize_single_sample_and_quiet_flag() -> None:
    s = summarize([0.002])
    assert s["median_ms"] == s["min_ms"] == s["max_ms"] == s["ci_low_ms"] == pytest.approx(2.0)
    assert s["stdev_ms"] == 0.0 and s["noisy"] == 0.0
    quiet = summarize([0.01 * (1 + 0.001 * i) for i in range(50)])
    assert quiet["rel_iqr"] < NOISY_REL_IQR and quiet["noisy"] == 0.0


def test_summarize_empty_raises() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_median_ci_indices_textbook_value() -> None:
    # Classic table value: for n = 100 the 95% CI of the median is x_(40)..x_(61) (1-based).
    assert median_ci_indices(100) == (39, 60)
    assert median_ci_indices(5) == (0, 4)
    assert median_ci_indices(1) == (0, 0)


def test_ci_contains_median_and_widens_with_noise() -> None:
    rng = np.random.default_rng(2)
    base = 1e-3
    quiet = base * (1 + 0.01 * rng.standard_normal(200))
    noisy = base * (1 + 0.20 * rng.standard_normal(200))
    sq, sn = summarize(quiet), summarize(noisy)
    for s in (sq, sn):
        assert s["ci_low_ms"] <= s["median_ms"] <= s["ci_high_ms"]
    assert (sn["ci_high_ms"] - sn["ci_low_ms"]) > 5 * (sq["ci_high_ms"] - sq["ci_low_ms"])


def test_ci_coverage_is_about_95_percent() -> None:
    rng = np.random.default_rng(3)
    hits = 0
    trials = 400
    for _ in range(trials):
        x = rng.exponential(1.0, size=60)  # true median ln 2
        s = summarize(x)
        hits += s["ci_low_ms"] / 1e3 <= math.log(2) <= s["ci_high_ms"] / 1e3
    assert 0.92 <= hits / trials <= 0.995


def test_fit_loglog_exact_power_law() -> None:
    x = [1, 2, 4, 8, 16, 32]
    y = [3 * v**2 for v in x]
    fit = fit_loglog(x, y)
    assert isinstance(fit, Fit)
    assert fit.exponent == pytest.approx(2.0, abs=1e-12)
    assert fit.intercept == pytest.approx(math.log(3.0))
    assert fit.r2 == pytest.approx(1.0)
    assert fit.n == 6
    assert fit.ci_low == pytest.approx(2.0) and fit.ci_high == pytest.approx(2.0)


def test_fit_loglog_noisy_ci_contains_truth() -> None:
    rng = np.random.default_rng(4)
    x = np.geomspace(64, 4096, 12)
    y = 1e-6 * x**1.5 * np.exp(0.05 * rng.standard_normal(x.size))
    fit = fit_loglog(x, y)
    assert fit is not None
    assert fit.ci_low < 1.5 < fit.ci_high
    assert fit.ci_high - fit.ci_low < 0.2


def test_fit_loglog_drops_bad_points_and_edge_cases() -> None:
    fit = fit_loglog([0, 1, 2, 4, float("nan"), 8], [5, 1, 2, 4, 1, -1])
    assert fit is not None and fit.n == 3 and fit.exponent == pytest.approx(1.0)
    two = fit_loglog([1, 2], [1, 4])
    assert two is not None and two.exponent == pytest.approx(2.0)
    assert math.isnan(two.ci_low) and math.isnan(two.ci_high)
    assert fit_loglog([1], [1]) is None
    assert fit_loglog([2, 2, 2], [1, 2, 3]) is None
    assert fit_loglog([], []) is None


NS = [256, 512, 1024, 2048, 4096, 8192, 16384]


def test_fit_scaling_leaves_a_launch_bound_floor_out():
    # the H100's eager attention: flat ~4.4 ms while launch-bound, then ~n^2 (evidence, attention_scaling fp32)
    ys = [4.48, 4.37, 4.38, 6.39, 18.55, 67.48, 228.54]
    fit = fit_scaling(NS, ys)
    assert fit.x_min == 2048 and [p[0] for p in fit.floor] == [256, 512, 1024]
    assert 1.5 < fit.fit.ci_low and fit.exponent > 1.7 and fit.fit.ci_high > 1.7
    assert fit.floor_y == pytest.approx(4.38)
    assert fit_loglog(NS, ys).exponent < 1.0              # what fitting every point said


def test_fit_scaling_keeps_every_point_of_a_clean_power_law_and_of_a_flat_metric():
    square = fit_scaling(NS, [3e-6 * n * n for n in NS])
    assert square.floor == () and square.x_min == 256 and square.exponent == pytest.approx(2.0)
    flat = fit_scaling(NS, [5.0 + 1e-6 * n for n in NS])
    assert flat.floor == () and abs(flat.exponent) < 0.01


@given(st.floats(0.5, 3.0), st.floats(1e-3, 10.0), st.floats(0.0, 50.0))
@example(2.0, 1e-3, 50.0)
def test_fit_scaling_recovers_the_exponent_above_any_floor(k: float, c: float, floor: float):
    ys = [floor + c * (n / 256) ** k for n in NS]
    fit = fit_scaling(NS, ys)
    assert fit is not None and fit.x_max == NS[-1]
    if fit.floor:                       # what is left out is where the floor still counts
        assert floor > 0
    top = math.log(ys[-1] / ys[-2]) / math.log(2)
    assert fit.exponent <= k + 1e-9 and fit.exponent >= min(top, k) - 0.35 * k


def test_top_slope_is_the_last_segment():
    assert top_slope([1, 2, 4], [1, 4, 32]) == pytest.approx(3.0)
    assert top_slope([1], [1]) is None


def test_the_special_functions_a_worker_uses_equal_scipy_stats_exactly() -> None:
    """harness.analysis.stats calls scipy.special directly (a worker then never imports scipy.stats): the values
    must be the very ones scipy.stats gives, bit for bit."""
    from scipy import stats as sps

    from harness.analysis.stats import _binom_cdf_half, _t_ppf
    for n in (*range(1, 200), 500, 1000, 4096):
        assert np.array_equal(_binom_cdf_half(n), sps.binom.cdf(np.arange(n), n, 0.5)), n
    for dof in (1, 2, 3, 5, 9, 30, 100, 1000):
        for q in (0.9, 0.95, 0.975, 0.995):
            assert _t_ppf(q, dof) == float(sps.t.ppf(q, dof)), (q, dof)


def test_a_worker_summarizes_without_importing_scipy_stats() -> None:
    """The worker's imports and its per-case summary leave scipy.stats unimported (0.6 s at every worker start)."""
    import subprocess
    import sys
    code = ("import sys; import harness.executors.process; from harness.analysis.stats import summarize_rounds; "
            "summarize_rounds([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 3]); print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
