"""Results database: SQLite under results/ by default, any SQLAlchemy URL via ``--store``.

Append-only: one ``runs`` row per run, one ``cases`` row per finished case, committed as each
case finishes, so a killed run loses at most the case in flight. ``(run_id, case_key)`` is
unique, which makes resuming idempotent. Rows are read as the typed records of
:mod:`harness.contract.records`; the schema is versioned (``bench_meta``) and an older store is upgraded
in place when opened for writing, or read through :mod:`harness.store.migrations` when opened to read.

Many writers at once (two ``bench run``s, a team's runs into one PostgreSQL database) lose nothing:

- SQLite runs in WAL mode with a busy timeout on every connection, and every write transaction takes the
  write lock when it begins (``BEGIN IMMEDIATE``), so a writer waits its turn rather than failing; the
  schema is created or upgraded in one such transaction (on PostgreSQL: under an advisory lock).
- A write that still meets ``database is locked`` or a PostgreSQL serialization failure or deadlock is
  retried with backoff (:func:`retrying`).
- Run ids are ``YYYYMMDD-HHMMSS-`` plus 8 random hex digits, inserted under the primary key: a collision is
  detected and a new id drawn, never merged into another run. Older ids (4 hex digits) read as before.
- One driver per run at a time: a lease (``run_leases``, schema 5) is taken when a run is created or resumed
  and released when its execution ends. Another ``--resume`` of a run whose lease is held by a live driver
  is refused in one line (:class:`RunBusyError`). A lease is stale, and taken over, when its holder is gone:
  on the same host, its process (pid and start time) no longer exists; from another host, its heartbeat
  (every :data:`LEASE_HEARTBEAT_S`) is older than :data:`LEASE_TTL_S`.
"""
from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import random
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, IntegrityError, OperationalError

from harness.contract.errors import BenchInputError
from harness.contract.secrets import hide_passwords, hide_passwords_in
from harness.store.migrations import MIGRATIONS, columns_at, upgrade_row
from harness.contract.records import SCHEMA_VERSION, CaseRecord, RunRecord, SuiteSpec

log = logging.getLogger("bench")

DEFAULT_DB = Path("results") / "bench.sqlite"
BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite connection waits for another writer's lock before ``database is locked``."""
RETRY_FOR_S = float(os.environ.get("BENCH_STORE_RETRY_S", "60"))
"""How long a write keeps retrying a transient failure (locked, serialization failure, deadlock, a database server
restarting); environment variable ``BENCH_STORE_RETRY_S``."""
LEASE_HEARTBEAT_S = 15.0
"""How often a driver renews the leases it holds."""
LEASE_TTL_S = 120.0
"""A lease held from another host whose heartbeat is older than this is stale (its driver is presumed gone)."""
_SCHEMA_LOCK = 0x62656E6368     # PostgreSQL advisory lock key ("bench") held while the schema is created or upgraded

metadata = sa.MetaData()
meta = sa.Table(
    "bench_meta", metadata,
    sa.Column("key", sa.String(40), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),
)
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("suite", sa.String(200), nullable=False),
    sa.Column("suite_path", sa.Text),
    sa.Column("quick", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),       # running | done | interrupted
    sa.Column("n_cases", sa.Integer, nullable=False),
    sa.Column("started_at", sa.String(40), nullable=False),
    sa.Column("finished_at", sa.String(40)),
    sa.Column("env", sa.JSON, nullable=False),
    sa.Column("options", sa.JSON, nullable=False),
    sa.Column("suite_text", sa.Text),                          # schema 2
    sa.Column("suite_spec", sa.JSON),                          # schema 2
    sa.Column("invocation", sa.JSON),                          # schema 6
)
cases = sa.Table(
    "cases", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id"), nullable=False, index=True),
    sa.Column("case_key", sa.String(40), nullable=False),
    sa.Column("suite", sa.String(200), nullable=False),
    sa.Column("line", sa.String(200), nullable=False),
    sa.Column("arch", sa.String(200), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("workload", sa.JSON, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=False),
    sa.Column("samples_s", sa.JSON, nullable=False),
    sa.Column("duration_s", sa.Float, nullable=False),
    sa.Column("finished_at", sa.String(40), nullable=False),
    sa.Column("rounds", sa.JSON),                              # schema 3
    sa.Column("group_key", sa.String(80)),                     # schema 3
    sa.Column("sdpa_backend", sa.String(80)),                  # schema 4
    sa.UniqueConstraint("run_id", "case_key", name="uq_case_per_run"),
)
experiments = sa.Table(
    "experiments", metadata,                                  # bench claims: one row per training experiment
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False, index=True),
    sa.Column("quick", sa.Boolean, nullable=False),
    sa.Column("seeds", sa.JSON, nullable=False),
    sa.Column("env", sa.JSON, nullable=False),
    sa.Column("result", sa.JSON, nullable=False),
    sa.Column("finished_at", sa.String(40), nullable=False),
)
run_leases = sa.Table(
    "run_leases", metadata,                                   # schema 5: the one driver of a run, while it runs
    sa.Column("run_id", sa.String(40), primary_key=True),
    sa.Column("owner", sa.String(120), nullable=False),        # host/pid/random: this lease, this holder
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_started", sa.Float, nullable=False),        # the holder's start time (epoch s): pid reuse
    sa.Column("acquired_at", sa.String(40), nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),          # epoch s of the holder's last renewal
)

