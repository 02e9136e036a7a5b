"""The gate says "ok" only when it measured "ok", and measures until it can see: the equivalence rule in the gate's
verdicts and headline, measuring more process pairs until the smallest detectable slowdown meets a target (a
seeded noisy fake timer, a fake clock: nothing is measured), and what a check could see."""
from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np

from harness.analysis.comparison import from_log
from harness.contract.records import CaseRecord, RunRecord
from harness.engine.replicate import add_processes, merge_processes
from reports.check.adaptive import measure_until
from reports.check.baseline import baseline_document, parse_baseline
from reports.check.render import headline, markdown, reach_lines
from reports.check.report import CheckReport, CheckRow, check_run
from reports.check.timing import TimingVerdict

ENV = {"hard": {"cpu": "Test CPU", "cores": 2, "torch": "2.5.1", "python": "3.11.9", "threads": 1},
       "soft": {"host": "ci", "commit": "a" * 40, "dirty": False}}
ROUNDS = 2                      # rounds a process


class PairTimer:
    """Two versions timed side by side in pairs of fresh processes: each process draws its own luck (log-normal,
    ``process_sd``), shared by nothing; each round a load offset both sides of a pair share (``round_sd``); each
    call its own noise. The candidate is ``slowdown`` × the baseline."""

    def __init__(self, seed: int, process_sd: float = 0.12, slowdown: float = 1.0) -> None:
        self.rng = np.random.default_rng(seed)
        self.process_sd, self.slowdown = process_sd, slowdown

    def _process(self, scale: float, load: np.ndarray) -> list[float]:
        luck = math.exp(self.rng.normal(0.0, self.process_sd))
        return [float(x) for r in range(ROUNDS) for x in 2e-3 * scale * luck * load[r] * np.exp(
            self.rng.normal(0.0, 0.02, 10))]

    def pair(self, key: str, n: int) -> tuple[CaseRecord, CaseRecord]:
        """The baseline's and the candidate's records of case ``key`` measured in ``n`` process pairs."""
        sides: list[list[CaseRecord]] = [[], []]
        for _ in range(n):
            load = np.exp(self.rng.normal(0.0, 0.05, ROUNDS))
            for side, scale in ((0, 1.0), (1, self.slowdown)):
                sides[side].append(_record(key, self._process(scale, load)))
        return merge_processes(sides[0]), merge_processes(sides[1])


def _record(key: str, samples: list[float]) -> CaseRecord:
    return CaseRecord(case_key=key, suite="gate", line=key, arch="drifty", status="ok", workload={"batch_size": 1},
                      metrics={"macs": 1e6, "median_ms": 1e3 * float(np.median(samples))},
                      samples_s=tuple(samples), rounds=(10,) * ROUNDS)


def _run() -> RunRecord:
    return RunRecord(id="r", suite="gate", quick=True, status="done", n_cases=1, started_at="t", env=copy.deepcopy(ENV))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _against(timer: PairTimer, keys: list[str], n: int, clock: FakeClock, batch_s: float):
    """A paired check (as ``--against``) of ``keys`` in ``n`` process pairs, and the ``more`` callback that adds
    ``n`` pairs to the cases asked for, taking ``batch_s`` of the fake clock per case."""
    held = {k: timer.pair(k, n) for k in keys}
    base = [held[k][0] for k in keys]
    baseline = parse_baseline(baseline_document(_run(), base))
    report = check_run(baseline, _run(), [held[k][1] for k in keys], paired=True)

    def more(todo: list[str]) -> CheckReport:
        nonlocal report
        for k in todo:
            b, c = timer.pair(k, n)
            held[k] = nb, nc = add_processes(held[k][0], b), add_processes(held[k][1], c)
            report = report.replace_timing(k, nc.samples_s, nc.rounds, paired_base=(nb.samples_s, nb.rounds),
                                           cand_processes=int(nc.metric("n_processes")),
                                           base_processes=int(nb.metric("n_processes")))
        clock.now += batch_s * len(todo)
        return report
    return report, more


