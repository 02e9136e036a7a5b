"""Affine costs fitted as affine: an exact count affine in n gets its exact slope (the marginal cost per token) and
the exponent 1 above its floor; a measured cost with a floor gets its marginal cost with an interval and the
exponent of what grows above the floor (floor + slope·n^k); the headline, the claims and the report read that
one fit; a contrast whose interval holds 1 is undecided; a run measured on a busy machine says so in its
headline."""
from __future__ import annotations

import math

import numpy as np
import pytest

from claims.probes import exponent
from harness.contract.records import CaseRecord
from harness.analysis.fits import AffineFit, ScalingFit, cost_exponent, fit_affine, fit_cost, fit_floor_power, fit_scaling
from reports.findings import Ratio, findings
from reports.sentences import _times, headline_lines

# A decode step's MACs at batch 8 on the H100 (evidence h100-2026-11-25, kv-long.sqlite, "MHA cache b=8"): the
# weights once plus 49,152 MACs per context token. The power law of the old fit read `n^0.66 [-0.38, 1.71]`.
KV_NS = [512, 2048, 8192, 32768]
KV_FLOOR, KV_SLOPE = 184_598_528, 49_152
QUICK_NS = [64, 256, 1024, 2048]


def rec(n: int, line: str = "MHA cache b=8", **metrics: float) -> CaseRecord:
    return CaseRecord(f"{line}-{n}", "kv_cache", line, "decode-step-small", "ok", workload={"seq_len": n},
                      metrics=metrics)


def test_an_exact_affine_count_gets_its_exact_slope_and_exponent_1_above_its_floor():
    macs = [float(KV_FLOOR + KV_SLOPE * n) for n in KV_NS]
    fit = fit_affine(KV_NS, macs, exact=True)
    assert isinstance(fit, AffineFit) and fit.exact
    assert fit.slope == KV_SLOPE and fit.base == KV_FLOOR
    # no wider than the rounding: each end count ±0.5 (plus float precision) moves the slope by ≤ 1/Δn
    assert fit.slope_hi - fit.slope_lo <= 2.01 / (KV_NS[-1] - KV_NS[0])
    assert fit.exponent == 1.0 and str(fit.power) == "1.00"    # affine within rounding: k = 1, no noise interval
    assert fit.floor_share(KV_NS[-1]) > 0.10                   # the floor is felt at every n ...
    old = fit_scaling(KV_NS, macs)                             # ... so a power law of the whole cost reads far from 1
    assert old.exponent < 0.8
    assert isinstance(fit_cost(KV_NS, macs, exact=True), AffineFit)


def test_the_quick_cpu_kv_cache_shape_is_affine_too():
    """`bench run kv_cache --quick` on the CPU printed `MACs ∝ n^0.09 [-0.01, 0.19]` (2 layers: the floor dominates)."""
    macs = [float(50_000_000 + 2_048 * n) for n in QUICK_NS]
    fit = fit_cost(QUICK_NS, macs, exact=True)
    assert isinstance(fit, AffineFit) and fit.slope == 2_048 and fit.exponent == 1.0


def test_an_exact_count_off_the_line_by_more_than_rounding_is_not_affine():
    ns = [512, 1024, 2048, 4096]
    quadratic = [float(n * n * 64 + n * 512 * 512 + 1_000_000) for n in ns]     # attention: n²·d + n·d² + floor
    assert fit_affine(ns, quadratic, exact=True) is None
    assert isinstance(fit_cost(ns, quadratic, exact=True), ScalingFit)
    off_by_one = [float(KV_FLOOR + KV_SLOPE * n) for n in KV_NS]
    off_by_one[1] += 2.0                                      # beyond ±0.5 rounding at each end
    assert fit_affine(KV_NS, off_by_one, exact=True) is None


