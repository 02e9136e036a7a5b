"""Concurrent writers into one store lose nothing, on a SQLite file and on a PostgreSQL database: two processes
opening a fresh store at once and writing runs (each case stored once, even when both write the same cases),
two processes claiming one run at once (one driver wins), and two `bench run`s at once, one of which is then
stopped mid-run: a second `--resume` of its run is refused in one line (exit 2) while it lives, and completes
the run, each case once, after it is killed."""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import sqlalchemy as sa

from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord
from harness.store.db import RunBusyError, Store

_CTX = mp.get_context("spawn")
_SCRIPT = Path(sys.executable).with_name("bench")
BENCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli"]
N = 30
DEADLINE_S = 240          # generous: a loaded 2-core machine starts `bench` (torch) slowly

pytest_plugins = ["tests.postgres"]     # fixtures: postgres, postgres_url, store_url_of


def _case(key: str) -> CaseRecord:
    return CaseRecord(key, "w", "L", "a", "ok", metrics={"median_ms": 1.0}, samples_s=(0.001,))


def _writer(url: str, idx: int, start, shared_q, out_q) -> None:
    """Open the (fresh) store together with the other writer, store N cases into a run of its own, then the
    same N cases as the other writer into one shared run; report (own run, cases it stored, error)."""
    try:
        start.wait(60)
        store = Store(url)
        own = store.create_run(f"writer{idx}", "w.toml", True, N, {}, {})
        for k in range(N):
            assert store.add_record(own, _case(f"k{k}"))
        if idx == 0:
            shared = store.create_run("shared", "w.toml", True, N, {}, {})
            shared_q.put(shared)
        else:
            shared = shared_q.get(timeout=60)
        start.wait(60)
        stored = sum(store.add_record(shared, _case(f"k{k}")) for k in range(N))
        out_q.put((idx, own, shared, stored, ""))
    except BaseException as exc:  # noqa: BLE001 — reported to the test
        out_q.put((idx, "", "", 0, f"{type(exc).__name__}: {exc}"))
        raise


def _claimer(url: str, run_ids: list[str], start, out_q, done) -> None:
    """Claim each run together with the other claimer; report won/busy per run; hold the won ones until done."""
    try:
        store = Store(url)
        for run_id in run_ids:
            start.wait(60)
            try:
                store.claim_run(run_id)
                out_q.put((run_id, "won"))
            except RunBusyError as exc:
                out_q.put((run_id, str(exc)))
        done.wait(60)
    except BaseException as exc:  # noqa: BLE001 — reported to the test
        out_q.put(("", f"{type(exc).__name__}: {exc}"))
        raise


def _reports(procs: list, out_q, n: int) -> list:
    """The ``n`` reports of the child processes (failing at once if they all end without them)."""
    reports, deadline = [], time.monotonic() + DEADLINE_S
    while len(reports) < n:
        try:
            reports.append(out_q.get(timeout=0.2))
        except queue.Empty:
            assert any(p.is_alive() for p in procs) or not out_q.empty(), f"children ended, reports: {reports}"
            assert time.monotonic() < deadline, f"no reports in time: {reports}"
    return reports


def _join(procs: list) -> None:
    for p in procs:
        p.join(DEADLINE_S)
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"a child process ended with {p.exitcode}"