def test_a_seeded_noisy_timer_reaches_the_target_by_adding_pairs():
    clock = FakeClock()
    report, more = _against(PairTimer(7), ["a", "b"], 5, clock, batch_s=10.0)
    first = {r.case_key: r.timing for r in report.rows}
    assert all(t.verdict == "inconclusive" and t.mde > 0.20 for t in first.values())     # 5 pairs: blind to 20 %
    final, reach = measure_until(report, more, target=0.20, budget_s=1000.0, per_case_s=10.0, started=0.0,
                                 clock=clock)
    for r in reach:
        t = final.row(r.case_key).timing
        assert r.met and r.batches >= 1 and t.mde <= 0.20 and r.mde == t.mde < r.start_mde
        assert t.comparison.n_a == 5 * (1 + r.batches) and t.paired                    # pairs added, still paired
        assert "target met" in r.text and f"{t.comparison.n_a} paired processes" in r.text
    assert final.blind_mde() is None or final.blind_mde() <= 0.20
    assert reach_lines(reach)[0].startswith("measured until it could see (2 of 2")


def test_the_budget_stops_adding_and_says_so():
    clock = FakeClock()
    report, more = _against(PairTimer(7), ["a", "b"], 5, clock, batch_s=10.0)
    clock.now = 50.0                                             # the first pass took 50 s
    final, reach = measure_until(report, more, target=0.20, budget_s=60.0, per_case_s=10.0, started=0.0,
                                 clock=clock)
    assert final is report and all(not r.met and r.batches == 0 for r in reach)
    assert all("budget spent (50 s of 60 s)" in r.text for r in reach)
    assert "no regression seen (could see ≥ " in headline(final)


def test_a_real_slowdown_is_caught_while_adding_pairs():
    clock = FakeClock()
    report, more = _against(PairTimer(11, slowdown=1.25), ["a"], 5, clock, batch_s=10.0)
    final, reach = measure_until(report, more, target=0.10, budget_s=1000.0, per_case_s=10.0, started=0.0,
                                 clock=clock)
    assert final.row("a").verdict == "regressed" and final.failed and reach[0].met


def test_an_interval_straddling_the_floor_is_never_ok():
    """1.017 [0.750, 1.378] (a 38 % slowdown inside the interval): inconclusive, not ok, and the headline says
    what the check could not see."""
    c = from_log(math.log(1.017), math.log(1.378 / 0.750) / (2 * 2.776), 4.0, level="processes", n_a=5, n_b=5,
                 paired=True)
    row = CheckRow(case_key="k", line="resnet-micro", arch="resnet-micro", label="resnet-micro", params={},
                   kind="both", status="ok", base_status="ok", timing=TimingVerdict(c), timing_gated=True)
    report = CheckReport(rows=(row,))
    assert row.verdict == "inconclusive" and not report.failed
    assert headline(report).startswith(f"⚪ no regression seen (could see ≥ {100 * c.mde:.0f} %)")
    assert report.blind(0.5) == [row] and report.blind(c.mde + 0.01) == []
    assert "✅" not in markdown(report).split("\n")[0]
    narrow = replace(c, ci_low=0.97, ci_high=1.04, verdict="unchanged")
    ok = CheckReport(rows=(replace(row, timing=TimingVerdict(narrow)),))
    assert headline(ok).startswith("✅ unchanged within 5 %") and ok.rows[0].verdict == "ok"


def test_add_processes_keeps_the_processes_apart():
    t = PairTimer(3)
    b1, _ = t.pair("a", 3)
    b2, _ = t.pair("a", 2)
    both = add_processes(b1, b2)
    assert both.metric("n_processes") == 5 and both.samples_s == b1.samples_s + b2.samples_s
    assert both.metric("process_rounds") == ROUNDS
    bad = replace(b2, rounds=(20,), samples_s=b2.samples_s[:20], metrics={**b2.metrics, "n_processes": 1.0})
    try:
        add_processes(b1, bad)
    except ValueError as exc:
        assert "rounds" in str(exc)
    else:
        raise AssertionError("processes of another round count were added")


def test_against_a_file_baseline_more_candidate_processes_cannot_beat_the_baselines_own_spread():
    """Unpaired (a baseline file), the baseline's part of the spread stays however many processes the check adds:
    a case whose reachable MDE is above the target is not measured again, and says why."""
    t = PairTimer(5, process_sd=0.3)
    base, cand = t.pair("a", 3)
    report = check_run(parse_baseline(baseline_document(_run(), [base])), _run(), [cand])
    c = report.row("a").timing.comparison
    assert c.level == "processes" and not c.paired and c.reachable_mde > 0.20
    calls = []
    final, reach = measure_until(report, lambda keys: calls.append(keys) or report, target=0.20, budget_s=1e6,
                                 per_case_s=1.0, started=0.0, clock=FakeClock())
    assert calls == [] and not reach[0].met and "the baseline's own spread (3 processes) allow ≥ " in reach[0].text