def test_a_measured_affine_cost_gets_its_marginal_cost_with_an_interval():
    """Over 100 noisy sweeps (1 % noise) of a 1 ms floor + 0.2 µs per token: the affine model is accepted nearly
    always (the quadratic test rejects ~5 % by design), its 95 % slope interval covers the truth about 95 % of
    the time, and the exponent above the floor (floor + slope·n^k) finds k = 1 within its interval about as often."""
    ns = np.array([256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    longer = np.array([*ns, 65536, 131072, 262144])
    floor_ms, per_token_ms = 1.0, 2e-4
    fits, past = [], []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        fits.append(fit_affine(ns, (floor_ms + per_token_ms * ns) * rng.normal(1.0, 0.01, ns.size)))
        past.append(fit_affine(longer, (floor_ms + per_token_ms * longer) * rng.normal(1.0, 0.01, longer.size)))
    ok = [f for f in fits if f is not None]
    assert len(ok) >= 85 and all(not f.exact and f.power is not None for f in ok)
    assert sum(f.power.ci_low <= 1.0 <= f.power.ci_high for f in ok) >= 0.85 * len(ok)
    assert sum(f.slope_lo <= per_token_ms <= f.slope_hi for f in ok) >= 0.85 * len(ok)
    assert sum(f.base_lo <= floor_ms <= f.base_hi for f in ok) >= 0.85 * len(ok)
    assert np.median([(f.slope_hi - f.slope_lo) / per_token_ms for f in ok]) < 0.2
    ok_past = [f for f in past if f is not None]
    assert len(ok_past) >= 85
    assert all(abs(f.power.exponent - 1) < 0.15 for f in ok_past)


def test_a_bend_or_a_flat_metric_is_not_called_affine():
    ns = np.array([512, 1024, 2048, 4096, 8192])
    assert fit_affine(ns, 1.0 + 1e-7 * ns.astype(float) ** 2) is None           # quadratic above a floor
    assert fit_affine(ns, [2.0, 2.01, 1.99, 2.0, 2.02]) is None                 # flat: no marginal cost
    assert fit_affine(ns[:3], [1.0, 1.5, 2.5]) is None                          # 3 measured sizes cannot tell


@pytest.mark.parametrize("k", [1.0, 2.0])
def test_floor_power_recovers_the_exponent_above_a_floor(k):
    rng = np.random.default_rng(3)
    ns = np.array([1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
    ys = (0.5 + 0.5 * (ns / 4096) ** k) * rng.normal(1.0, 0.01, ns.size)   # floor = growing part at n = 4096
    fp = fit_floor_power(ns, ys)
    assert fp is not None and fp.k_lo <= k <= fp.k_hi and fp.k_hi - fp.k_lo < 0.5
    assert abs(fp.floor - 0.5) < 0.1
    assert fit_scaling(ns, ys).exponent < k - 0.1             # the log-log fit of the whole cost biases low


def test_claims_read_the_exponent_above_the_floor():
    exact = [rec(n, macs=float(KV_FLOOR + KV_SLOPE * n)) for n in KV_NS]
    f = exponent(exact, "seq_len", "macs")
    assert (f.value, f.lo, f.hi) == (1.0, 1.0, 1.0) and "exact count, affine" in f.note
    # the H100's SDPA activation peak vs n: a floor plus a linear part (C08: "fused attention's memory ∝ n")
    mem = [rec(n, activation_peak_bytes=70_000_128 + 4_104 * n + (n % 3)) for n in [8192, 16384, 32768, 65536]]
    g = exponent(mem, "seq_len", "activation_peak_bytes")
    assert 0.95 <= g.lo <= 1.0 <= g.hi <= 1.05 and "floor" in g.note


def test_findings_and_headline_show_the_marginal_cost_not_a_power_law():
    rows = [rec(n, macs=float(KV_FLOOR + KV_SLOPE * n), median_ms=1.0 + 1e-4 * n) for n in KV_NS]
    f = findings(rows, run_id="r", suite="kv_cache")
    assert isinstance(f.fit("MHA cache b=8", "macs"), AffineFit)
    text = " ".join(headline_lines(f))
    assert "MACs = 185 M + 49.2 k/token (exact" in text and "MACs ∝" not in text
    assert "185 M + 49.2 k/token (exact" in text and "n^1.00 above the floor" in text


def test_a_contrast_whose_interval_holds_1_is_undecided():
    text = _times(Ratio(2.5, 0.35, 3.0), "faster", "slower", "the same time")
    assert "undecided" in text and "faster" not in text and "slower" not in text
    assert _times(Ratio(2.5, 2.2, 3.0), "faster", "slower", "the same time") == "2.5× [2.2, 3] faster"
    assert "undecided" in _times(Ratio(0.4, 0.3, 1.2), "faster", "slower", "the same time")


def test_a_busy_run_says_so_in_its_headline():
    quiet = [rec(n, median_ms=1.0 + n * 1e-3) for n in QUICK_NS]
    assert "busy" not in headline_lines(findings(quiet, run_id="r", suite="s"))[0]
    busy = quiet[:2] + [rec(n, median_ms=2.0, load_busy=1.0, load_others_cores=1.6) for n in QUICK_NS[2:]]
    head = headline_lines(findings(busy, run_id="r", suite="s"))[0]
    assert "measured on a busy machine (2 ok cases" in head and "1.6 cores" in head
    assert math.isfinite(1.0)


def test_the_report_draws_an_affine_fit_over_its_points():
    """The HTML report's figures take the findings' fits: an affine one is drawn as floor + slope·n over all its
    points (no hollow floor points: its floor is in the model), its legend giving the marginal cost."""
    from reports.plots import figure_svg, metric_figure, resolve_plot_spec
    rows = [rec(n, macs=float(KV_FLOOR + KV_SLOPE * n), median_ms=1.0 + 1e-4 * n) for n in KV_NS]
    f = findings(rows, run_id="r", suite="kv_cache")
    spec = resolve_plot_spec({"x": "seq_len", "y": "macs"}, rows, "seq_len")
    svg = figure_svg(metric_figure(rows, "macs", spec, {lf.line: lf.fits.get("macs") for lf in f.lines}))
    assert 'id="fit-0"' in svg and 'id="floor-0"' not in svg and "49.2 k/token" in svg


@pytest.mark.parametrize("shape", ["affine", "power law"])
def test_the_headline_the_plot_and_a_claim_read_one_exponent(shape):
    """One line, one fit (harness.analysis.fits.fit_cost): the run's headline, the report's legend (fitted by the
    plot itself) and a claim's figure give the same exponent with the same interval."""
    from reports.plots import metric_figure, resolve_plot_spec
    from reports.sentences import fit_text
    ns = [256, 512, 1024, 2048, 4096, 8192]
    noise = np.random.default_rng(7).normal(1.0, 0.01, len(ns))
    cost = (lambda n: 1.0 + 2e-4 * n) if shape == "affine" else (lambda n: 4.5 + 2e-6 * n * n)
    rows = [rec(n, median_ms=float(cost(n) * e)) for n, e in zip(ns, noise)]
    fit = findings(rows, run_id="r", suite="s").fit("MHA cache b=8", "median_ms")
    assert isinstance(fit, AffineFit if shape == "affine" else ScalingFit)
    k = cost_exponent(fit)
    claim = exponent(rows, "seq_len", "median_ms")
    assert (claim.value, claim.lo, claim.hi) == (k.exponent, k.ci_low, k.ci_high)
    spec = resolve_plot_spec({"x": "seq_len", "y": "median_ms"}, rows, "seq_len")
    labels = [t.get_text() for t in metric_figure(rows, "median_ms", spec).legends[0].get_texts()]
    assert any(str(k) in label and fit_text(fit, "seq_len", regime=False, metric="median_ms") in label.replace("\\", "")
               for label in labels), labels
    assert str(k) in " ".join(headline_lines(findings(rows, run_id="r", suite="s")))
