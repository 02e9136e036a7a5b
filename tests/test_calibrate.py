"""Machine-peak calibration: measured matmul FLOP/s per dtype and copy bandwidth, stored with each run."""
from __future__ import annotations

import io
import math

import pandas as pd
import pytest
import torch

from harness.instruments.calibrate import calibrate
from harness.store.db import Store
from reports.frames import rates, wide_frame
from tests.helpers import TINY_SUITE, invoke, run_tiny


def _check(peak: dict, dtypes: set[str]) -> None:
    assert set(peak["matmul_flops_per_s"]) == dtypes
    for v in (*peak["matmul_flops_per_s"].values(), peak["copy_bytes_per_s"]):
        assert isinstance(v, float) and math.isfinite(v) and v > 0
    assert peak["matmul_n"] >= 1024


def test_cpu_calibration_positive_finite_fp32_and_bf16():
    before = torch.get_num_threads()
    peak = calibrate("cpu")
    _check(peak, {"fp32", "bf16"})
    assert peak["device"] == "cpu" and peak["threads"] == before == torch.get_num_threads()
    assert 1e8 < peak["matmul_flops_per_s"]["fp32"] < 1e14      # 0.1 GFLOP/s .. 100 TFLOP/s
    assert 1e8 < peak["copy_bytes_per_s"] < 1e13


@pytest.mark.gpu
def test_cuda_calibration_has_fp16():
    peak = calibrate("cuda")
    _check(peak, {"fp32", "bf16", "fp16"})
    assert peak["matmul_flops_per_s"]["fp16"] > peak["matmul_flops_per_s"]["fp32"] / 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A calibrated and an uncalibrated quick run of the tiny suite, one thread each (the uncalibrated one at its
    shortest length only: its tests read which columns it has, not how many rows). Neither writes its HTML report
    nor measures memory (no test here reads either: ~2 CPU-s of matplotlib, ~1 s of memory passes)."""
    tmp = tmp_path_factory.mktemp("calib")
    assert '"latency", "memory", "flops"' in TINY_SUITE
    _, url, with_peak = run_tiny(tmp, "--set", "threads=1", "--no-report",
                                 text=TINY_SUITE.replace('"latency", "memory", "flops"', '"latency", "flops"'))
    suite = tmp / "tiny.toml"
    without = invoke("run", str(suite), "--quick", "--executor", "inline", "--store", url, "--set", "threads=1",
                     "--set", "seq_len=16", "--no-calibrate", "--no-report")
    assert with_peak.exit_code == 0 and without.exit_code == 0, with_peak.stderr + without.stderr
    store = Store(url, create=False)
    newest, older = store.list_runs()[:2]
    return url, store, older, newest, with_peak


def test_peak_is_stored_in_the_run_options(runs):
    _, store, calibrated, plain, result = runs
    peak = calibrated.options["peak"]
    assert set(peak) == {"cpu"}
    _check(peak["cpu"], {"fp32"})                               # only the dtypes the run's cases use
    assert peak["cpu"]["threads"] == 1                          # pinned to the run's thread count
    assert "peak" not in plain.options
    assert "peak on cpu" in result.stderr


def test_peak_share_from_stored_data(runs):
    url, store, calibrated, _, _ = runs
    rows = store.records(calibrated.id)
    peak = calibrated.options["peak"]
    frame = pd.read_csv(io.StringIO(invoke("export", calibrated.id, "--format", "csv", "--store", url).stdout))
    assert len(frame) == 6
    for r, (_, f) in zip(rows, frame.iterrows()):
        assert r.status == "ok" and r.metrics["flops"] > 0
        achieved = r.metrics["flops"] / (r.metrics["median_ms"] / 1e3)
        executed = 2 * r.metrics["executed_macs"] / (r.metrics["median_ms"] / 1e3)   # what the kernels ran
        share = executed / peak["cpu"]["matmul_flops_per_s"]["fp32"]
        assert f["achieved_flops_per_s"] == pytest.approx(achieved, rel=1e-9)
        assert f["peak_share"] == pytest.approx(share, rel=1e-9)
        assert 0 < f["peak_share"] < 1.5
        assert rates(r, peak) == pytest.approx({"achieved_flops_per_s": achieved, "executed_flops_per_s": executed,
                                                "peak_share": share})


def test_runs_without_a_peak_lack_peak_share(runs):
    url, store, _, plain, _ = runs
    frame = pd.read_csv(io.StringIO(invoke("export", plain.id, "--format", "csv", "--store", url).stdout))
    assert "peak_share" not in frame.columns and "achieved_flops_per_s" in frame.columns
    assert "peak_share" not in wide_frame(store.records(plain.id)).columns


def test_max_peak_keeps_the_higher_rate_per_device_and_dtype() -> None:
    from harness.session import max_peak
    start = {"cpu": {"matmul_flops_per_s": {"fp32": 50e9, "bf16": 10e9}, "copy_bytes_per_s": 9e9}}
    end = {"cpu": {"matmul_flops_per_s": {"fp32": 70e9}, "copy_bytes_per_s": 8e9},
           "cuda:0": {"matmul_flops_per_s": {"bf16": 700e12}, "copy_bytes_per_s": 3e12}}
    merged = max_peak(start, end)
    assert merged["cpu"]["matmul_flops_per_s"] == {"fp32": 70e9, "bf16": 10e9}
    assert merged["cpu"]["copy_bytes_per_s"] == 9e9
    assert merged["cuda:0"] == end["cuda:0"]
    assert max_peak(end, start) == merged


def test_a_run_recalibrates_at_its_end_and_keeps_the_higher_peak(runs) -> None:
    """The module's calibrated run (a tiny run of its own measured the same and cost 9 s of the serial phase)."""
    _, _, run, _, _ = runs
    start, end, peak = run.options["peak_start"], run.options["peak_end"], run.options["peak"]
    rates = [p["cpu"]["matmul_flops_per_s"]["fp32"] for p in (start, end, peak)]
    assert rates[2] == max(rates[0], rates[1]) and rates[0] != rates[1]     # two real measurements


def test_a_cuda_only_run_calibrates_once(monkeypatch) -> None:
    """Issue 26: GPU runs calibrated twice (start and end); a GPU's peak does not move with the host's load, so
    the end re-check runs for CPU cases only."""
    from types import SimpleNamespace

    from harness import session as run_mod
    calls: list[dict] = []
    monkeypatch.setattr(run_mod, "calibrate_peak", lambda used, threads: calls.append(used) or {
        d: {"matmul_flops_per_s": {dt: 1e9 for dt in dts}, "copy_bytes_per_s": 1e9} for d, dts in used.items()})
    updates: list[dict] = []
    store = SimpleNamespace(get_run=lambda run_id: SimpleNamespace(options={"peak": {"cuda": {}, "cpu": {}}}),
                            update_options=lambda run_id, **kw: updates.append(kw))

    def case(device: str) -> SimpleNamespace:
        return SimpleNamespace(workload=SimpleNamespace(device=device, dtype="bf16", threads=1))
    run_mod.Run(store, "r", [case("cuda"), case("cuda")])._recheck_peak()
    assert calls == [] and updates == []
    run_mod.Run(store, "r", [case("cuda"), case("cpu")])._recheck_peak()
    assert calls == [{"cpu": {"bf16"}}] and set(updates[0]["peak_end"]) == {"cpu"}
