"""Results database: SQLite under results/ by default, any SQLAlchemy URL via ``--store``.

Append-only: one ``runs`` row per run, one ``cases`` row per finished case, committed as each
case finishes, so a killed run loses at most the case in flight. ``(run_id, case_key)`` is
unique, which makes resuming idempotent. Rows are read as the typed records of
:mod:`harness.contract.records`; the schema (:mod:`harness.store.schema`) is versioned and an older store is upgraded
in place when opened for writing, or read through :mod:`harness.store.migrations` when opened to read.

Many writers at once (two ``bench run``s, a team's runs into one PostgreSQL database) lose nothing:

- SQLite runs in WAL mode with a busy timeout on every connection, and every write transaction takes the
  write lock when it begins (``BEGIN IMMEDIATE``), so a writer waits its turn rather than failing; the
  schema is created or upgraded in one such transaction (on PostgreSQL: under an advisory lock).
- A write that still meets ``database is locked`` or a PostgreSQL serialization failure or deadlock is
  retried with backoff (:func:`harness.store.retry.retrying`).
- Run ids are ``YYYYMMDD-HHMMSS-`` plus 8 random hex digits, inserted under the primary key: a collision is
  detected and a new id drawn, never merged into another run. Older ids (4 hex digits) read as before.
- One driver per run at a time: a lease is taken when a run is created or resumed and released when its execution
  ends (:mod:`harness.store.leases`).

The store holds runs and their cases. A client that keeps rows of its own in the same database (the claims' training
experiments) brings its table: :meth:`Store.add_table`, :meth:`Store.insert`, :meth:`Store.select`.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, OperationalError

from harness.contract.errors import BenchInputError
from harness.contract.records import SCHEMA_VERSION, CaseRecord, RunRecord, SuiteSpec
from harness.contract.secrets import hide_passwords, hide_passwords_in
from harness.store.leases import Lease, RunBusyError, RunLeases, lease_row
from harness.store.migrations import columns_at, upgrade_row
from harness.store.retry import StoreWriteError, cause, retrying
from harness.store.schema import (
    case_record,
    case_row,
    cases,
    metadata,
    migrate,
    read_version,
    run_leases,
    run_record,
    runs,
    set_version,
    timestamp,
)

__all__ = ["BUSY_TIMEOUT_MS", "DEFAULT_DB", "Lease", "RunBusyError", "Store", "StoreWriteError", "default_url",
           "new_run_id"]

log = logging.getLogger("bench")

DEFAULT_DB = Path("results") / "bench.sqlite"
BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite connection waits for another writer's lock before ``database is locked``."""
_SCHEMA_LOCK = 0x62656E6368     # PostgreSQL advisory lock key ("bench") held while the schema is created or upgraded


def default_url() -> str:
    return f"sqlite:///{DEFAULT_DB}"


