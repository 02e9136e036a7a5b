"""A throwaway PostgreSQL server for the tests (fixtures ``postgres``, ``postgres_url`` and ``store_url_of``).

Started once per test session from Debian's ``postgresql`` binaries (``/usr/lib/postgresql/*/bin``, newest
version, else ``pg_ctl`` on PATH), on a free 127.0.0.1 port, with its data and socket in a fresh temporary
folder, trust authentication and no fsync; stopped and removed when the session ends. PostgreSQL refuses to
run as root, so as root the server runs as the unprivileged system user ``bench-pg`` (created if missing;
``nobody`` if it cannot be). Each test gets a database of its own (``CREATE DATABASE``).

Without the binaries or the ``psycopg`` driver the PostgreSQL tests skip, unless ``BENCH_REQUIRE_POSTGRES=1``
(CI), where they fail. Import the fixtures into a test module to use them.
"""
from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRE_ENV = "BENCH_REQUIRE_POSTGRES"
OS_USER = "bench-pg"
ROLE = "bench"                   # the server's superuser role, which the tests connect as


def _unavailable(reason: str) -> None:
    """Skip, or fail where PostgreSQL is required (CI)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"PostgreSQL required ({REQUIRE_ENV}=1) but {reason}")
    pytest.skip(reason)


def bindir() -> Path | None:
    """The folder of initdb and pg_ctl: Debian's newest /usr/lib/postgresql/N/bin, else pg_ctl on PATH."""
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", Path(path).parent.name))
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.access(Path(folder) / "initdb", os.X_OK) and os.access(Path(folder) / "pg_ctl", os.X_OK):
            return Path(folder)
    found = shutil.which("pg_ctl")
    if found and (Path(found).parent / "initdb").exists():
        return Path(found).parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user() -> str | None:
    """As root: an unprivileged user to run the server as (created if missing); otherwise None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(OS_USER)
        return OS_USER
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", OS_USER], capture_output=True, text=True)
    if made.returncode == 0 or "already exists" in made.stderr:
        return OS_USER
    return "nobody"


@dataclass
class PostgresServer:
    """A running server: ``url(db)`` for SQLAlchemy, ``create_database()`` for a fresh database's URL."""

    bindir: Path
    root: Path
    port: int
    user: str | None          # the OS user the server runs as (None: this process's user)
    options: str = ""         # the postgres options it was started with (port, socket folder, ...)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its SQLAlchemy URL."""
        import psycopg
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={ROLE} dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _as_user(self, *cmd: str) -> list[str]:
        return ["runuser", "-u", self.user, "--", *cmd] if self.user else list(cmd)

    def start(self) -> None:
        data = self.root / "data"
        run = subprocess.run(self._as_user(str(self.bindir / "initdb"), "-D", str(data), "-U", ROLE, "-A", "trust",
                                           "-E", "UTF8", "--locale=C", "--no-sync"),
                             cwd=self.root, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"initdb failed: {run.stderr.strip()[-2000:]}")
        last = ""
        for _ in range(3):                            # a port taken between our probe and the server's bind
            self.port = _free_port()
            options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
            self.options = options
            run = subprocess.run(self._as_user(str(self.bindir / "pg_ctl"), "-D", str(data), "-l",
                                               str(self.root / "server.log"), "-o", options, "-w", "-t", "60",
                                               "start"), cwd=self.root, capture_output=True, text=True)
            if run.returncode == 0:
                return
            last = (self.root / "server.log").read_text()[-2000:] if (self.root / "server.log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {run.stderr.strip()} {last}")

    def pg_ctl(self, *args: str) -> None:
        """``pg_ctl -D DATA ARGS`` as the server's user (e.g. ``"restart", "-m", "fast"``, ``"stop", "-m", "fast"``);
        RuntimeError if it fails."""
        run = subprocess.run(self._as_user(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-l",
                                           str(self.root / "server.log"), "-w", "-t", "60", *args,
                                           *(("-o", self.options) if args[:1] == ("start",) else ())),
                             cwd=self.root, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {run.stderr.strip()}")

    def stop(self) -> None:
        if not self.root.exists():
            return
        subprocess.run(self._as_user(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                                     "-w", "stop"), cwd="/", capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


_server: PostgresServer | None = None
_failed: str | None = None


def server() -> PostgresServer:
    """The session's server, started on first use (once per process, whichever module asks first)."""
    global _server, _failed
    if _server is not None:
        return _server
    if _failed is not None:
        _unavailable(_failed)
    _server = new_server()
    return _server


def new_server() -> PostgresServer:
    """A server of its own (a test that restarts or stops it must not disturb the session's); stopped at exit."""
    global _failed
    folder = bindir()
    if folder is None:
        _failed = "no PostgreSQL binaries (Debian: apt-get install postgresql)"
        _unavailable(_failed)
    if importlib.util.find_spec("psycopg") is None:        # the driver of postgresql+psycopg URLs
        _failed = "no psycopg driver (pip install 'psycopg[binary]')"
        _unavailable(_failed)
    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="bench-pg-", dir="/tmp"))   # not under a 0700 root-owned pytest tmp dir
    if user:
        shutil.chown(root, user, None)
    candidate = PostgresServer(folder, root, 0, user)
    try:
        candidate.start()
    except (RuntimeError, OSError) as exc:
        candidate.stop()
        _failed = f"could not start PostgreSQL: {exc}"
        _unavailable(_failed)
    atexit.register(candidate.stop)
    return candidate


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    """The throwaway server (skips, or fails under BENCH_REQUIRE_POSTGRES=1, when it cannot run)."""
    return server()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A fresh, empty database on the throwaway server, as a SQLAlchemy URL."""
    return postgres.create_database()


BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(params=BACKENDS)
def store_url_of(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL on each backend: a SQLite file in tmp_path, a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    return request.getfixturevalue("postgres").create_database()
