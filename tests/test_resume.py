"""`kill -9` in the middle of `bench run`, then `--resume`: nothing lost but the case in flight,
nothing repeated, nothing duplicated, and no orphaned worker process left behind.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).with_name("bench")
BENCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli"]

PLUGIN = str(Path(__file__).with_name("plugin_faulty.py"))
WIDTHS = [8, 12, 16, 24, 32, 40, 48, 64]
N_CASES = len(WIDTHS)
DEADLINE_S = 90


def _suite(tmp_path: Path, builds: Path) -> Path:
    """A linear layer at 8 widths; every model built appends "<pid> <width>" to ``builds``."""
    path = tmp_path / "resume_me.toml"
    path.write_text(f'name = "resume_me"\nmetrics = ["latency"]\n'
                    f'fixed = {{ arch = "faulty", batch_size = 4, pid_file = "{builds}" }}\n'
                    f"sweep = {{ width = {WIDTHS} }}\n")
    return path


def _builders(builds: Path) -> dict[int, set[int]]:
    """width -> pids of the processes that built that case's model."""
    out: dict[int, set[int]] = {}
    for line in builds.read_text().splitlines():
        pid, width = map(int, line.split())
        out.setdefault(width, set()).add(pid)
    return out


def _count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("select count(*) from cases").fetchone()[0]
    except sqlite3.OperationalError:       # tables not created yet, or locked for a moment
        return 0


def _query(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _is_worker(p: psutil.Process) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return "spawn_main" in cmd and "resource_tracker" not in cmd


def test_kill_9_then_resume_completes_without_repeats(tmp_path):
    builds = tmp_path / "builds.txt"
    suite = _suite(tmp_path, builds)
    db = tmp_path / "results.sqlite"
    cmd = [*BENCH, "run", str(suite), "--quick", "--plugin", PLUGIN,
           "--store", f"sqlite:///{db}", "--no-calibrate", "--no-report"]     # neither is what is tested here
    # the killed run measures in a worker (it must die with bench); the resumes in bench's own process (inline): what
    # they are tested for is the store (a worker's start would add ~3 CPU-s each); a case they measure is built by a
    # process that is not one of the killed run's workers either way
    first_cmd, cmd = [*cmd, "--executor", "process"], [*cmd, "--executor", "inline"]
    # 1. start a run in its own process group and kill -9 its main process once >= 2 cases are stored
    with open(tmp_path / "first.out", "w") as out:
        proc = subprocess.Popen(first_cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    descendants: list[psutil.Process] = []
    try:
        main = psutil.Process(proc.pid)
        t0 = time.monotonic()
        while _count(db) < 2:
            assert proc.poll() is None, f"bench exited early:\n{(tmp_path / 'first.out').read_text()}"
            assert time.monotonic() - t0 < DEADLINE_S, "no two cases stored in time"
            time.sleep(0.02)
        descendants = main.children(recursive=True)
        workers = {p.pid for p in descendants if _is_worker(p)}
        os.kill(proc.pid, signal.SIGKILL)          # the main process only, as `kill -9 PID` would
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert workers, f"no worker process under bench: {descendants}"

        # the worker (and multiprocessing's helper) must not outlive the killed parent
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in descendants) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p.pid for p in descendants if not _gone(p)]
        assert not left, f"processes left running after kill -9 of bench: {left}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in descendants:
            try:
                p.kill()
            except psutil.Error:
                pass

    stored_before = dict(_query(db, "select case_key, id from cases"))
    assert 2 <= len(stored_before) < N_CASES, "the kill came too late to test anything"
    ((run_id, status),) = _query(db, "select id, status from runs")
    assert status == "running"                  # nobody got to mark it finished
    first_builds = _builders(builds)
    assert set().union(*first_builds.values()) == workers      # every case so far was built in the worker

    # 2. --resume completes the same run: every case exactly once, the stored ones untouched
    res = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)
    assert res.returncode == 0, res.stderr
    assert f"resuming run {run_id}: {len(stored_before)} of {N_CASES} cases already stored" in res.stderr
    assert _query(db, "select id, status from runs") == [(run_id, "done")]
    per_key = _query(db, "select case_key, count(*) from cases group by case_key")
    assert len(per_key) == N_CASES and all(n == 1 for _, n in per_key)
    assert _query(db, "select count(*), count(distinct run_id) from cases") == [(N_CASES, 1)]
    widths = sorted(w for (w,) in _query(db, "select json_extract(config, '$.width') from cases"))
    assert widths == WIDTHS                     # every case of the suite, once
    assert {s for (s,) in _query(db, "select status from cases")} == {"ok"}
    after = dict(_query(db, "select case_key, id from cases"))
    assert {k: after[k] for k in stored_before} == stored_before   # the stored rows are untouched

    # nothing stored before the kill was measured again; only the case in flight may have been
    all_builds = _builders(builds)
    assert sorted(all_builds) == WIDTHS
    repeated = [w for w in WIDTHS if all_builds[w] & workers and all_builds[w] - workers]
    assert len(repeated) <= 1, f"cases measured by both runs: {repeated}"
    assert len([w for w in WIDTHS if all_builds[w] <= workers]) == len(stored_before)

    # 3. a second --resume has nothing left to do
    n_builds = len(builds.read_text().splitlines())
    res = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)
    assert res.returncode == 0, res.stderr
    assert f"{N_CASES} of {N_CASES} cases already stored" in res.stderr
    assert dict(_query(db, "select case_key, id from cases")) == after
    assert _query(db, "select id, status from runs") == [(run_id, "done")]
    assert len(builds.read_text().splitlines()) == n_builds      # no model was built


def test_kill_9_mid_case_takes_a_hung_worker_down_too(tmp_path):
    """A worker stuck in a case (no reads from the pipe) must still die with its parent."""
    plugin = str(Path(__file__).with_name("plugin_faulty.py"))
    pid_file = tmp_path / "worker.pid"
    suite = tmp_path / "hang.toml"
    suite.write_text(f'name = "hang"\nmetrics = ["latency"]\nfixed = {{ arch = "faulty", behavior = "hang", '
                     f'pid_file = "{pid_file}" }}\nsweep = {{ batch_size = [1] }}\n')
    cmd = [*BENCH, "run", str(suite), "--quick", "--timeout", "120", "--plugin", plugin,
           "--store", f"sqlite:///{tmp_path / 'r.sqlite'}", "--no-calibrate", "--no-report"]
    with open(tmp_path / "out", "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        t0 = time.monotonic()
        while not (pid_file.exists() and pid_file.read_text().strip()):   # the worker has built the model
            assert proc.poll() is None, (tmp_path / "out").read_text()
            assert time.monotonic() - t0 < DEADLINE_S, "the worker never started the case"
            time.sleep(0.05)
        worker = psutil.Process(int(pid_file.read_text().split()[0]))
        assert worker.ppid() == proc.pid
        time.sleep(0.5)                            # into the real pass, where it sleeps for 60 s
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(worker), "the hung worker outlived its killed parent"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if worker is not None:
            try:
                worker.kill()
            except psutil.Error:
                pass
