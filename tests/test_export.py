"""`bench export --format parquet|tidy-csv`: round trips through pandas; csv/json stay as they were."""
from __future__ import annotations

import io

import pandas as pd
import pytest

from harness.store.db import Store
from tests.helpers import invoke




@pytest.fixture(scope="module")
def stored(tiny_store):
    """The tiny run measured once per process (conftest's ``tiny_store``: calibrated, one thread), this module's copy."""
    _, url = tiny_store
    store = Store(url, create=False)
    run = store.get_run("latest")
    return url, run, store.records(run.id)


def test_parquet_round_trip_one_row_per_case(stored, tmp_path):
    url, run, rows = stored
    path = tmp_path / "run.parquet"
    res = invoke("export", "latest", "--format", "parquet", "-o", str(path), "--store", url)
    assert res.exit_code == 0, res.stderr
    frame = pd.read_parquet(path)
    assert len(frame) == 6 and set(frame["run_id"]) == {run.id}
    assert {"case_key", "line", "arch", "status", "seq_len", "cfg.n_kv_heads", "median_ms", "macs", "flops",
            "peak_bytes", "achieved_flops_per_s", "peak_share"} <= set(frame.columns)
    assert list(frame["case_key"]) == [r.case_key for r in rows]
    assert (frame["median_ms"] > 0).all()
    assert frame["median_ms"].tolist() == [r.metrics["median_ms"] for r in rows]   # full precision
    csv = pd.read_csv(io.StringIO(invoke("export", "latest", "--format", "csv", "--store", url).stdout))
    assert list(csv.columns) == list(frame.columns)


def test_parquet_needs_output_file(stored):
    url, _, _ = stored
    res = invoke("export", "latest", "--format", "parquet", "--store", url)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "-o" in lines[0]


def test_tidy_csv_one_row_per_case_and_metric(stored, tmp_path):
    url, run, rows = stored
    res = invoke("export", "latest", "--format", "tidy-csv", "--store", url)
    assert res.exit_code == 0, res.stderr
    tidy = pd.read_csv(io.StringIO(res.stdout))
    assert list(tidy.columns[-2:]) == ["metric", "value"]
    assert {"run_id", "case_key", "line", "arch", "seq_len", "cfg.n_kv_heads"} <= set(tidy.columns)
    n_metrics = sum(len(r.metrics) + 3 for r in rows)     # + achieved_ and executed_flops_per_s, peak_share
    assert len(tidy) == n_metrics and tidy["value"].notna().all()
    assert not tidy.duplicated(["case_key", "metric"]).any()
    assert {"median_ms", "macs", "flops", "peak_bytes", "achieved_flops_per_s", "peak_share"} <= set(tidy["metric"])
    for r in rows:                          # every stored metric is there with its exact value
        mine = tidy[tidy["case_key"] == r.case_key].set_index("metric")["value"]
        for k, v in r.metrics.items():
            assert mine[k] == pytest.approx(v, rel=1e-12)
        assert list(mine.index) == sorted(mine.index)        # metrics sorted within a case
    assert list(dict.fromkeys(tidy["case_key"])) == [r.case_key for r in rows]   # stored case order
    again = invoke("export", "latest", "--format", "tidy-csv", "--store", url).stdout
    assert again == res.stdout                                 # deterministic
    out = tmp_path / "tidy.csv"
    invoke("export", "latest", "--format", "tidy-csv", "-o", str(out), "--store", url)
    assert out.read_text() == res.stdout


def test_json_unchanged_by_the_peak(stored):
    url, _, _ = stored
    import json
    data = json.loads(invoke("export", "latest", "--format", "json", "--store", url).stdout)
    assert "peak_share" not in data[0]["metrics"] and "achieved_flops_per_s" not in data[0]["metrics"]
