"""The metric catalog (harness/contract/metrics.py): the one description of every metric, from which the lists the
gate, the fits and the claims test against are derived, and the docs' metrics reference is generated."""
from __future__ import annotations

from pathlib import Path

import pytest

from claims.probes import EXACT_METRICS as PROBE_EXACT, TIMING_METRICS
from harness.contract import metrics
from harness.contract.metrics import BY_NAME, METRICS, lookup
from harness.store.db import Store
from reports.check.metrics import DETERMINISTIC
from reports.findings import EXACT_METRICS as FINDINGS_EXACT
from reports.frontier import COSTS
from tests.helpers import run_tiny


def test_every_entry_is_complete():
    assert len(BY_NAME) == len(METRICS), "a metric named twice"
    for m in METRICS:
        assert m.unit and m.meaning and m.kind and m.better in ("lower", "higher", "none"), m
        assert not (m.gate and not m.exact), f"{m.name}: the gate requires equality only of exact metrics"


def test_the_derived_lists():
    assert set(metrics.EXACT_COUNTS) == {"macs", "flops", "params", "bytes_moved"}
    assert FINDINGS_EXACT == frozenset(metrics.EXACT_COUNTS) and tuple(PROBE_EXACT) == metrics.EXACT_COUNTS
    assert DETERMINISTIC == ("macs", "flops", "params", "est_peak_bytes", "activation_peak_bytes", "peak_bytes")
    assert set(metrics.FAKE_PASS) == {"macs", "flops", "params", "bytes_moved", "est_peak_bytes"}
    assert {"median_ms", "mean_ms", "min_ms", "throughput_per_s", "ttft_ms", "tpot_ms"} <= set(TIMING_METRICS)
    assert not set(TIMING_METRICS) & set(metrics.EXACT_COUNTS)
    assert {k: lower for k, (_, lower, _) in COSTS.items()} == {"median_ms": True, "macs": True,
                                                                "throughput_per_s": False}


def test_patterns_resolve():
    assert lookup("time_timed_s").name == "time_<part>_s"
    assert lookup("process_median_ms_12").name == "process_median_ms_<i>"
    assert lookup("median_ms").name == "median_ms"
    assert lookup("analytic_kv_cache_bytes").name == "analytic_<figure>"
    assert lookup("no_such_metric") is None


def test_every_metric_a_run_stores_is_in_the_catalog(tmp_path: Path):
    _, url, result = run_tiny(tmp_path, "--no-calibrate")
    assert result.exit_code == 0, result.output
    store = Store(url)
    [run] = store.list_runs()
    names = {k for r in store.records(run.id) for k in r.metrics}
    assert names, "the run stored no metric"
    missing = sorted(n for n in names if lookup(n) is None)
    assert not missing, f"metrics stored but not in harness/contract/metrics.py: {missing}"


@pytest.mark.parametrize("name", ["ttft_ms", "tpot_ms", "mfu", "energy_j", "kv_cache_bytes", "quoted_top1",
                                  "model_flops", "process_gmean_ms", "compile_s"])
def test_the_catalog_covers_generation_training_energy_and_processes(name: str):
    assert lookup(name) is not None
