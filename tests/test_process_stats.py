"""The process as the unit of replication (issue 25): a fake timer whose every process has its own bias shows the
pooled interval failing to cover the truth while the two-level (process-level) one holds; the gate's verdicts on
synthetic per-process data (A/A green, 2× red, the MDE printed); merging the records of several processes."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from harness.analysis.process_stats import process_groups, process_summary
from harness.analysis.ratios import paired_process_ratio, process_ratio
from harness.contract.records import CaseRecord, RunRecord
from harness.engine.replicate import merge_processes, per_process_timing, timing_metrics
from harness.analysis.stats import summarize
from harness.instruments.timing import TimingConfig
from reports.check.baseline import baseline_document, parse_baseline
from reports.check.render import headline, markdown, power_line
from reports.check.report import check_run
from reports.check.timing import ALPHA, process_timing_verdict, timing_verdict

TRUE_S = 10e-3


class BiasedTimer:
    """A fake timer: each fresh process draws its own bias (log-normal, ``process_sd``) that every one of its
    samples shares; the samples add their own noise (``sample_sd``). The truth is the typical process's time,
    ``true_s`` (the median of the bias distribution is 1)."""

    def __init__(self, seed: int, true_s: float = TRUE_S, process_sd: float = 0.10, sample_sd: float = 0.03) -> None:
        self.rng = np.random.default_rng(seed)
        self.true_s, self.process_sd, self.sample_sd = true_s, process_sd, sample_sd

    def process(self, n: int) -> list[float]:
        bias = math.exp(self.rng.normal(0.0, self.process_sd))
        return list(self.true_s * bias * np.exp(self.rng.normal(0.0, self.sample_sd, n)))

    def processes(self, p: int, n: int = 30) -> list[list[float]]:
        return [self.process(n) for _ in range(p)]


def test_pooled_interval_fails_the_process_level_interval_holds():
    trials, pooled_hits, process_hits = 200, 0, 0
    for seed in range(trials):
        groups = BiasedTimer(seed).processes(5)
        pooled = summarize([x for g in groups for x in g])
        ps = process_summary(groups, n_boot=500)
        pooled_hits += pooled["ci_low_ms"] <= TRUE_S * 1e3 <= pooled["ci_high_ms"]
        process_hits += ps.ci_low_ms <= TRUE_S * 1e3 <= ps.ci_high_ms
    # 95 % intervals: the pooled one treats 150 samples as independent and covers the truth in about a quarter
    # of the trials; the two-level one covers it about as often as it says (seeded: the same counts every run)
    assert pooled_hits / trials < 0.5
    assert process_hits / trials >= 0.9


def test_process_groups_cut_rounds_process_by_process():
    samples = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert process_groups(samples, [1, 2, 1, 2], 2) == [(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)]
    assert process_groups(samples, [2, 2, 2], 2) is None          # 3 rounds do not split into 2 processes
    assert process_groups(samples, [3, 3], 1) is None             # one process: nothing to cut
    assert process_groups(samples, [], 2) is None


def test_summary_needs_two_processes():
    with pytest.raises(ValueError):
        process_summary([[1.0, 2.0]])


def test_process_ratio_a_a_is_not_significant_and_2x_is():
    t = BiasedTimer(7)
    base, same = t.processes(5), t.processes(5)
    slow = [[2 * x for x in g] for g in t.processes(5)]
    aa = process_ratio(base, same, alpha=ALPHA)
    assert not aa.significant and aa.ci_low < 1.0 < aa.ci_high and aa.mde > 0
    ab = process_ratio(base, slow, alpha=ALPHA)
    assert ab.significant and ab.ci_low > 1.5 and ab.ratio == pytest.approx(2.0, rel=0.2)
    # more spread between processes: a larger minimum detectable effect
    noisy = BiasedTimer(8, process_sd=0.3)
    assert process_ratio(noisy.processes(5), noisy.processes(5)).mde > aa.mde


def test_paired_processes_cancel_load_shared_by_a_pair():
    # each pair of processes (one per version, run alternately: --against) shares the machine's load of its time,
    # a factor up to 3×; the candidate is 1.3× slower. Unpaired, the load swamps it; paired, it cancels.
    rng = np.random.default_rng(5)
    base, cand = [], []
    for _ in range(5):
        load = math.exp(rng.uniform(0.0, 1.1))
        base.append(BiasedTimer(int(rng.integers(1 << 30)), true_s=TRUE_S * load, process_sd=0.02).process(30))
        cand.append(BiasedTimer(int(rng.integers(1 << 30)), true_s=1.3 * TRUE_S * load, process_sd=0.02).process(30))
    assert not process_ratio(base, cand, alpha=ALPHA).significant
    pr = paired_process_ratio(base, cand, alpha=ALPHA)
    assert pr.significant and pr.ratio == pytest.approx(1.3, rel=0.05)
    bs, br = _flat(base)
    cs, cr = _flat(cand)
    v = timing_verdict(bs, br, cs, cr, paired=True, base_processes=5, cand_processes=5)
    assert v.verdict == "regressed" and v.paired and v.over_processes


def _flat(groups: list[list[float]], rounds_per_process: int = 2) -> tuple[list[float], list[int]]:
    samples, rounds = [], []
    for g in groups:
        half = len(g) // rounds_per_process
        samples += g
        rounds += [half] * (rounds_per_process - 1) + [len(g) - half * (rounds_per_process - 1)]
    return samples, rounds


def test_gate_verdicts_over_processes_a_a_green_2x_red_mde_printed():
    green = red = 0
    for seed in range(20):
        t = BiasedTimer(100 + seed)
        bs, br = _flat(t.processes(5))
        cs, cr = _flat(t.processes(5))
        ss, sr = _flat([[2 * x for x in g] for g in t.processes(5)])
        aa = timing_verdict(bs, br, cs, cr, base_processes=5, cand_processes=5)
        slow = timing_verdict(bs, br, ss, sr, base_processes=5, cand_processes=5)
        assert aa.over_processes and aa.level == "processes" and aa.processes == (5, 5)
        green += aa.verdict in ("unchanged", "inconclusive")
        red += slow.verdict == "regressed"
        assert "MDE" in aa.mde_text and "5+5 processes" in aa.mde_text
    assert green == 20 and red == 20


def test_one_process_side_falls_back_and_says_so():
    t = BiasedTimer(3)
    bs, br = _flat(t.processes(1, 60), 5)
    cs, cr = _flat(t.processes(5))
    v = timing_verdict(bs, br, cs, cr, base_processes=1, cand_processes=5)
    assert not v.over_processes and v.level == "rounds"           # the rounds of both sides, not their processes
    assert v.comparison.units_text in v.mde_text and "rounds" in v.mde_text and v.processes == (1, 1)


def _record(key: str, samples: list[float], rounds: list[int], n_proc: int, **metrics: float) -> CaseRecord:
    return CaseRecord(case_key=key, suite="s", line="L", arch="a", status="ok", workload={"batch_size": 1},
                      metrics={"macs": 10.0, **timing_metrics(samples, rounds, n_proc), **metrics},
                      samples_s=tuple(samples), rounds=tuple(rounds))


def _run() -> RunRecord:
    return RunRecord(id="r1", suite="s", quick=True, status="done", n_cases=1, started_at="",
                     env={"hard": {}, "soft": {}})


def test_baseline_keeps_per_process_figures_and_check_reads_them():
    t = BiasedTimer(11)
    bs, br = _flat(t.processes(5))
    doc = baseline_document(_run(), [_record("k", bs, br, 5)])
    timing = doc["cases"][0]["timing"]
    assert timing["n_processes"] == 5 and len(timing["process_medians_ms"]) == 5
    assert timing["n_rounds"] == 10 and timing["n_samples"] == len(bs)
    base = parse_baseline(doc)
    assert base.cases[0].timing.n_processes == 5
    ss, sr = _flat([[2 * x for x in g] for g in t.processes(5)])
    report = check_run(base, _run(), [_record("k", ss, sr, 5)], gate_timing=True)
    assert report.row("k").verdict == "regressed" and report.failed
    assert "smallest slowdown this check could see" in power_line(report)
    assert "MDE" in markdown(report) and headline(report).startswith("❌")


def test_a_baseline_without_processes_still_loads():
    doc = {"format": 1, "suite": "s", "env": {}, "cases": [
        {"case_key": "k", "line": "L", "arch": "a", "status": "ok", "workload": {}, "config": {},
         "timing": {"samples_s": [0.01] * 10, "rounds": [2] * 5, "median_ms": 10.0, "round_cv": 0.0}}]}
    assert parse_baseline(doc).cases[0].timing.n_processes == 1
    doc["cases"][0]["timing"]["n_processes"] = 3                     # 5 rounds do not cut into 3 processes
    with pytest.raises(Exception, match="do not split into 3 processes"):
        parse_baseline(doc)


def test_merge_processes_orders_samples_by_process_and_stores_counts():
    t = BiasedTimer(21)
    parts = []
    for g in t.processes(4, 20):
        s, r = _flat([g], 5)
        parts.append(_record("k", s, r, 1, rss_hwm_bytes=1.0, time_timed_s=2.0, time_count_s=0.5))
    merged = merge_processes(parts)
    # where the time went counts every process (the run's overhead account), the counted figures the first's
    assert merged.metrics["time_timed_s"] == 8.0 and merged.metrics["time_count_s"] == 2.0
    assert merged.samples_s == tuple(x for p in parts for x in p.samples_s)
    m = merged.metrics
    assert m["n_processes"] == 4 and m["n_rounds"] == 20 and m["n_samples"] == 80 and m["process_rounds"] == 5
    assert [m[f"process_median_ms_{i}"] for i in range(4)] == pytest.approx(
        [float(np.median(p.samples_s)) * 1e3 for p in parts])
    assert m["ci_low_ms"] == m["process_ci_low_ms"] and m["pooled_ci_low_ms"] >= m["ci_low_ms"]
    assert m["macs"] == 10.0
    failed = CaseRecord(case_key="k", suite="s", line="L", arch="a", status="oom")
    assert merge_processes([parts[0], failed]).status == "oom"       # a failure in one process is the result


def test_per_process_timing_splits_the_budget():
    t = TimingConfig.quick()
    one = per_process_timing(t, 5)
    assert one.min_time_s == pytest.approx(t.min_time_s / 5) and one.rounds == t.rounds
    assert one.min_samples >= t.rounds and per_process_timing(t, 1) is t


def test_process_timing_verdict_direct():
    t = BiasedTimer(31, process_sd=0.02)
    v = process_timing_verdict(t.processes(5), [[0.5 * x for x in g] for g in t.processes(5)])
    assert v.verdict == "improved" and v.mde is not None and v.mde >= 0.05


def test_claims_ratio_figures_say_what_their_interval_covers():
    from claims.probes import median_ratio
    t = BiasedTimer(41, process_sd=0.02)
    a_s, a_r = _flat(t.processes(5))
    b_s, b_r = _flat([[0.5 * x for x in g] for g in t.processes(5)])
    a = dataclasses.replace(_record("a", a_s, a_r, 5), group="g", run_id="r")
    b = dataclasses.replace(_record("b", b_s, b_r, 5), group="g", run_id="r")
    fig = median_ratio(a, b)
    assert "5 paired processes" in fig.note and fig.lo < 2.0 < fig.hi and fig.n == 5
    one = [dataclasses.replace(_record(k, s[:30], [6] * 5, 1), group="g", run_id="r")
           for k, s in (("a", a_s), ("b", b_s))]
    assert "one process: the interval covers this process only" in median_ratio(*one).note
