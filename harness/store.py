"""Results database: SQLite under results/ by default, any SQLAlchemy URL via ``--store``.

Append-only: one ``runs`` row per run, one ``cases`` row per finished case, committed as each
case finishes, so a killed run loses at most the case in flight. ``(run_id, case_key)`` is
unique, which makes resuming idempotent. Rows are read as the typed records of
:mod:`harness.records`; the schema is versioned (``bench_meta``) and an older store is upgraded
in place when opened for writing, or read through :mod:`harness.migrations` when opened to read.
"""
from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from harness.errors import BenchInputError
from harness.migrations import MIGRATIONS, columns_at, upgrade_row
from harness.records import SCHEMA_VERSION, CaseRecord, RunRecord, SuiteSpec

DEFAULT_DB = Path("results") / "bench.sqlite"

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


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def default_url() -> str:
    return f"sqlite:///{DEFAULT_DB}"


class Store:
    """A handle on the results database; every problem opening it is a BenchInputError."""

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        """``create``: make the file and tables if missing and upgrade an older store in place (for
        writing); otherwise the store must exist and is only read (an older schema through migrations)."""
        self.url = url or default_url()
        self.folder: Path | None = None
        """The folder of a SQLite store's file (where its runs' reports go by default); None otherwise."""
        try:
            parsed = sa.make_url(self.url)
        except ArgumentError:
            raise BenchInputError(f"not a database URL: {self.url!r}", where="--store") from None
        if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
            db = Path(parsed.database)
            self.folder = db.parent
            if not db.exists() and not create:
                raise BenchInputError(f"no results store at {db} (run `bench run` first)", where="--store")
            if create:
                try:
                    db.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise BenchInputError(f"cannot create {db.parent}: {exc.strerror}", where="--store") from None
        try:
            self.engine = sa.create_engine(self.url)
            with self.engine.connect() as conn:
                tables = set(sa.inspect(conn).get_table_names())
            if not {"runs", "cases"} <= tables:
                if not create:
                    raise BenchInputError(f"{self.url} is not a bench results store", where="--store")
                metadata.create_all(self.engine)
                self._set_version(SCHEMA_VERSION)
                tables = {"runs", "cases", "bench_meta"}
            self.version = self._read_version(tables)
            if self.version > SCHEMA_VERSION:
                raise BenchInputError(f"{self.url} was written by a newer bench (schema {self.version}; this "
                                      f"bench reads up to {SCHEMA_VERSION}): upgrade bench", where="--store")
            if create and self.version < SCHEMA_VERSION:
                self._migrate()
            if create:
                metadata.create_all(self.engine)       # tables added since (e.g. experiments in an old store)
        except (DatabaseError, OperationalError) as exc:
            raise BenchInputError(f"cannot open results store {self.url}: {exc.orig}", where="--store") from None
        except ImportError as exc:
            raise BenchInputError(f"no driver for {self.url}: {exc}", where="--store") from None
        except ArgumentError as exc:     # NoSuchModuleError: an unknown dialect or driver name
            raise BenchInputError(f"no database driver for {self.url}: {exc}", where="--store") from None

    # -- schema ------------------------------------------------------------------------------
    def _read_version(self, tables: set[str]) -> int:
        if "bench_meta" not in tables:
            return 1                                       # the first release had no version table
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
        return int(value) if value is not None else 1

    def _set_version(self, version: int) -> None:
        meta.create(self.engine, checkfirst=True)
        with self.engine.begin() as conn:
            conn.execute(meta.delete().where(meta.c.key == "schema_version"))
            conn.execute(meta.insert().values(key="schema_version", value=str(version)))

    def _migrate(self) -> None:
        """Upgrade this store in place to SCHEMA_VERSION, one migration at a time, each in a transaction."""
        for m in MIGRATIONS:
            if m.to <= self.version:
                continue
            with self.engine.begin() as conn:
                for statement in m.ddl:
                    conn.execute(sa.text(statement))
                for table, kind in ((runs, "runs"), (cases, "cases")):
                    fn = getattr(m, kind)
                    key = table.c.id
                    present = [table.c[n] for n in columns_at(kind, [c.name for c in table.c], m.to)]
                    for r in conn.execute(sa.select(*present)).mappings():
                        row = dict(r)
                        new = fn(dict(row))
                        changed = {k: v for k, v in new.items() if k in table.c and row.get(k) != v}
                        if changed:
                            conn.execute(table.update().where(key == row["id"]).values(**changed))
            self._set_version(m.to)
            self.version = m.to

    def _columns(self, table: sa.Table, kind: str) -> list[sa.Column]:
        return [table.c[n] for n in columns_at(kind, [c.name for c in table.c], self.version)]

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, suite: str, suite_path: str, quick: bool, n_cases: int, env: dict[str, Any],
                   options: dict[str, Any], suite_text: str | None = None, spec: SuiteSpec | None = None) -> str:
        run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        with self.engine.begin() as conn:
            conn.execute(runs.insert().values(
                id=run_id, suite=suite, suite_path=suite_path, quick=quick, status="running",
                n_cases=n_cases, started_at=_now(), env=env, options=options, suite_text=suite_text,
                suite_spec=spec.to_dict() if spec is not None else None))
        return run_id

    def add_record(self, run_id: str, rec: CaseRecord) -> bool:
        """Insert one finished case; returns False if this case was already stored for the run."""
        row = asdict(rec)
        row.update(run_id=run_id, finished_at=_now(), samples_s=list(rec.samples_s), config=dict(rec.config),
                   workload=dict(rec.workload), metrics=dict(rec.metrics), rounds=list(rec.rounds),
                   group_key=rec.group, sdpa_backend=rec.sdpa_backend)
        del row["group"]
        try:
            with self.engine.begin() as conn:
                conn.execute(cases.insert().values(**row))
        except sa.exc.IntegrityError:
            return False
        return True

    def finish_run(self, run_id: str, status: str = "done") -> None:
        with self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status=status, finished_at=_now()))

    def update_options(self, run_id: str, **items: Any) -> None:
        """Merge ``items`` into a run's stored options (e.g. ``overhead``, known once its cases ran)."""
        with self.engine.begin() as conn:
            options = conn.execute(sa.select(runs.c.options).where(runs.c.id == run_id)).scalar_one()
            conn.execute(runs.update().where(runs.c.id == run_id).values(options={**(options or {}), **items}))

    def reopen_run(self, run_id: str, n_cases: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status="running", n_cases=n_cases))

    def add_experiment(self, name: str, quick: bool, seeds: list[int], env: dict[str, Any],
                       result: dict[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(experiments.insert().values(name=name, quick=quick, seeds=seeds, env=env, result=result,
                                                     finished_at=_now()))

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
                     n_cases=int(row["n_cases"]), started_at=row["started_at"], env=row["env"] or {},
                     options=row["options"] or {}, suite_path=row.get("suite_path") or "",
                     finished_at=row.get("finished_at") or "", stored=int(row.get("stored") or 0),
                     suite_text=row.get("suite_text"), spec=SuiteSpec.from_dict(spec) if spec is not None else None)


def with_run_id(rec: CaseRecord, run_id: str) -> CaseRecord:
    return replace(rec, run_id=run_id)