T = TypeVar("T")


def _cause(exc: BaseException) -> str:
    """An exception's first line, passwords hidden: what a one-line store error says of its cause."""
    return hide_passwords((str(exc).strip().splitlines() or [type(exc).__name__])[0])


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def default_url() -> str:
    return f"sqlite:///{DEFAULT_DB}"


def new_run_id() -> str:
    """``YYYYMMDD-HHMMSS-`` (UTC, sortable) plus 8 random hex digits (32 bits from uuid4)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


class RunBusyError(BenchInputError):
    """Another live driver holds the run's lease (a second concurrent ``--resume``): refused, exit 2."""


class StoreWriteError(BenchInputError):
    """The store refused a write for good (after the retries): a server gone, a full disk, a read-only or corrupt
    file. One line naming the store and the cause (exit 2); :class:`harness.session.Run` keeps the cases locally."""

    def __init__(self, message: str) -> None:
        self.cause = message
        super().__init__(message, where="--store")


CONNECTION_LOST = ("server closed the connection", "connection refused", "could not connect", "connection timed out",
                   "terminating connection", "the database system is shutting down",
                   "the database system is starting up", "the database system is in recovery mode",
                   "consuming input failed", "connection is lost", "connection already closed",
                   "no connection to the server", "ssl syscall error", "connection reset")
"""Words of a driver error that mean the connection to the database server was lost or refused (a restart)."""


def transient(exc: BaseException) -> bool:
    """Whether a database error is worth retrying: SQLite's ``database is locked``/busy, PostgreSQL's
    serialization failure (40001), deadlock (40P01) or lock not available (55P03)."""
    if not isinstance(exc, DBAPIError) or isinstance(exc, IntegrityError):
        return False
    state = getattr(exc.orig, "sqlstate", None) or ""
    if state in ("40001", "40P01", "55P03", "57P01", "57P02", "57P03") or state.startswith("08"):
        return True                     # ... and 57P0x / class 08: the server shut down, restarting, or unreachable
    if exc.connection_invalidated:
        return True
    msg = str(exc.orig).lower()
    return isinstance(exc, OperationalError) and ("database is locked" in msg or "database table is locked" in msg
                                                  or "database is busy" in msg
                                                  or any(words in msg for words in CONNECTION_LOST))


def retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (one whole transaction) again, with jittered exponential backoff, while it fails transiently
    (:func:`transient`: a lock, a serialization failure, a server restarting), for up to :data:`RETRY_FOR_S`. An
    IntegrityError propagates (callers use it); any other database error, or the last transient one, becomes
    :class:`StoreWriteError` naming the store (``args[0].shown``: its password hidden) and the cause."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        deadline, delay = time.monotonic() + RETRY_FOR_S, 0.02
        while True:
            try:
                return fn(*args, **kwargs)
            except IntegrityError:
                raise
            except DBAPIError as exc:
                if not transient(exc) or time.monotonic() + delay > deadline:
                    url = getattr(args[0], "shown", "?") if args else "?"
                    cause = _cause(exc.orig)
                    raise StoreWriteError(f"cannot write to results store {url}: {cause}") from None
                log.debug("%s: %s; retrying in %.2f s", fn.__name__, hide_passwords(str(exc.orig)), delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(2 * delay, 1.0)
    return wrapper


def _sqlite_connections(engine: sa.Engine, wal: bool) -> None:
    """Every SQLite connection: a busy timeout, WAL (a file store opened for writing; the mode is kept in the
    file), and transactions begun by us: ``BEGIN IMMEDIATE`` for writes (the lock taken up front, so a
    writer waits its turn instead of failing to upgrade a read), a plain ``BEGIN`` for reads."""
    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None          # the driver begins nothing by itself (see _begin)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if wal:
            cur.execute("PRAGMA journal_mode = WAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("bench_write") else "BEGIN")


@dataclass(frozen=True)
class Lease:
    """Who holds a run: ``owner`` (host/pid/random), its host, pid and start time, and its last heartbeat."""

    run_id: str
    owner: str
    host: str
    pid: int
    pid_started: float
    acquired_at: str
    heartbeat: float

    def live(self, now: float | None = None) -> bool:
        """Whether the holder may still be running: on this host, its process (same pid, same start time)
        exists and is not this process; elsewhere, its heartbeat is younger than LEASE_TTL_S."""
        if self.host != socket.gethostname():
            return (time.time() if now is None else now) - self.heartbeat < LEASE_TTL_S
        if self.pid == os.getpid():
            return False                          # this process: a lease it left behind is its own to take
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.pid_started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def describe(self) -> str:
        seen = max(0.0, time.time() - self.heartbeat)
        return f"pid {self.pid} on {self.host} (since {self.acquired_at}, last seen {seen:.0f} s ago)"


def _my_lease_row(run_id: str) -> dict[str, Any]:
    pid = os.getpid()
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0
    host = socket.gethostname()
    return {"run_id": run_id, "owner": f"{host[:80]}/{pid}/{uuid.uuid4().hex[:12]}", "host": host, "pid": pid,
            "pid_started": started, "acquired_at": _now(), "heartbeat": time.time()}


def _unwritable(db: Path) -> str:
    """Why a SQLite store file cannot be written here ("" if it can): its file system is read-only, the file is
    read-only, or its folder is (SQLite keeps its journal and shared memory beside the file)."""
    folder = db.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"its file system ({folder}) is mounted read-only"
    except OSError:
        pass
    if db.exists() and not os.access(db, os.W_OK):
        return "the file is read-only"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is read-only (SQLite writes its journal beside the file)"
    return ""


def _read_version(conn: sa.Connection, tables: set[str]) -> int:
    if "bench_meta" not in tables:
        return 1                                       # the first release had no version table
    value = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    return int(value) if value is not None else 1


def _set_version(conn: sa.Connection, version: int) -> None:
    meta.create(conn, checkfirst=True)
    conn.execute(meta.delete().where(meta.c.key == "schema_version"))
    conn.execute(meta.insert().values(key="schema_version", value=str(version)))


def _migrate(conn: sa.Connection, version: int) -> int:
    """Upgrade a store at ``version`` to SCHEMA_VERSION inside the caller's transaction (all or nothing)."""
    for m in MIGRATIONS:
        if m.to <= version:
            continue
        for statement in m.ddl:
            conn.execute(sa.text(statement))
        for table, kind in ((runs, "runs"), (cases, "cases")):
            fn = getattr(m, kind)
            present = [table.c[n] for n in columns_at(kind, [c.name for c in table.c], m.to)]
            for r in conn.execute(sa.select(*present)).mappings().all():
                row = dict(r)
                new = fn(dict(row))
                changed = {k: v for k, v in new.items() if k in table.c and row.get(k) != v}
                if changed:
                    conn.execute(table.update().where(table.c.id == row["id"]).values(**changed))
        _set_version(conn, m.to)
        version = m.to
    return version


class Store:
    """A handle on the results database; every problem opening it is a BenchInputError."""

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        """``create``: make the file and tables if missing and upgrade an older store in place (for
        writing); otherwise the store must exist and is only read (an older schema through migrations)."""
        self.url = url or default_url()
        """The URL connected to, password included: never print it; :attr:`shown` is what messages show."""
        self.shown = hide_passwords(self.url)
        """The URL with its password hidden (:func:`harness.contract.secrets.hide_passwords`)."""
        self.folder: Path | None = None
        """The folder of a SQLite store's file (where its runs' reports go by default); None otherwise."""
        self._held: dict[str, str] = {}          # run_id -> owner of the leases this handle holds
        self._held_lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        try:
            parsed = sa.make_url(self.url)
        except ArgumentError:
            raise BenchInputError(f"not a database URL: {self.shown!r}", where="--store") from None
        is_file = parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:")
        if is_file:
            db = Path(parsed.database)
            self.folder = db.parent
            if not db.exists() and not create:
                raise BenchInputError(f"no results store at {db} (run `bench run` first)", where="--store")
            if create:
                try:
                    db.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise BenchInputError(f"cannot create {db.parent}: {exc.strerror}", where="--store") from None
                problem = _unwritable(db)
                if problem:
                    raise BenchInputError(f"cannot write to results store {self.shown}: {problem}", where="--store")
        try:
            if is_file and not create and not (os.access(db, os.W_OK) and os.access(db.parent, os.W_OK)):
                # a read-only copy: SQLite could not create the shared-memory file a WAL store's readers need
                uri = f"{db.resolve().as_uri()}?immutable=1"
                self.engine = sa.create_engine("sqlite://", creator=lambda: sqlite3.connect(
                    uri, uri=True, check_same_thread=False))
            else:       # pre-ping: a pooled connection that a server restart closed is replaced, not used
                self.engine = sa.create_engine(self.url, pool_pre_ping=not self.url.startswith("sqlite"))
            if self.engine.dialect.name == "sqlite":
                _sqlite_connections(self.engine, wal=create and is_file)
            self._writer = self.engine.execution_options(bench_write=True)
            self._has_leases = create        # (opened to read: only if the store has the table)
            if create:
                self.version = self._prepare()
            else:
                with self.engine.connect() as conn:
                    tables = set(sa.inspect(conn).get_table_names())
                    if not {"runs", "cases"} <= tables:
                        raise BenchInputError(f"{self.shown} is not a bench results store", where="--store")
                    self.version = _read_version(conn, tables)
                    self._has_leases = "run_leases" in tables
                self._check_not_newer(self.version)
        except (DatabaseError, OperationalError) as exc:
            raise BenchInputError(f"cannot open results store {self.shown}: {_cause(exc.orig)}",
                                  where="--store") from None
        except StoreWriteError as exc:
            raise BenchInputError(exc.cause.replace("cannot write to", "cannot open"), where="--store") from None
        except ImportError as exc:
            raise BenchInputError(f"no driver for {self.shown}: {_cause(exc)}", where="--store") from None
        except ArgumentError as exc:     # NoSuchModuleError: an unknown dialect or driver name
            raise BenchInputError(f"no database driver for {self.shown}: {_cause(exc)}", where="--store") from None

    @contextmanager
    def _write(self, schema: bool = False) -> Iterator[sa.Connection]:
        """One write transaction (SQLite: BEGIN IMMEDIATE). ``schema``: also serialize with every other process
        creating or upgrading this store (SQLite's write lock does; PostgreSQL takes an advisory lock)."""
        with self._writer.begin() as conn:
            if schema and conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
            yield conn

    # -- schema ------------------------------------------------------------------------------
    @retrying
    def _prepare(self) -> int:
        """Create the tables, or upgrade an older store in place, in one serialized transaction; the version."""
        with self._write(schema=True) as conn:
            tables = set(sa.inspect(conn).get_table_names())
            if not {"runs", "cases"} <= tables:
                metadata.create_all(conn)
                _set_version(conn, SCHEMA_VERSION)
                return SCHEMA_VERSION
            version = _read_version(conn, tables)
            self._check_not_newer(version)
            if version < SCHEMA_VERSION:
                version = _migrate(conn, version)
            metadata.create_all(conn)       # tables added since (e.g. experiments in an old store)
        return version

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise BenchInputError(f"{self.shown} was written by a newer bench (schema {version}; this "
                                  f"bench reads up to {SCHEMA_VERSION}): upgrade bench", where="--store")

    def _columns(self, table: sa.Table, kind: str) -> list[sa.Column]:
        return [table.c[n] for n in columns_at(kind, [c.name for c in table.c], self.version)]

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, suite: str, suite_path: str, quick: bool, n_cases: int, env: dict[str, Any],
                   options: dict[str, Any], suite_text: str | None = None, spec: SuiteSpec | None = None,
                   *, lease: bool = False, run_id: str | None = None,
                   invocation: dict[str, Any] | None = None) -> str:
        """A new run (status ``running``); its id; ``invocation``: the command and options that made it
        (:attr:`harness.contract.records.RunRecord.invocation`). ``lease``: this handle also becomes its one driver, in the
        same transaction (release it with :meth:`release_run`). An id that is taken is drawn again, unless it was
        given (``run_id``: the same run in another store, e.g. a fallback file)."""
        for _ in range(10 if run_id is None else 1):
            run_id = run_id or new_run_id()
            row = _my_lease_row(run_id) if lease else None
            try:
                self._insert_run(dict(
                    id=run_id, suite=suite, suite_path=suite_path, quick=quick, status="running",
                    n_cases=n_cases, started_at=_now(), env=env, options=options, suite_text=suite_text,
                    suite_spec=spec.to_dict() if spec is not None else None, invocation=invocation or {}), row)
            except IntegrityError:
                log.debug("run id %s is taken; drawing another", run_id)
                run_id = None
                continue
            if row is not None:
                self._hold(run_id, row["owner"])
            return run_id
        raise RuntimeError("no free run id in 10 draws: the run-id generator is broken")

    @retrying
    def _insert_run(self, values: dict[str, Any], lease_row: dict[str, Any] | None) -> None:
        values = {**values, **{k: hide_passwords_in(values[k]) for k in ("options", "env", "invocation")}}
        with self._write() as conn:
            conn.execute(runs.insert().values(**values))
            if lease_row is not None:
                conn.execute(run_leases.insert().values(**lease_row))

    def add_record(self, run_id: str, rec: CaseRecord) -> bool:
        """Insert one finished case; returns False if this case was already stored for the run."""
        row = asdict(rec)
        row.update(run_id=run_id, finished_at=_now(), samples_s=list(rec.samples_s), config=dict(rec.config),
                   workload=dict(rec.workload), metrics=dict(rec.metrics), rounds=list(rec.rounds),
                   group_key=rec.group, sdpa_backend=rec.sdpa_backend)
        del row["group"]
        try:
            self._insert(cases, row)
        except IntegrityError:
            return False
        return True

    @retrying
    def _insert(self, table: sa.Table, row: dict[str, Any]) -> None:
        with self._write() as conn:
            conn.execute(table.insert().values(**row))

    @retrying
    def finish_run(self, run_id: str, status: str = "done") -> None:
        with self._write() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status=status, finished_at=_now()))

    @retrying
    def update_options(self, run_id: str, **items: Any) -> None:
        """Merge ``items`` into a run's stored options (e.g. ``overhead``, known once its cases ran)."""
        with self._write() as conn:
            options = conn.execute(sa.select(runs.c.options).where(runs.c.id == run_id).with_for_update()
                                   ).scalar_one()
            conn.execute(runs.update().where(runs.c.id == run_id).values(
                options=hide_passwords_in({**(options or {}), **items})))

    @retrying
    def reopen_run(self, run_id: str, n_cases: int) -> None:
        with self._write() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status="running", n_cases=n_cases))

    def add_experiment(self, name: str, quick: bool, seeds: list[int], env: dict[str, Any],
                       result: dict[str, Any]) -> None:
        self._insert(experiments, dict(name=name, quick=quick, seeds=seeds, env=env, result=result,
                                       finished_at=_now()))

    def merge_from(self, src: Store) -> tuple[int, int]:
        """Add ``src``'s runs and cases that this store lacks (a fallback file kept while this store was down):
        a run is matched by id, a case by (run, case key), so merging twice adds nothing. (runs added, cases added)"""
        have = {r.id for r in self.list_runs()}
        runs_added = cases_added = 0
        for run in reversed(src.list_runs()):                     # oldest first
            if run.id not in have:
                self._insert_run(dict(id=run.id, suite=run.suite, suite_path=run.suite_path, quick=run.quick,
                                      status=run.status, n_cases=run.n_cases, started_at=run.started_at,
                                      finished_at=run.finished_at or None, env=run.env, options=run.options,
                                      suite_text=run.suite_text,
                                      suite_spec=run.spec.to_dict() if run.spec is not None else None,
                                      invocation=dict(run.invocation)), None)
                runs_added += 1
            for rec in src.records(run.id):
                cases_added += self.add_record(run.id, rec)
        return runs_added, cases_added

    # -- leases: one driver per run ------------------------------------------------------------
    def claim_run(self, run_id: str) -> None:
        """Become the one driver of ``run_id`` (to resume it), or raise :class:`RunBusyError` (one line) if a
        live driver holds it. A stale lease (see the module docstring) is taken over, atomically: of two
        processes taking over the same stale lease, one wins and the other sees the winner's live lease."""
        for _ in range(10):
            row = _my_lease_row(run_id)
            try:
                self._insert(run_leases, row)
                self._hold(run_id, row["owner"])
                return
            except IntegrityError:
                pass
            held = self.lease(run_id)
            if held is None:
                continue                        # released in between: insert again
            if held.live():
                raise RunBusyError(f"run {run_id} is being measured by {held.describe()}: let it finish, or start "
                                   "a new run without --resume", where="--resume")
            if self._take_over(held, row):
                if (held.host, held.pid) != (row["host"], row["pid"]):
                    log.warning("run %s: took over the lease of %s, gone", run_id, held.describe())
                self._hold(run_id, row["owner"])
                return
        raise RunBusyError(f"run {run_id}: its lease kept changing hands; try again", where="--resume")

    @retrying
    def _take_over(self, stale: Lease, row: dict[str, Any]) -> bool:
        """Replace the lease ``stale`` by ``row`` only if it is still exactly ``stale`` (no one renewed or took it)."""
        with self._write() as conn:
            done = conn.execute(run_leases.update().where(
                run_leases.c.run_id == stale.run_id, run_leases.c.owner == stale.owner,
                run_leases.c.heartbeat == stale.heartbeat).values(**row))
            return done.rowcount == 1

    def release_run(self, run_id: str) -> None:
        """Give up this handle's lease on ``run_id`` (nothing if it holds none); never raises (a lease left
        behind goes stale when this process ends)."""
        with self._held_lock:
            owner = self._held.pop(run_id, None)
        if owner is None:
            return
        try:
            self._delete_lease(run_id, owner)
        except Exception as exc:  # noqa: BLE001 — the run's results are stored; the lease will go stale
            log.warning("could not release the lease on run %s: %s", run_id, hide_passwords(str(exc)))

    @retrying
    def _delete_lease(self, run_id: str, owner: str) -> None:
        with self._write() as conn:
            conn.execute(run_leases.delete().where(run_leases.c.run_id == run_id, run_leases.c.owner == owner))

    def lease(self, run_id: str) -> Lease | None:
        """The lease on ``run_id``, if any (live or stale)."""
        if not self._has_leases:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(run_leases).where(run_leases.c.run_id == run_id)).mappings().first()
        return Lease(**dict(row)) if row is not None else None

    def _hold(self, run_id: str, owner: str) -> None:
        """Remember a lease this handle holds and keep it renewed by the heartbeat thread."""
        with self._held_lock:
            self._held[run_id] = owner
            if self._heartbeat is None or not self._heartbeat.is_alive():
                self._heartbeat = threading.Thread(target=self._renew_leases, name="bench-lease-heartbeat",
                                                   daemon=True)
                self._heartbeat.start()

    def _renew_leases(self) -> None:
        """Every LEASE_HEARTBEAT_S, renew the leases this handle holds; end when it holds none."""
        while True:
            time.sleep(LEASE_HEARTBEAT_S)
            with self._held_lock:
                held = dict(self._held)
                if not held:
                    self._heartbeat = None
                    return
            for run_id, owner in held.items():
                try:
                    renewed = self._renew(run_id, owner)
                except Exception as exc:  # noqa: BLE001 — a missed heartbeat is not fatal; the next may pass
                    log.warning("could not renew the lease on run %s: %s", run_id, hide_passwords(str(exc)))
                    continue
                if not renewed:
                    log.warning("run %s: its lease was taken over by another driver", run_id)
                    with self._held_lock:
                        if self._held.get(run_id) == owner:
                            del self._held[run_id]

    @retrying
    def _renew(self, run_id: str, owner: str) -> bool:
        with self._write() as conn:
            done = conn.execute(run_leases.update().where(run_leases.c.run_id == run_id, run_leases.c.owner == owner)
                                .values(heartbeat=time.time()))
            return done.rowcount == 1

    # -- reading ---------------------------------------------------------------------------
    def find_experiment(self, name: str, quick: bool, seeds: list[int],
                        hard_env: dict[str, Any]) -> dict[str, Any] | None:
        """The newest stored result of experiment ``name`` at this size, seeds and hard environment."""
        q = (sa.select(experiments).where(experiments.c.name == name, experiments.c.quick == quick)
             .order_by(experiments.c.id.desc()))
        with self.engine.connect() as conn:
            for r in conn.execute(q):
                row = dict(r._mapping)
                if row["seeds"] == seeds and row["env"].get("hard") == hard_env:
                    return row
        return None

    def list_runs(self, suite: str | None = None, limit: int | None = None) -> list[RunRecord]:
        """Runs, newest first, with the number of stored cases."""
        n = sa.select(sa.func.count()).where(cases.c.run_id == runs.c.id).scalar_subquery()
        q = sa.select(*self._columns(runs, "runs"), n.label("stored")).order_by(runs.c.started_at.desc(),
                                                                               runs.c.id.desc())
        if suite:
            q = q.where(runs.c.suite == suite)
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_run(upgrade_row("runs", dict(r._mapping), self.version)) for r in conn.execute(q)]

    def get_run(self, ref: str) -> RunRecord:
        """A run by id (or unique id prefix) or ``latest``."""
        all_runs = self.list_runs()
        if ref == "latest":
            if not all_runs:
                raise BenchInputError("the store has no runs yet", where="RUN")
            return all_runs[0]
        hits = [r for r in all_runs if r.id == ref] or [r for r in all_runs if r.id.startswith(ref)]
        if len(hits) != 1:
            raise BenchInputError(f"{'no' if not hits else 'more than one'} run matches {ref!r}", where="RUN")
        return hits[0]

    def records(self, run_id: str) -> list[CaseRecord]:
        q = sa.select(*self._columns(cases, "cases")).where(cases.c.run_id == run_id).order_by(cases.c.id)
        with self.engine.connect() as conn:
            return [_case(upgrade_row("cases", dict(r._mapping), self.version)) for r in conn.execute(q)]

    def stored_keys(self, run_id: str) -> set[str]:
        q = sa.select(cases.c.case_key).where(cases.c.run_id == run_id)
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(q)}

    def resumable(self, suite: str, quick: bool) -> RunRecord | None:
        """The newest run of ``suite`` at the same size (finished or not), if any."""
        return next((r for r in self.list_runs(suite) if r.quick == quick), None)


_CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
                "duration_s", "run_id", "finished_at")


def _case(row: dict[str, Any]) -> CaseRecord:
    return CaseRecord(**{k: row[k] for k in _CASE_FIELDS}, samples_s=tuple(row["samples_s"] or ()),
                      rounds=tuple(row.get("rounds") or ()), group=row.get("group_key") or "",
                      sdpa_backend=row.get("sdpa_backend") or "")


def _run(row: dict[str, Any]) -> RunRecord:
    spec = row.get("suite_spec")
    return RunRecord(id=row["id"], suite=row["suite"], quick=bool(row["quick"]), status=row["status"],
                     n_cases=int(row["n_cases"]), started_at=row["started_at"],
                     env=hide_passwords_in(row["env"] or {}), options=hide_passwords_in(row["options"] or {}),
                     suite_path=row.get("suite_path") or "",
                     finished_at=row.get("finished_at") or "", stored=int(row.get("stored") or 0),
                     suite_text=row.get("suite_text"), spec=SuiteSpec.from_dict(spec) if spec is not None else None,
                     invocation=hide_passwords_in(row.get("invocation") or {}))

