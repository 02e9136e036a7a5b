"""Timings that survive a noisy machine: callables timed side by side in rounds, the paired per-round
ratio whose interval covers drift, sweep points built and timed in one worker, and claims that do not decide a timing measured on a busy machine.
Two versions of the code in alternating workers (counted metrics and structure, no timing judged) are
tests/test_ab_versions.py's, in `make test`'s parallel phase."""
from __future__ import annotations

import math
import time

import pytest

from claims.model import Figure, Rule
from claims.rules import check
from harness.executors.base import MAX_GROUP, interleave_groups
from harness.executors.inline import InlineExecutor
from harness.engine.runner import RunOptions
from harness.contract.spec import Case, Workload
from harness.analysis.ratios import paired_ratio
from harness.analysis.stats import round_medians, round_summary, summarize_rounds
from harness.instruments.timing import TimingConfig, consecutive_rounds, measure_cpu, measure_interleaved

def _spin(seconds: float) -> None:
    """Busy-wait until a wall-clock deadline: a call lasts ``seconds`` (to a few µs) even when preempted."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


SLEEPY = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=10, min_time_s=0.05, max_time_s=5.0, rounds=5)


def test_rounds_split_and_summaries():
    assert consecutive_rounds(11, 5) == (3, 2, 2, 2, 2) and consecutive_rounds(3, 5) == (1, 1, 1)
    assert round_medians([1, 2, 3, 10, 20, 30], (3, 3)) == [2, 20]
    with pytest.raises(ValueError):
        round_medians([1, 2], (3,))
    s = summarize_rounds([1e-3] * 5 + [2e-3] * 5, (5, 5))
    assert s["n_rounds"] == 2 and s["round_cv"] > 0.4
    assert s["ci_low_ms"] <= 1.0 and s["ci_high_ms"] >= 2.0           # the stored interval covers both rounds
    assert round_summary([1e-3] * 4, (4,)) == {}                          # one round: no between-round spread


def test_paired_ratio_cancels_drift_shared_by_both_sides():
    drift = [1, 1, 3, 3, 3]                                               # the machine got 3x slower mid-run
    a = [2e-3 * d for d in drift for _ in range(4)]
    b = [1e-3 * d for d in drift for _ in range(4)]
    pr = paired_ratio(a, (4,) * 5, b, (4,) * 5)
    assert pr.ratio == pytest.approx(2.0) and pr.per_round == pytest.approx((2.0,) * 5)
    with pytest.raises(ValueError):
        paired_ratio(a, (4,) * 5, b[:16], (4,) * 4)


def test_measure_interleaved_alternates_in_rounds_and_survives_a_failing_side():
    order: list[str] = []
    def side(name: str):
        return lambda: order.append(name) or _spin(0.002)
    def broken():
        raise RuntimeError("boom")
    res = measure_interleaved([side("a"), side("b"), broken], SLEEPY, seed=1)
    assert isinstance(res[2], RuntimeError)
    for r in res[:2]:
        assert len(r.rounds) == 5 and sum(r.rounds) == len(r.samples_s) and min(r.rounds) >= 2
    # within the timed part, a and b alternate round by round: neither side runs all its samples first
    sampled = order[order.index("b", order.index("a")):]
    switches = sum(x != y for x, y in zip(sampled, sampled[1:]))
    assert switches >= 4


def test_the_interleaved_ratio_interval_covers_a_drift_injected_half_way():
    """A takes 2 units, B 1 unit; half-way through, every call becomes 3x slower. Timed side by side the
    ratio's interval holds 2; timed one after the other, the drift lands on one side only and the
    one-run interval excludes the truth."""
    calls = {"n": 0}
    half = 60
    def unit() -> float:
        calls["n"] += 1
        return 1e-3 * (3 if calls["n"] > half else 1)
    a, b = (lambda: _spin(2 * unit())), (lambda: _spin(unit()))
    ta, tb = measure_interleaved([a, b], SLEEPY, seed=0)
    pr = paired_ratio(ta.samples_s, ta.rounds, tb.samples_s, tb.rounds)
    assert calls["n"] > half                                         # the drift did happen during the rounds
    # 2 up to the per-call overhead (a lambda and a clock read: under 2 %), which no interval is about
    assert pr.ci_low * 0.98 <= 2.0 <= pr.ci_high * 1.02 and abs(pr.ratio / 2 - 1) < 0.02, pr
    calls["n"] = 0
    half = 10_000
    sa = measure_cpu(a, SLEEPY)                  # A entirely before the drift...
    calls["n"] = half + 1
    sb = measure_cpu(b, SLEEPY)                  # ...B entirely after it
    naive = summarize_rounds(sa.samples_s)["median_ms"] / summarize_rounds(sb.samples_s)["median_ms"]
    assert naive < 1.0                                               # 2/3 where the truth is 2


def _case(line: str, n: int, point: int, arch: str = "decoder-tiny", **over) -> Case:
    return Case("t", line, arch, tuple(sorted(over.items())), Workload(seq_len=n, threads=1), ("latency", "memory", "flops"),
                point)


def test_groups_are_sweep_points_with_several_lines_and_the_sweep_with_one():
    cases = [_case(line, n, i, n_kv_heads=k) for line, k in (("MHA", 4), ("MQA", 1)) for i, n in enumerate((8, 16))]
    groups = interleave_groups(cases)
    assert [[(c.line, c.workload.seq_len) for c in g] for g in groups] == [[("MHA", 8), ("MQA", 8)],
                                                                         [("MHA", 16), ("MQA", 16)]]
    one_line = [_case("MHA", 8, i, n_heads=h) for i, h in enumerate((1, 2, 4))]
    assert interleave_groups(one_line) == [one_line]
    many = [_case("MHA", 8, i) for i in range(MAX_GROUP + 3)]
    assert [len(g) for g in interleave_groups(many)] == [MAX_GROUP, 3]


def test_a_sweep_point_is_built_and_timed_side_by_side_in_one_worker():
    cases = [_case(line, 8, 0, n_kv_heads=k) for line, k in (("MHA", 4), ("MQA", 1))]
    cases.append(_case("bad", 8, 0, arch="no-such-arch"))
    opts = RunOptions(timing=TimingConfig.quick(), interleave=True)
    recs = list(InlineExecutor().run(cases, opts))
    assert [r.status for r in recs] == ["ok", "ok", "error"]
    a, b = recs[0], recs[1]
    assert a.group and a.group == b.group and len(a.rounds) == len(b.rounds) == 5
    assert sum(a.rounds) == len(a.samples_s) and a.metric("macs") > 0 and a.metric("peak_bytes") > 0
    assert a.metric("round_cv") is not None and a.metric("load_others_cores") is not None
    assert a.metric("ci_low_ms") <= a.metric("round_ci_low_ms")
    pr = paired_ratio(a.samples_s, a.rounds, b.samples_s, b.rounds)
    assert pr.ci_low <= pr.ratio <= pr.ci_high and math.isfinite(pr.ratio)


def test_a_timing_measured_on_a_busy_machine_decides_nothing_unless_forced():
    rule = Rule("r", "at_least", "fast", lo=1.5)
    fig = Figure(3.0, 2.5, 3.5, "×", busy="machine busy: other processes used 0.9 cores")
    out = check(rule, fig)
    assert out.status == "unsure" and "machine busy" in out.detail
    assert check(rule, fig, force=True).status == "pass"
    assert check(rule, Figure(3.0, 2.5, 3.5, "×")).status == "pass"
