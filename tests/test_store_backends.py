"""The results store's behaviour on both backends it supports for real: a SQLite file and a PostgreSQL database
(a throwaway server, tests/postgres.py). Runs, records, a client's own table, run ids, schema upgrades, run leases, and
what keeps concurrent writers safe (SQLite's WAL and busy timeout; retries of transient failures)."""
from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import threading
import time
from dataclasses import replace

import psutil
import pytest
import sqlalchemy as sa

import harness.store.db as store_mod
import harness.store.leases as leases_mod
import harness.store.retry as retry_mod
from harness.contract.errors import BenchInputError
from harness.store.migrations import MIGRATIONS
from harness.contract.records import SCHEMA_VERSION, CaseRecord
from harness.store.db import RunBusyError, Store, new_run_id
from harness.store.leases import LEASE_TTL_S
from harness.store.retry import retrying, transient
from harness.store.schema import run_leases
from tests.test_store import _copy

pytest_plugins = ["tests.postgres"]     # fixtures: postgres, postgres_url, store_url_of


def _rec(key: str, median: float = 1.5) -> CaseRecord:
    return CaseRecord(key, "s", "L", "a", "ok", config={"n_heads": 2, "nested": {"x": [1, 2]}},
                      workload={"seq_len": 8}, metrics={"median_ms": median, "noisy": 0.0},
                      samples_s=(0.0015, 0.0016), duration_s=0.1, rounds=(1, 1), group="g")


def _run(store: Store, suite: str = "s", quick: bool = True, **kw) -> str:
    return store.create_run(suite, f"{suite}.toml", quick, 2, {"hard": {"cpu": "x"}, "soft": {"commit": "c"}},
                            {"peak": {}}, **kw)


def test_runs_records_and_a_clients_table_round_trip(store_url_of):
    store = Store(store_url_of)
    assert store.version == SCHEMA_VERSION
    assert set(sa.inspect(store.engine).get_table_names()) == {"runs", "cases", "bench_meta", "run_leases"}
    a = _run(store)
    b = _run(store, suite="other", quick=False)
    assert {r.id for r in store.list_runs()} == {a, b} and [r.id for r in store.list_runs("other")] == [b]
    assert store.get_run(a).id == a and store.get_run(b[:-3]).id == b
    with pytest.raises(BenchInputError, match="more than one run"):
        store.get_run(a[:2])
    with pytest.raises(BenchInputError, match="no run"):
        store.get_run("nope")

    assert store.add_record(a, _rec("k1")) and store.add_record(a, _rec("k2", 2.5))
    assert not store.add_record(a, _rec("k1", 9.0))                 # the unique (run, case) key: stored once
    assert store.add_record(b, _rec("k1"))                          # ... per run
    back = store.records(a)
    assert [r.case_key for r in back] == ["k1", "k2"] and back[0].metric("median_ms") == 1.5
    assert replace(back[0], run_id="", finished_at="") == _rec("k1") and back[0].run_id == a
    assert store.stored_keys(a) == {"k1", "k2"} and store.get_run(a).stored == 2

    store.update_options(a, overhead={"wall_s": 1.0})
    store.update_options(a, extra=1)
    assert store.get_run(a).options == {"peak": {}, "overhead": {"wall_s": 1.0}, "extra": 1}
    store.finish_run(a)
    assert store.get_run(a).status == "done" and store.get_run(a).finished_at
    store.reopen_run(a, 5)
    assert (store.get_run(a).status, store.get_run(a).n_cases) == ("running", 5)
    assert store.resumable("s", True).id == a and store.resumable("s", False) is None

    notes = sa.Table("notes", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("text", sa.JSON, nullable=False))
    reader = Store(store_url_of, create=False)                      # read-only handle on the same store
    assert reader.version == SCHEMA_VERSION and len(reader.records(a)) == 2
    assert not reader.add_table(notes)                              # a reader makes no table
    assert store.add_table(notes) and store.add_table(notes)        # a writer makes it once
    store.insert(notes, {"text": {"a": [1, 2]}})
    assert reader.add_table(notes) and reader.select(sa.select(notes.c.text)) == [{"text": {"a": [1, 2]}}]
    with pytest.raises(ValueError, match="store's own"):
        store.add_table(run_leases)


