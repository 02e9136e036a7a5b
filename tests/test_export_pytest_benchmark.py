"""The pytest-benchmark export (reports.export.to_pytest_benchmark): the JSON pytest-benchmark saves, loaded
back by pytest-benchmark's own `compare` command and holding what github-action-benchmark (`tool: pytest`)
reads. Records are built by hand from seeded numpy draws."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pytest_benchmark.stats import Stats

from harness.contract.records import CaseRecord, RunRecord
from reports.export import pytest_benchmark_stats, to_pytest_benchmark

ENV = {"hard": {"cpu": "Test CPU 3000", "cores": 2, "torch": "2.5.1", "python": "3.11.9"},
       "soft": {"host": "ci", "commit": "b" * 40, "dirty": True, "platform": "Linux-6.1-x86_64-with-glibc2.36"}}


def records(seed: int = 0, scale: float = 1.0) -> list[CaseRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (line, n) in enumerate([("MHA", 16), ("MHA", 32), ("MQA", 16), ("MQA", 32)]):
        samples = tuple(float(x) for x in 0.001 * (i + 1) * scale * np.exp(0.05 * rng.standard_normal(12)))
        out.append(CaseRecord(case_key=f"k{i}", suite="tiny", line=line, arch="decoder-tiny", status="ok",
                              config={"n_kv_heads": 4 if line == "MHA" else 1},
                              workload={"seq_len": n, "batch_size": 1, "dtype": "fp32", "mode": "fwd",
                                        "device": "cpu", "threads": 1},
                              metrics={"median_ms": float(np.median(samples)) * 1e3, "macs": 1e6 * n},
                              samples_s=samples, rounds=(6, 6)))
    out.append(CaseRecord(case_key="k9", suite="tiny", line="MQA", arch="decoder-tiny", status="oom",
                          workload={"seq_len": 64, "batch_size": 1, "dtype": "fp32", "mode": "fwd",
                                    "device": "cpu", "threads": 1}, config={"n_kv_heads": 1}))
    return out


def run(run_id: str = "r1") -> RunRecord:
    return RunRecord(id=run_id, suite="tiny", quick=True, status="done", n_cases=5,
                     started_at="2025-01-01T00:00:00+00:00", finished_at="2025-01-01T00:01:00+00:00", env=ENV)


def test_layout_and_names():
    doc = json.loads(to_pytest_benchmark(run(), records()))
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["commit_info"]["id"] == "b" * 40 and doc["commit_info"]["dirty"] is True
    assert doc["machine_info"]["processor"] == "Test CPU 3000" and doc["machine_info"]["system"] == "Linux"
    benches = doc["benchmarks"]
    assert len(benches) == 4                                   # the oom case has no timing: left out
    names = [b["name"] for b in benches]
    assert names == ["MHA[decoder-tiny-16-1-fp32-fwd-cpu]", "MHA[decoder-tiny-32-1-fp32-fwd-cpu]",
                     "MQA[decoder-tiny-16-1-fp32-fwd-cpu]", "MQA[decoder-tiny-32-1-fp32-fwd-cpu]"]
    assert len({b["fullname"] for b in benches}) == 4 and benches[0]["fullname"] == "tiny::" + names[0]
    b = benches[0]
    assert set(b) >= {"group", "name", "fullname", "params", "param", "extra_info", "options", "stats"}
    assert b["group"] == "tiny" and b["param"] == "decoder-tiny-16-1-fp32-fwd-cpu"
    assert b["params"] == {"arch": "decoder-tiny", "seq_len": 16, "batch_size": 1, "dtype": "fp32", "mode": "fwd",
                           "device": "cpu"}
    assert b["extra_info"]["case_key"] == "k0" and b["extra_info"]["macs"] == 16e6
    # what github-action-benchmark (tool: pytest) reads
    for b in benches:
        assert isinstance(b["fullname"], str)
        assert {"ops", "stddev", "rounds", "mean"} <= set(b["stats"])
        assert b["stats"]["rounds"] == 12 and b["stats"]["ops"] == pytest.approx(1 / b["stats"]["mean"])


def test_a_field_varying_within_a_line_is_in_the_name():
    recs = records()
    recs[1] = CaseRecord(**{**recs[1].__dict__, "workload": {**recs[1].workload, "seq_len": 16, "threads": 2}})
    names = [b["name"] for b in json.loads(to_pytest_benchmark(run(), recs))["benchmarks"]]
    assert len(set(names)) == 4 and "MHA[decoder-tiny-16-1-fp32-fwd-cpu-2]" in names


def test_stats_are_pytest_benchmarks_own():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 6, 7, 8, 13):
        data = list(0.01 * np.exp(0.2 * rng.standard_normal(n)))
        ref = Stats()
        for x in data:
            ref.update(x)
        mine = pytest_benchmark_stats(data)
        want = {**ref.as_dict(), "data": data, "iterations": 1}
        assert set(mine) == set(want)
        for k, v in want.items():
            assert mine[k] == (pytest.approx(v) if isinstance(v, float) else v), (n, k)


def _compare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_pytest_benchmark_compare_reads_two_exports(tmp_path):
    a = tmp_path / "0001_base.json"
    b = tmp_path / "0002_head.json"
    a.write_text(to_pytest_benchmark(run("r1"), records(seed=1)))
    b.write_text(to_pytest_benchmark(run("r2"), records(seed=2, scale=1.2)))
    res = _compare(tmp_path, str(a), str(b))
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert "Failed to load" not in text
    for name in ("MHA[decoder-tiny-16-1-fp32-fwd-cpu]", "MQA[decoder-tiny-32-1-fp32-fwd-cpu]"):
        assert text.count(name) == 2                          # one row per file
    assert "benchmark 'tiny': 8 tests" in text


def test_pytest_benchmark_compare_reads_its_storage_layout(tmp_path):
    machine = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    machine.mkdir(parents=True)
    (machine / "0001_base.json").write_text(to_pytest_benchmark(run("r1"), records(seed=1)))
    (machine / "0002_head.json").write_text(to_pytest_benchmark(run("r2"), records(seed=2)))
    res = _compare(tmp_path, "*/0001", "*/0002", "--columns", "min,mean,ops,rounds")   # ./.benchmarks: the default
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert "Failed to load" not in text and text.count("MHA[decoder-tiny-32-1-fp32-fwd-cpu]") == 2
