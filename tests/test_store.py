"""The results store: typed records, a schema version, and stores written by earlier versions kept readable
(read-only, and upgraded in place when opened for writing)."""
from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from harness.contract.errors import BenchInputError
from harness.store.migrations import MIGRATIONS, upgrade_row
from harness.contract.records import SCHEMA_VERSION, CaseRecord, RunRecord, SuiteSpec
from harness.store.db import Store

SCHEMA1 = Path(__file__).parent / "data" / "schema1-h100-fp32.sqlite"
SCHEMA6 = Path(__file__).parent / "data" / "store-schema6.sql"


def _copy(tmp_path: Path, name: str = "old.sqlite") -> Path:
    path = tmp_path / name
    shutil.copy(SCHEMA1, path)
    return path


def _schema6(tmp_path: Path, name: str = "six.sqlite") -> Path:
    """A store at schema 6 as the store wrote it while it still held the claims' experiments table."""
    path = tmp_path / name
    with sqlite3.connect(path) as c:
        c.executescript(SCHEMA6.read_text())
    return path


def _columns(path: Path, table: str) -> set[str]:
    with sqlite3.connect(path) as c:
        return {row[1] for row in c.execute(f"pragma table_info({table})")}


def test_a_new_store_is_at_the_current_version_and_round_trips_records(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'new.sqlite'}")
    assert store.version == SCHEMA_VERSION
    spec = SuiteSpec(description="d", metrics=("latency",), fixed={"arch": "a"}, sweep={"seq_len": [1, 2]},
                     lines={"L": {"n_heads": 2}}, plot={"x": "seq_len"})
    run_id = store.create_run("s", "s.toml", True, 1, {"hard": {"cpu": "x"}, "soft": {"commit": "abc"}},
                              {"peak": {"cpu": {}}}, suite_text="name = 's'\n", spec=spec)
    rec = CaseRecord("k1", "s", "L", "a", "ok", config={"n_heads": 2}, workload={"seq_len": 1},
                     metrics={"median_ms": 1.5, "noisy": 0.0}, samples_s=(0.0015, 0.0016), duration_s=0.1)
    assert store.add_record(run_id, rec) and not store.add_record(run_id, rec)        # stored once
    run = store.get_run("latest")
    assert isinstance(run, RunRecord) and run.spec == spec and run.suite_text == "name = 's'\n"
    assert run.stored == 1 and run.commit == "abc" and run.hard_env == {"cpu": "x"}
    (back,) = store.records(run_id)
    assert replace(back, run_id="", finished_at="") == rec and back.run_id == run_id
    assert back.metric("median_ms") == 1.5 and back.value("n_heads") == 2 and back.value("seq_len") == 1


def test_schema1_store_reads_without_writing(tmp_path):
    path = _copy(tmp_path)
    path.chmod(0o444)                                  # a read-only copy, like shared/evidence/
    before = path.read_bytes()
    store = Store(f"sqlite:///{path}", create=False)
    assert store.version == 1
    runs = store.list_runs()
    assert [r.suite for r in runs] == ["long_sequence", "vit_vs_cnn", "attention_scaling"]
    assert all(r.spec is None and r.suite_text is None for r in runs)
    scaling = store.get_run("20261122-163729")
    assert scaling.status == "running" and scaling.n_cases == 84 and scaling.stored == 56
    assert scaling.hard_env["gpus"][0]["name"].startswith("NVIDIA H100")
    records = store.records(scaling.id)
    assert len(records) == 56 and all(isinstance(r, CaseRecord) for r in records)
    ok = [r for r in records if r.ok]
    assert ok and all(r.metric("median_ms") > 0 and len(r.samples_s) > 0 for r in ok)
    assert path.read_bytes() == before


def test_schema1_store_is_upgraded_in_place_when_opened_for_writing(tmp_path):
    path = _copy(tmp_path)
    old = Store(f"sqlite:///{path}", create=False)
    runs_before = old.list_runs()
    records_before = {r.id: old.records(r.id) for r in runs_before}
    assert "suite_text" not in _columns(path, "runs")
    store = Store(f"sqlite:///{path}")                 # opened to write: migrated
    assert store.version == SCHEMA_VERSION
    assert {"suite_text", "suite_spec"} <= _columns(path, "runs")
    assert Store(f"sqlite:///{path}", create=False).version == SCHEMA_VERSION
    assert store.list_runs() == runs_before
    assert {r.id: store.records(r.id) for r in runs_before} == records_before
    run_id = store.create_run("s", "s.toml", True, 0, {}, {}, suite_text="x", spec=SuiteSpec(description="d"))
    assert store.get_run(run_id).spec.description == "d"


def test_a_store_from_a_newer_bench_is_refused_in_one_line(tmp_path):
    path = tmp_path / "future.sqlite"
    Store(f"sqlite:///{path}")
    with sqlite3.connect(path) as c:
        c.execute("update bench_meta set value = ? where key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(BenchInputError, match="newer bench"):
        Store(f"sqlite:///{path}", create=False)


def test_not_a_store_is_bad_input(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as c:
        c.execute("create table x (a int)")
    with pytest.raises(BenchInputError, match="not a bench results store"):
        Store(f"sqlite:///{path}", create=False)
    with pytest.raises(BenchInputError, match="no results store"):
        Store(f"sqlite:///{tmp_path / 'missing.sqlite'}", create=False)


def test_migrations_are_numbered_in_order_and_lift_rows():
    assert [m.to for m in MIGRATIONS] == list(range(2, SCHEMA_VERSION + 1))
    row = {"id": "r", "suite": "s"}
    lifted = upgrade_row("runs", row, 1)
    assert lifted["suite_text"] is None and lifted["suite_spec"] is None
    assert upgrade_row("runs", lifted, SCHEMA_VERSION) == lifted


def test_a_schema6_store_with_a_lease_and_experiments_opens_to_read_and_to_write(tmp_path):
    path = _schema6(tmp_path)
    url = f"sqlite:///{path}"
    reader = Store(url, create=False)
    assert reader.version == 6
    (run,) = reader.list_runs()
    assert (run.suite, run.status, run.n_cases, run.stored) == ("tiny", "done", 2, 2)
    assert run.invocation == {"command": "run", "argv": ["run", "tiny"]} and run.spec.sweep == {"seq_len": [8, 16]}
    records = reader.records(run.id)
    assert [r.case_key for r in records] == ["k8", "k16"] and records[1].metric("median_ms") == 3.0
    assert records[0].group == "g" and records[0].rounds == (1, 1) and records[0].sdpa_backend == "math"
    lease = reader.lease(run.id)
    assert lease is not None and not lease.live()                   # the driver that wrote it is gone

    store = Store(url)                                              # opened to write
    assert store.version == SCHEMA_VERSION and store.list_runs() == [run] and store.records(run.id) == records
    store.claim_run(run.id)                                         # the stale lease is taken over
    assert store.lease(run.id).pid == os.getpid()
    store.release_run(run.id)
    assert store.lease(run.id) is None
    new = store.create_run("s", "s.toml", True, 1, {}, {}, lease=True)
    assert store.add_record(new, replace(records[0], run_id="", finished_at=""))
    assert [r.id for r in store.list_runs()] == [new, run.id] and store.lease(new).pid == os.getpid()
    store.release_run(new)
    with sqlite3.connect(path) as c:                                # the claims' table and its row are kept
        assert c.execute("select name from experiments").fetchall() == [("mnist1d",)]
