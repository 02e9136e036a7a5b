"""Processes added where an interval is wide (``--max-processes``): harness.engine.replicate.imprecise decides from
the spread between processes; a side-by-side group gets its processes whole, so they stay paired."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.analysis.process_stats import group_halfwidth, process_groups
from harness.analysis.ratios import paired_process_ratio
from harness.contract.records import CaseRecord
from harness.contract.spec import Case, Workload
from harness.engine.replicate import imprecise
from harness.engine.runner import RunOptions
from harness.executors import ProcessExecutor
from harness.executors.base import interleave_groups
from harness.instruments.timing import TimingConfig
from tests.helpers import run_tiny

PLUGIN = str(Path(__file__).with_name("plugin_drift.py"))


def test_group_halfwidth_is_t_over_root_p_of_the_log_spread_and_a_pair_cancels_shared_luck():
    a = [1.0, 1.2, 0.9, 1.1]
    logs = [math.log(x) for x in a]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    assert group_halfwidth([a]) == pytest.approx(3.182446305284263 * sd / 2, rel=1e-9)   # t(3) at 97.5 %
    luck = [1.0, 1.3, 0.8, 1.6]                  # each process's luck, shared by the two cases it ran
    pair = [[2.0 * x for x in luck], [3.0 * x for x in luck]]
    assert group_halfwidth(pair) == pytest.approx(0.0, abs=1e-12)
    assert group_halfwidth(pair[:1]) > 0.2
    assert group_halfwidth([[1.0, 2.0], [1.0, 1.0]]) == pytest.approx(12.706204736 * math.log(2) / math.sqrt(2) / math.sqrt(2))
    assert group_halfwidth([[1.0]]) == math.inf                    # one process: no spread measured


def _rec(key: str, medians: list[float], status: str = "ok") -> list[CaseRecord]:
    return [CaseRecord(key, "s", key, "a", status, "", samples_s=(m, m, m)) for m in medians]


def test_imprecise_lists_wide_groups_and_leaves_a_failed_case_alone():
    parts = {"steady": _rec("steady", [1.0, 1.01, 0.99]), "noisy": _rec("noisy", [1.0, 2.0, 0.5]),
             "mate": _rec("mate", [1.0, 2.0, 0.5]), "dead": _rec("dead", [1.0, 3.0], "crashed") + _rec("dead", [9.0]),
             "counted": [CaseRecord("counted", "s", "counted", "a", "ok", "") for _ in range(3)]}
    groups = [["steady"], ["noisy"], ["noisy", "mate"], ["steady", "noisy"], ["dead"], ["noisy", "dead"],
              ["noisy", "counted"], ["counted"]]
    # noisy alone, a pair whose ratio moves, and noisy beside a case that is not timed; not the twins, not a failure
    assert imprecise(groups, parts) == [1, 3, 6]
    assert imprecise(groups, parts, precision=10.0) == []


@pytest.mark.serial    # judges the spread of timings between processes: alone, after the parallel tests
def test_processes_are_added_only_to_the_wide_group_and_it_stays_paired(tmp_path):
    """The twins' group stays at two processes only where nothing runs beside it: with a busy loop on one of the
    two cores, each process's median of a 2 ms case was ~2.1 or ~5.7 ms, case by case (07:55-08:10, this
    machine), and a CI-like fresh clone's parallel phase gave the twins a third process (08:04). So it runs in the
    serial phase (tests/conftest.py's PARTLY_SERIAL_MODULES), with 15 samples a process, not 3, and ×/÷ 3 as the
    precision (the twins grow only if their ratio differs by ~19 % between two processes; the lucky group, at
    three processes 1, 2.5, 4 times the steady case, still reads ×/÷ 5.8)."""
    luck = str(tmp_path / "luck")
    w1, w2 = Workload(batch_size=1), Workload(batch_size=2)
    cases = [Case("adaptive", "steady", "drifty", (), w1, ("latency",), point=0),
             Case("adaptive", "lucky", "drifty", (("luck_file", luck), ("luck_ms", 3.0)), w1, ("latency",), point=0),
             Case("adaptive", "steady", "drifty", (), w2, ("latency",), point=1),
             Case("adaptive", "twin", "drifty", (), w2, ("latency",), point=1)]
    assert [len(g) for g in interleave_groups(cases)] == [2, 2]
    timing = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=30, min_time_s=0.0, max_time_s=1.0, rounds=3)
    opts = RunOptions(timing=timing, timeout_s=60, plugins=(PLUGIN,), interleave=True, processes=2, max_processes=4,
                      precision=3.0)
    ex = ProcessExecutor()
    try:
        recs = {(r.line, r.workload["batch_size"]): r for r in ex.run(cases, opts)}
    finally:
        ex.close()
    assert all(r.ok for r in recs.values()), [r.message for r in recs.values()]
    n = {k: int(r.metric("n_processes")) for k, r in recs.items()}
    # The lucky case's processes wait 0, 3, 6, 9 ms more: its group reaches the maximum; the twins' does not move.
    assert n == {("steady", 1): 4, ("lucky", 1): 4, ("steady", 2): 2, ("twin", 2): 2}
    assert len(Path(luck).read_text().splitlines()) == 4      # one lucky process per pass, 4 passes
    ga = process_groups(recs["lucky", 1].samples_s, recs["lucky", 1].rounds, 4)
    gb = process_groups(recs["steady", 1].samples_s, recs["steady", 1].rounds, 4)
    assert ga is not None and gb is not None
    ratio = paired_process_ratio(gb, ga)       # lucky / steady, process by process: 1 + k·3/2 on average
    assert 1.5 < ratio.ratio < 5.0


def test_max_processes_needs_processes_and_is_not_below_them(tmp_path):
    for extra, msg in ((("--max-processes", "3"), "needs --processes 2 or more"),
                       (("--executor", "process", "--processes", "3", "--max-processes", "2"), "below --processes 3")):
        _, _, res = run_tiny(tmp_path, *extra, "--dry-run")
        assert res.exit_code == 2 and msg in res.stderr, res.stderr