def test_run_ids_are_sortable_with_32_random_bits():
    ids = [new_run_id() for _ in range(500)]
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_taken_run_id_is_drawn_again_never_merged(store_url_of, monkeypatch):
    store = Store(store_url_of)
    draws = iter(["20261122-163729-ab12", "20261122-163729-ab12", "20261122-163729-ab12", "20261123-000000-cafef00d"])
    monkeypatch.setattr(store_mod, "new_run_id", lambda: next(draws))
    first = _run(store, suite="first")
    assert first == "20261122-163729-ab12"                          # an old-style id (4 hex digits) still works
    second = _run(store, suite="second", lease=True)                # two collisions, then a free id
    assert second == "20261123-000000-cafef00d"
    assert store.get_run("20261122").suite == "first" and store.get_run(second).suite == "second"
    assert store.lease(first) is None and store.lease(second).pid == os.getpid()


def test_a_schema_4_store_is_upgraded_with_run_leases(store_url_of):
    store = Store(store_url_of)
    run = _run(store)
    store.add_record(run, _rec("k1"))
    with store.engine.begin() as conn:                 # back to schema 4: no run_leases table, no invocation column
        conn.execute(sa.text("DROP TABLE run_leases"))
        conn.execute(sa.text("ALTER TABLE runs DROP COLUMN invocation"))
        conn.execute(sa.text("UPDATE bench_meta SET value = '4' WHERE key = 'schema_version'"))
    old = Store(store_url_of, create=False)
    assert old.version == 4 and old.lease(run) is None and old.records(run)[0].case_key == "k1"
    upgraded = Store(store_url_of)
    assert upgraded.version == SCHEMA_VERSION == MIGRATIONS[-1].to
    assert "run_leases" in sa.inspect(upgraded.engine).get_table_names()
    upgraded.claim_run(run)
    assert upgraded.lease(run).pid == os.getpid() and upgraded.records(run)[0].case_key == "k1"


def test_the_schema_1_file_is_upgraded_with_run_leases(tmp_path):
    store = Store(f"sqlite:///{_copy(tmp_path)}")
    assert store.version == SCHEMA_VERSION and store.lease(store.get_run("20261122-163729").id) is None
    assert "run_leases" in sa.inspect(store.engine).get_table_names()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _put_lease(store: Store, run_id: str, *, host: str, pid: int, pid_started: float, age_s: float = 0.0) -> None:
    with store.engine.begin() as conn:
        conn.execute(run_leases.delete().where(run_leases.c.run_id == run_id))
        conn.execute(run_leases.insert().values(run_id=run_id, owner=f"{host}/{pid}/x", host=host, pid=pid,
                                                pid_started=pid_started, acquired_at="then",
                                                heartbeat=time.time() - age_s))


def test_a_live_drivers_lease_refuses_and_a_gone_ones_is_taken_over(store_url_of):
    store = Store(store_url_of)
    run = _run(store)
    here, parent = socket.gethostname(), psutil.Process(os.getppid())

    def claim() -> bool:
        try:
            store.claim_run(run)
        except RunBusyError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"--resume: run {run} is being measured by pid")
            return False
        assert store.lease(run).pid == os.getpid()
        return True

    _put_lease(store, run, host=here, pid=parent.pid, pid_started=parent.create_time(), age_s=10 * LEASE_TTL_S)
    assert not claim()                          # this host, its process alive: held however old its heartbeat
    _put_lease(store, run, host=here, pid=parent.pid, pid_started=parent.create_time() - 100)
    assert claim()                              # that pid is now another process (pid reuse): stale
    _put_lease(store, run, host=here, pid=_dead_pid(), pid_started=0.0)
    assert claim()                              # its process is gone: stale
    _put_lease(store, run, host="elsewhere", pid=1, pid_started=0.0, age_s=LEASE_TTL_S / 2)
    assert not claim()                          # another host, a recent heartbeat: held
    _put_lease(store, run, host="elsewhere", pid=1, pid_started=0.0, age_s=LEASE_TTL_S + 1)
    assert claim()                              # another host, silent for longer than the TTL: stale

    store.release_run(run)
    assert store.lease(run) is None
    assert claim()
    _put_lease(store, run, host="elsewhere", pid=1, pid_started=0.0)   # someone took it over meanwhile
    store.release_run(run)
    assert store.lease(run).host == "elsewhere"                        # releasing never drops another's lease