def new_run_id() -> str:
    """``YYYYMMDD-HHMMSS-`` (UTC, sortable) plus 8 random hex digits (32 bits from uuid4)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


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
        self.writable = create
        """Whether this handle writes (``create``), or only reads."""
        self._client_tables: set[str] = set()    # the clients' tables known to be there (add_table)
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
            self.leases = RunLeases(self.engine, self._writer, self.shown, present=create)
            """The runs' leases (one driver per run): the store opened to read has them only if it has the table."""
            if create:
                self.version = self._prepare()
            else:
                with self.engine.connect() as conn:
                    tables = set(sa.inspect(conn).get_table_names())
                    if not {"runs", "cases"} <= tables:
                        raise BenchInputError(f"{self.shown} is not a bench results store", where="--store")
                    self.version = read_version(conn, tables)
                    self.leases.present = "run_leases" in tables
                self._check_not_newer(self.version)
        except (DatabaseError, OperationalError) as exc:
            raise BenchInputError(f"cannot open results store {self.shown}: {cause(exc.orig)}",
                                  where="--store") from None
        except StoreWriteError as exc:
            raise BenchInputError(exc.cause.replace("cannot write to", "cannot open"), where="--store") from None
        except ImportError as exc:
            raise BenchInputError(f"no driver for {self.shown}: {cause(exc)}", where="--store") from None
        except ArgumentError as exc:     # NoSuchModuleError: an unknown dialect or driver name
            raise BenchInputError(f"no database driver for {self.shown}: {cause(exc)}", where="--store") from None

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
                set_version(conn, SCHEMA_VERSION)
                return SCHEMA_VERSION
            version = read_version(conn, tables)
            self._check_not_newer(version)
            if version < SCHEMA_VERSION:
                version = migrate(conn, version)
            metadata.create_all(conn)       # the store's tables added since
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
            row = lease_row(run_id) if lease else None
            try:
                self._insert_run(dict(
                    id=run_id, suite=suite, suite_path=suite_path, quick=quick, status="running",
                    n_cases=n_cases, started_at=timestamp(), env=env, options=options, suite_text=suite_text,
                    suite_spec=spec.to_dict() if spec is not None else None, invocation=invocation or {}), row)
            except IntegrityError:
                log.debug("run id %s is taken; drawing another", run_id)
                run_id = None
                continue
            if row is not None:
                self.leases.hold(run_id, row["owner"])
            return run_id
        raise RuntimeError("no free run id in 10 draws: the run-id generator is broken")

    @retrying
    def _insert_run(self, values: dict[str, Any], lease: dict[str, Any] | None) -> None:
        values = {**values, **{k: hide_passwords_in(values[k]) for k in ("options", "env", "invocation")}}
        with self._write() as conn:
            conn.execute(runs.insert().values(**values))
            if lease is not None:
                conn.execute(run_leases.insert().values(**lease))

    def add_record(self, run_id: str, rec: CaseRecord) -> bool:
        """Insert one finished case; returns False if this case was already stored for the run."""
        try:
            self._insert(cases, case_row(run_id, rec, timestamp()))
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
            conn.execute(runs.update().where(runs.c.id == run_id).values(status=status, finished_at=timestamp()))

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
        """Become the one driver of ``run_id`` (to resume it), or raise :class:`RunBusyError` in one line if a live
        driver holds it (:meth:`harness.store.leases.RunLeases.claim`)."""
        self.leases.claim(run_id)

    def release_run(self, run_id: str) -> None:
        """Give up this handle's lease on ``run_id`` (nothing if it holds none); never raises."""
        self.leases.release(run_id)

    def lease(self, run_id: str) -> Lease | None:
        """The lease on ``run_id``, if any (live or stale)."""
        return self.leases.get(run_id)

    # -- tables of the store's clients -------------------------------------------------------
    def add_table(self, table: sa.Table) -> bool:
        """Give a client of the store a table of its own in the same database (declared in the client's own
        ``MetaData``, not one of the store's): made if missing when the store is open for writing, never on a store
        opened to read. Whether the table is there."""
        if table.metadata is metadata:
            raise ValueError(f"{table.name} is one of the store's own tables")
        if table.name not in self._client_tables:
            with self.engine.connect() as conn:
                there = sa.inspect(conn).has_table(table.name)
            if not there and self.writable:
                self._create(table)
                there = True
            if not there:
                return False
            self._client_tables.add(table.name)
        return True

    @retrying
    def _create(self, table: sa.Table) -> None:
        with self._write(schema=True) as conn:
            table.create(conn, checkfirst=True)

    def insert(self, table: sa.Table, row: dict[str, Any]) -> None:
        """Add ``row`` to a client's table (:meth:`add_table`), in one retried write transaction."""
        self._insert(table, row)

    def select(self, query: sa.Select) -> list[dict[str, Any]]:
        """The rows ``query`` reads (from a client's table), each as a dict of its columns."""
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- reading ---------------------------------------------------------------------------
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
            return [run_record(upgrade_row("runs", dict(r._mapping), self.version)) for r in conn.execute(q)]

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
            return [case_record(upgrade_row("cases", dict(r._mapping), self.version)) for r in conn.execute(q)]

    def stored_keys(self, run_id: str) -> set[str]:
        q = sa.select(cases.c.case_key).where(cases.c.run_id == run_id)
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(q)}

    def resumable(self, suite: str, quick: bool) -> RunRecord | None:
        """The newest run of ``suite`` at the same size (finished or not), if any."""
        return next((r for r in self.list_runs(suite) if r.quick == quick), None)
