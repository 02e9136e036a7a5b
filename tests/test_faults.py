"""Faults that hit the store under a run (harness.session.Run), each a real fault: a full disk, a read-only file and a
corrupt file (one line naming the store and the cause, exit 2, no traceback, the existing store never truncated).
The PostgreSQL faults (a restart, a server gone for good) are tests/test_faults_pg.py's. SIGKILL and SIGTERM of the
driver are tests/test_resume.py's and tests/test_cli.py's; a killed worker is tests/test_executor.py's."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.store.db import Store
from tests.helpers import invoke

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = str(Path(__file__).with_name("plugin_faulty.py"))
BENCH = [sys.executable, "-m", "cli"]
WIDTHS = [8, 12, 16, 24, 32, 40, 48, 56, 64, 72]


def _suite(folder: Path, name: str = "faults") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\nmetrics = ["latency"]\nfixed = {{ arch = "faulty", batch_size = 4 }}\n'
                    f"sweep = {{ width = {WIDTHS} }}\n")
    return path


def _args(suite: Path, url: str, *more: str) -> list[str]:
    """`bench run SUITE --quick` into ``url``, measured in bench's own process (the inline executor): these faults hit
    the store, which the run writes from its own process whichever executor measures; a worker process would only
    add its start (~3 CPU-s). Worker faults are tests/test_executor.py's and tests/test_resume.py's."""
    return [*BENCH, "run", str(suite), "--quick", "--plugin", PLUGIN, "--store", url, "--no-calibrate", "--no-report",
            "--executor", "inline", *more]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _pg_count(url: str, sql: str = "SELECT count(*) FROM cases") -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar() or 0)
    except sa.exc.DBAPIError:
        return 0
    finally:
        engine.dispose()


def _wait_for(pred, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("bench: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _checkpoint(db: Path) -> None:
    """Fold a WAL store's log into its file and close it (nothing left open on the file system)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def one_case_store(tmp_path_factory) -> Path:
    """A store holding one run of one case (suite "first"), measured once for the module by `bench run`; a test
    copies it to where its fault is (one `bench` start, ~4 CPU-s, for the two tests that need such a store)."""
    tmp = tmp_path_factory.mktemp("first")
    db = tmp / "first.sqlite"
    first = subprocess.run(_args(_suite(tmp, "first"), f"sqlite:///{db}", "--set", "width=8"), cwd=tmp, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    _checkpoint(db)
    return db


def test_a_full_disk_is_one_line_and_the_store_is_not_truncated(tmp_path, one_case_store):
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "1m"):
        pytest.skip("needs root to mount a small tmpfs (a full disk)")
    try:
        db = disk / "full.sqlite"
        url = f"sqlite:///{db}"
        shutil.copyfile(one_case_store, db)
        stored = Store(url, create=False)
        n_first = len(stored.records(stored.get_run("latest").id))
        stored.engine.dispose()
        size = db.stat().st_size
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * max(0, free - 40 * 1024))    # ~40 KB left: room for a case or two
        res = subprocess.run(_args(_suite(tmp_path), url), cwd=tmp_path, env=_env(BENCH_STORE_RETRY_S="1"),
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, res.stderr
        line = _one_error_line(res.stderr)
        assert str(db) in line and "full" in line
        assert db.stat().st_size >= size
        (disk / "filler").unlink()
        after = Store(url, create=False)
        runs = {r.suite: r for r in after.list_runs()}
        assert len(after.records(runs["first"].id)) == n_first              # the earlier run intact
        kept = list(tmp_path.glob("results/unsaved-*.sqlite"))
        if "stopped taking writes" in line:                                 # failed mid-run: the rest kept locally
            assert kept and str(kept[0].resolve()) in line
        after.engine.dispose()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_read_only_store_is_one_line_and_left_as_it_was(tmp_path, one_case_store):
    """Root writes any file whatever its mode: as root the store lives on a tmpfs remounted read-only; otherwise
    the file and its folder are made read-only."""
    disk = tmp_path / "ro"
    mounted = os.geteuid() == 0 and _mount_tmpfs(disk, "4m")
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("as root, a read-only store needs a tmpfs remounted read-only (mount refused here)")
        disk.mkdir(exist_ok=True)
    try:
        db = disk / "ro.sqlite"
        url = f"sqlite:///{db}"
        suite = _suite(tmp_path)
        shutil.copyfile(one_case_store, db)                                 # one case stored
        if mounted:
            assert subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode == 0
        else:
            for p in disk.iterdir():
                p.chmod(0o444)
            disk.chmod(0o555)
        content = db.read_bytes()
        res = subprocess.run(_args(suite, url), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 2, res.stderr
        line = _one_error_line(res.stderr)
        assert url in line and "readonly" in line.replace("read-only", "readonly").replace("read only", "readonly")
        assert db.read_bytes() == content
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        else:
            disk.chmod(0o755)


def test_a_corrupt_store_is_one_line_and_never_truncated(tmp_path, monkeypatch):
    """`bench run` in a process of its own (it loads the faulty plug-in, kept out of this process); `bench runs` and
    `bench merge` only open stores: in this process (CliRunner), the same error policy without a start-up each."""
    db = tmp_path / "corrupt.sqlite"
    content = os.urandom(8192)
    db.write_bytes(content)
    res = subprocess.run(_args(_suite(tmp_path), f"sqlite:///{db}"), cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=300)
    results = [(res.returncode, res.stderr)]
    monkeypatch.chdir(tmp_path)
    for args in (["runs", "--store", f"sqlite:///{db}"],
                 ["merge", str(db), "--store", f"sqlite:///{tmp_path / 'other.sqlite'}"]):
        here = invoke(*args)
        results.append((here.exit_code, here.stderr))
    for code, stderr in results:
        assert code == 2, stderr
        line = _one_error_line(stderr)
        assert "corrupt.sqlite" in line and "not a database" in line
        assert db.read_bytes() == content