def test_held_leases_are_renewed_until_released(store_url_of, monkeypatch):
    monkeypatch.setattr(leases_mod, "LEASE_HEARTBEAT_S", 0.05)
    store = Store(store_url_of)
    run = _run(store, lease=True)
    first = store.lease(run).heartbeat
    deadline = time.monotonic() + 10
    while store.lease(run).heartbeat == first:
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    thread = store.leases.thread
    store.release_run(run)
    thread.join(5)
    assert not thread.is_alive() and store.lease(run) is None


def test_transient_failures_are_retried_and_others_are_not(monkeypatch):
    monkeypatch.setattr(retry_mod.time, "sleep", lambda s: None)
    locked = sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    other = sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("no such table: cases"))
    duplicate = sa.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed"))
    calls: list[int] = []

    @retrying
    def flaky(fail: list[Exception]) -> str:
        calls.append(1)
        if fail:
            raise fail.pop(0)
        return "ok"

    assert flaky([locked, locked]) == "ok" and len(calls) == 3
    for exc, raised in ((other, store_mod.StoreWriteError), (duplicate, type(duplicate))):
        calls.clear()
        with pytest.raises(raised):           # a refused write names the store; a duplicate is the caller's to handle
            flaky([exc])
        assert len(calls) == 1
    psycopg = pytest.importorskip("psycopg")
    for pg in (psycopg.errors.SerializationFailure("x"), psycopg.errors.DeadlockDetected("x")):
        assert transient(sa.exc.OperationalError("UPDATE", {}, pg))
    assert not transient(sa.exc.IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("x")))


def test_sqlite_uses_wal_and_a_writer_waits_for_the_lock(tmp_path):
    path = tmp_path / "results.sqlite"
    store = Store(f"sqlite:///{path}")
    run = _run(store)
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == store_mod.BUSY_TIMEOUT_MS
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")                                 # another writer holds the lock for 1 s
    released = threading.Event()

    def release() -> None:
        released.set()                                               # (before: the waiting writer runs at COMMIT)
        other.execute("COMMIT")
    threading.Timer(1.0, release).start()
    assert store.add_record(run, _rec("k1"))                         # waited for it, did not fail
    assert released.is_set() and store.stored_keys(run) == {"k1"}    # ... and wrote only after it was released
    other.close()


def test_a_read_only_copy_of_a_wal_store_is_read_in_place(tmp_path, monkeypatch):
    """A WAL store's readers need a shared-memory file beside it, which a read-only folder (say, evidence copied
    for others) cannot hold: such a copy is opened immutable and read without creating anything."""
    path = tmp_path / "results.sqlite"
    store = Store(f"sqlite:///{path}")
    run = _run(store)
    store.add_record(run, _rec("k1"))
    store.engine.dispose()                                         # the last connection checkpoints the WAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]
    before = path.read_bytes()
    monkeypatch.setattr(store_mod.os, "access", lambda p, mode: False)   # as a user who may not write here
    copy = Store(f"sqlite:///{path}", create=False)
    assert [r.case_key for r in copy.records(run)] == ["k1"] and copy.get_run(run).stored == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"] and path.read_bytes() == before