def test_two_writer_processes_lose_nothing(store_url_of):
    start, shared_q, out_q = _CTX.Barrier(2), _CTX.Queue(), _CTX.Queue()
    procs = [_CTX.Process(target=_writer, args=(store_url_of, i, start, shared_q, out_q)) for i in range(2)]
    for p in procs:
        p.start()
    results = sorted(_reports(procs, out_q, 2))
    _join(procs)
    assert [err for *_, err in results] == ["", ""]
    store = Store(store_url_of, create=False)
    (_, own0, shared, stored0, _), (_, own1, _, stored1, _) = results
    for run_id in (own0, own1, shared):
        assert sorted(r.case_key for r in store.records(run_id)) == sorted(f"k{k}" for k in range(N))
    assert stored0 + stored1 == N                 # every shared case stored by exactly one of the two
    assert len(store.list_runs()) == 3


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_two_claims_of_one_run_at_once_one_wins(store_url_of):
    store = Store(store_url_of)
    fresh = store.create_run("s", "s.toml", True, 1, {}, {})
    stale = store.create_run("s", "s.toml", True, 1, {}, {})
    with store.engine.begin() as conn:            # a driver that died holding `stale`
        conn.execute(sa.text("INSERT INTO run_leases VALUES (:r, 'gone', :h, :p, 0, 'then', 0)"),
                     {"r": stale, "h": socket.gethostname(), "p": _dead_pid()})
    start, out_q, done = _CTX.Barrier(2), _CTX.Queue(), _CTX.Event()
    procs = [_CTX.Process(target=_claimer, args=(store_url_of, [fresh, stale], start, out_q, done)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = _reports(procs, out_q, 4)
    finally:
        done.set()
        _join(procs)
    for run_id in (fresh, stale):
        outcomes = sorted(o for r, o in results if r == run_id)
        assert len(outcomes) == 2 and outcomes[1] == "won", results
        assert outcomes[0].startswith(f"--resume: run {run_id} is being measured by pid")


SUITE = """
name = "{name}"
metrics = ["latency"]
fixed = {{ arch = "decoder-tiny", batch_size = 1 }}
sweep = {{ seq_len = {sizes} }}
"""


def _write_suite(folder: Path, name: str, sizes: list[int]) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(SUITE.format(name=name, sizes=sizes)))
    return path


def _stored(url: str, suite: str) -> tuple[str, int]:
    """(run id, cases stored) of the newest run of ``suite``, or ("", 0) before there is one."""
    try:
        run = Store(url, create=False).resumable(suite, True)
    except BenchInputError:
        return "", 0
    return (run.id, run.stored) if run is not None else ("", 0)


def _in_a_write(url: str) -> bool:
    """Whether some other connection is inside a write transaction now (SQLite: holds the write lock;
    PostgreSQL: a backend in a transaction or a statement)."""
    if url.startswith("sqlite"):
        probe = sqlite3.connect(sa.make_url(url).database, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            probe.close()
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND (state = 'active' OR state LIKE 'idle in transaction%')")).scalar())
    finally:
        engine.dispose()


def _stop_between_transactions(proc: subprocess.Popen, url: str) -> None:
    """SIGSTOP ``proc``, but never inside a transaction: a frozen transaction would hold its locks (SQLite's
    write lock, PostgreSQL's row locks) and block the other writers for good."""
    for _ in range(200):
        os.kill(proc.pid, signal.SIGSTOP)
        if not _in_a_write(url):
            return
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("the run never left a transaction")


def test_two_bench_runs_at_once_and_a_second_resume_of_a_live_run(store_url_of, tmp_path, cli):
    """Two `bench run`s start at once into a fresh store (the second of them asked to `--resume`, with nothing
    to resume); once one case of it is stored that one is frozen (SIGSTOP): the other completes, a second
    `--resume` of the frozen run is refused in one line while it lives, and completes it after `kill -9`."""
    other = _write_suite(tmp_path, "conc_other", [8, 16])
    main = _write_suite(tmp_path, "conc_main", [8, 12, 16, 20])
    common = ["--quick", "--executor", "inline", "--no-calibrate", "--no-report", "--store", store_url_of]
    outs = [open(tmp_path / f"{n}.err", "w") for n in ("main", "other")]
    driver = subprocess.Popen([*BENCH, "run", str(main), *common, "--resume"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=outs[0])
    rival = subprocess.Popen([*BENCH, "run", str(other), *common], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=outs[1])
    try:
        t0 = time.monotonic()
        run_id, n = _stored(store_url_of, "conc_main")
        while n < 1:
            assert driver.poll() is None, (tmp_path / "main.err").read_text()
            assert time.monotonic() - t0 < DEADLINE_S, "the run stored no case in time"
            time.sleep(0.05)
            run_id, n = _stored(store_url_of, "conc_main")
        _stop_between_transactions(driver, store_url_of)
        assert rival.wait(DEADLINE_S) == 0, (tmp_path / "other.err").read_text()

        refused = cli("run", str(main), *common, "--resume")
        assert refused.exit_code == 2
        (line,) = [x for x in refused.stderr.splitlines() if "error" in x]
        assert line.startswith(f"bench: error: --resume: run {run_id} is being measured by pid {driver.pid} on ")
        assert refused.stderr.strip().splitlines()[-1] == line

        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
        before = _stored(store_url_of, "conc_main")[1]
        assert 1 <= before < 4, "the frozen run had finished: nothing left to resume"
        resumed = cli("run", str(main), *common, "--resume")
        assert resumed.exit_code == 0, resumed.stderr
        assert f"resuming run {run_id}: {before} of 4 cases already stored" in resumed.stderr
    finally:
        for p in (driver, rival):
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for f in outs:
            f.close()
    for text in ((tmp_path / "main.err").read_text(), (tmp_path / "other.err").read_text()):
        assert "locked" not in text and "error:" not in text and "Traceback" not in text
    store = Store(store_url_of, create=False)
    runs = {r.suite: r for r in store.list_runs()}
    assert sorted(runs) == ["conc_main", "conc_other"] and all(r.status == "done" for r in runs.values())
    assert runs["conc_main"].id == run_id
    for suite, n_cases in (("conc_main", 4), ("conc_other", 2)):
        keys = [r.case_key for r in store.records(runs[suite].id)]
        assert len(keys) == len(set(keys)) == n_cases and all(r.ok for r in store.records(runs[suite].id))
        assert store.lease(runs[suite].id) is None
