"""One answer to "how much slower is B than A": two stored cases read by `bench compare`, the `bench run` headline's
contrast (`bench show`), a claim's latency figure and the CI gate give the same ratio and interval, from the one
comparison (harness.analysis.comparison). Synthetic records: nothing is measured."""
from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest

from claims.probes import median_ratio
from harness.analysis.comparison import compare_records
from harness.contract.records import CaseRecord, RunRecord
from harness.engine.replicate import timing_metrics
from harness.store.db import Store
from reports.check.baseline import baseline_document, parse_baseline
from reports.check.render import markdown
from reports.check.report import check_run
from reports.compare import compare_runs
from reports.findings import findings
from tests.helpers import invoke

ENV = {"hard": {"cpu": "Test CPU", "cores": 2, "torch": "2.5.1", "python": "3.11.9", "threads": 1},
       "soft": {"host": "ci", "commit": "a" * 40, "dirty": False}}
PROCESSES, ROUNDS, PER = 5, 2, 8


def _case(rng: np.random.Generator, key: str, line: str, width: int, scale: float) -> CaseRecord:
    """A case measured in 5 processes (each its own luck), 2 rounds of 8 calls each."""
    samples = []
    for _ in range(PROCESSES):
        luck = math.exp(rng.normal(0.0, 0.05))
        samples += list(2e-3 * scale * luck * np.exp(rng.normal(0.0, 0.02, ROUNDS * PER)))
    rounds = (PER,) * (ROUNDS * PROCESSES)
    metrics = {"macs": 1e6, **timing_metrics(samples, rounds, PROCESSES)}
    return CaseRecord(case_key=key, suite="one", line=line, arch="drifty", status="ok", config={"width": width},
                      workload={"batch_size": 1, "seq_len": 1}, metrics=metrics, samples_s=tuple(samples),
                      rounds=rounds)


@pytest.fixture(scope="module")
def two():
    rng = np.random.default_rng(2024)
    return _case(rng, "k-a", "A", 80, 1.0), _case(rng, "k-b", "B", 160, 1.6)


def test_compare_headline_claim_and_gate_print_the_same_ratio_and_interval(two, tmp_path):
    a, b = two
    truth = compare_records(a, b)                                       # B over A, over 5+5 processes
    assert truth.level == "processes" and truth.verdict == "regressed" and not truth.paired
    want = (truth.ratio, truth.ci_low, truth.ci_high)

    # bench compare: run A holds case a, run B the same case measured as b
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = Store(url)
    ids = []
    for rec in (a, b):
        run_id = store.create_run("one", "", True, 1, copy.deepcopy(ENV), {})
        store.add_record(run_id, CaseRecord(**{**rec.__dict__, "case_key": "k", "line": "L", "run_id": run_id}))
        store.finish_run(run_id)
        ids.append(run_id)
    row = compare_runs(store.records(ids[0]), store.records(ids[1])).rows[0]
    assert (row["ratio"], row["ci_low"], row["ci_high"]) == pytest.approx(want, rel=1e-12)
    assert row["verdict"] == "slower" and row["over"] == "5+5 processes"
    res = invoke("compare", ids[0], ids[1], "--store", url)
    assert res.exit_code == 0, res.stderr
    assert truth.interval_text in res.stdout and "5+5 processes" in res.stdout

    # the run headline: one run with both lines (they differ in width only); the contrast is B's time over A's
    f = findings([b, a], run_id="r", suite="one")
    (contrast,) = f.contrasts
    assert (contrast.time.value, contrast.time.lo, contrast.time.hi) == pytest.approx(want, rel=1e-12)
    run_id = store.create_run("one", "", True, 2, copy.deepcopy(ENV), {})
    for rec in (b, a):
        store.add_record(run_id, CaseRecord(**{**rec.__dict__, "run_id": run_id}))
    store.finish_run(run_id)
    shown = invoke("show", run_id, "--store", url)
    assert shown.exit_code == 0, shown.stderr
    assert re.search(rf"{truth.ratio:.2g}× \[{truth.ci_low:.2g}, {truth.ci_high:.2g}\] faster", shown.stdout), \
        shown.stdout                                                   # A is the faster line, by B/A

    # a claim's latency figure: B's latency over A's
    fig = median_ratio(b, a)
    assert (fig.value, fig.lo, fig.hi) == pytest.approx(want, rel=1e-12)
    assert "5+5 processes" in fig.note and "regressed" in fig.note

    # the gate: a baseline file of A, checked with B as the candidate
    run = RunRecord(id="r1", suite="one", quick=True, status="done", n_cases=1, started_at="t",
                    env=copy.deepcopy(ENV))
    report = check_run(parse_baseline(baseline_document(run, [a])), run, [CaseRecord(**{**b.__dict__,
                                                                                       "case_key": a.case_key})])
    t = report.rows[0].timing
    assert (t.ratio, t.ci_low, t.ci_high) == pytest.approx(want, rel=1e-12) and t.verdict == "regressed"
    assert truth.interval_text in markdown(report)
