"""Results database: SQLite under results/ by default, any SQLAlchemy URL via ``--store``.

Append-only: one ``runs`` row per run, one ``cases`` row per finished case, committed as each
case finishes, so a killed run loses at most the case in flight. ``(run_id, case_key)`` is
unique, which makes resuming idempotent.
"""
from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from harness.errors import BenchInputError
from harness.spec import Record

DEFAULT_DB = Path("results") / "bench.sqlite"

metadata = sa.MetaData()
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("suite", sa.String(200), nullable=False),
    sa.Column("suite_path", sa.Text),
    sa.Column("quick", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),       # running | done | failed
    sa.Column("n_cases", sa.Integer, nullable=False),
    sa.Column("started_at", sa.String(40), nullable=False),
    sa.Column("finished_at", sa.String(40)),
    sa.Column("env", sa.JSON, nullable=False),
    sa.Column("options", sa.JSON, nullable=False),
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
        self.url = url or default_url()
        try:
            parsed = sa.make_url(self.url)
        except ArgumentError:
            raise BenchInputError(f"not a database URL: {self.url!r}", where="--store") from None
        if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
            db = Path(parsed.database)
            if not db.exists() and not create:
                raise BenchInputError(f"no results store at {db} (run `bench run` first)", where="--store")
            if create:
                try:
                    db.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise BenchInputError(f"cannot create {db.parent}: {exc.strerror}", where="--store") from None
        try:
            self.engine = sa.create_engine(self.url)
            if create:
                metadata.create_all(self.engine)
            else:
                with self.engine.connect() as conn:
                    missing = {"runs", "cases"} - set(sa.inspect(conn).get_table_names())
                if missing:
                    raise BenchInputError(f"{self.url} is not a bench results store", where="--store")
        except (DatabaseError, OperationalError) as exc:
            raise BenchInputError(f"cannot open results store {self.url}: {exc.orig}", where="--store") from None
        except ImportError as exc:
            raise BenchInputError(f"no driver for {self.url}: {exc}", where="--store") from None
        except ArgumentError as exc:     # NoSuchModuleError: an unknown dialect or driver name
            raise BenchInputError(f"no database driver for {self.url}: {exc}", where="--store") from None

    # -- writing ---------------------------------------------------------------------------
    def create_run(self, suite: str, suite_path: str, quick: bool, n_cases: int,
                   env: dict[str, Any], options: dict[str, Any]) -> str:
        run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        with self.engine.begin() as conn:
            conn.execute(runs.insert().values(
                id=run_id, suite=suite, suite_path=suite_path, quick=quick, status="running",
                n_cases=n_cases, started_at=_now(), env=env, options=options))
        return run_id

    def add_record(self, run_id: str, rec: Record) -> bool:
        """Insert one finished case; returns False if this case was already stored for the run."""
        row = asdict(rec)
        row.update(run_id=run_id, finished_at=_now())
        try:
            with self.engine.begin() as conn:
                conn.execute(cases.insert().values(**row))
        except sa.exc.IntegrityError:
            return False
        return True

    def finish_run(self, run_id: str, status: str = "done") -> None:
        with self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status=status, finished_at=_now()))

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

    def list_runs(self, suite: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Runs, newest first, with the number of stored cases."""
        n = sa.select(sa.func.count()).where(cases.c.run_id == runs.c.id).scalar_subquery()
        q = sa.select(runs, n.label("stored")).order_by(runs.c.started_at.desc(), runs.c.id.desc())
        if suite:
            q = q.where(runs.c.suite == suite)
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def get_run(self, ref: str) -> dict[str, Any]:
        """A run by id (or unique id prefix) or ``latest``."""
        all_runs = self.list_runs()
        if ref == "latest":
            if not all_runs:
                raise BenchInputError("the store has no runs yet", where="RUN")
            return all_runs[0]
        hits = [r for r in all_runs if r["id"] == ref] or [r for r in all_runs if r["id"].startswith(ref)]
        if len(hits) != 1:
            raise BenchInputError(f"{'no' if not hits else 'more than one'} run matches {ref!r}", where="RUN")
        return hits[0]

    def records(self, run_id: str) -> list[dict[str, Any]]:
        q = sa.select(cases).where(cases.c.run_id == run_id).order_by(cases.c.id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def stored_keys(self, run_id: str) -> set[str]:
        q = sa.select(cases.c.case_key).where(cases.c.run_id == run_id)
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(q)}

    def resumable(self, suite: str, quick: bool) -> dict[str, Any] | None:
        """The newest run of ``suite`` at the same size (finished or not), if any."""
        return next((r for r in self.list_runs(suite) if r["quick"] == quick), None)
