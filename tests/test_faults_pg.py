"""PostgreSQL faults under a run (harness.session.Run), each a real fault on a server of the test's own: a restart in the
middle of a run (ridden out: nothing lost or doubled) and the server gone for good (one line, exit 2, the cases kept
in a local SQLite file that `bench merge` adds back and `--resume` completes)."""
from __future__ import annotations

import subprocess

import pytest

from harness.store.db import Store
from tests.helpers import invoke
from tests.postgres import new_server
from tests.test_faults import BENCH, WIDTHS, _args, _env, _one_error_line, _pg_count, _suite, _wait_for


@pytest.fixture
def pg():
    server = new_server()
    yield server
    server.stop()


def test_a_postgresql_restart_mid_run_is_ridden_out(pg, tmp_path):
    url = pg.create_database()
    proc = subprocess.Popen(_args(_suite(tmp_path), url), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _pg_count(url) >= 2 or proc.poll() is not None)
        assert proc.poll() is None, "the run ended before the server could be restarted"
        pg.pg_ctl("restart", "-m", "fast")                 # every connection of the run is cut
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert _pg_count(url) == len(WIDTHS)
    assert _pg_count(url, "SELECT count(DISTINCT case_key) FROM cases") == len(WIDTHS)
    assert _pg_count(url, "SELECT count(*) FROM runs WHERE status = 'done'") == 1


def test_a_postgresql_server_gone_for_good_keeps_the_cases_locally(pg, tmp_path):
    url = pg.create_database()
    suite = _suite(tmp_path)
    proc = subprocess.Popen(_args(suite, url), cwd=tmp_path, env=_env(BENCH_STORE_RETRY_S="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _pg_count(url) >= 2 or proc.poll() is not None)
        assert proc.poll() is None, "the run ended before the server could be stopped"
        before = _pg_count(url)
        pg.pg_ctl("stop", "-m", "immediate")
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    line = _one_error_line(err)
    assert url.split("@")[0] in line and "stopped taking writes" in line and "bench merge" in line
    kept = next(tmp_path.glob("results/unsaved-*.sqlite"))
    assert str(kept.resolve()) in line
    local = Store(f"sqlite:///{kept}", create=False)
    (run,) = local.list_runs()
    assert len(local.records(run.id)) >= 1
    pg.pg_ctl("start")
    # the merges in this process (CliRunner): they read and write stores, which a `bench` process (~3 CPU-s to start)
    # would not test any better
    merged = invoke("merge", str(kept), "--store", url)
    assert merged.exit_code == 0, merged.stderr
    added = int(merged.stdout.split(" runs and ")[1].split()[0])
    assert added == len(local.records(run.id)), merged.stdout            # the kept cases, none already there
    n = _pg_count(url)
    assert n >= before - 1 + added     # (the test server runs without fsync: its last commit may die with it)
    again = invoke("merge", str(kept), "--store", url)
    assert again.exit_code == 0 and _pg_count(url) == n            # merging twice adds nothing
    done = subprocess.run(_args(suite, url, "--resume"), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert _pg_count(url) == len(WIDTHS)
    assert _pg_count(url, "SELECT count(DISTINCT case_key) FROM cases") == len(WIDTHS)
    assert _pg_count(url, "SELECT count(*) FROM runs") == 1
