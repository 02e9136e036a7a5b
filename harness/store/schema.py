"""The store's schema: its tables, its version (``bench_meta``) and the in-place upgrade of an older store through
:mod:`harness.store.migrations`, and how a row becomes a typed record of :mod:`harness.contract.records` and back.

The store's own tables only: a client that keeps rows of its own in the same database (the claims' training
experiments) declares its table in its own ``MetaData`` and asks :meth:`harness.store.db.Store.add_table` for it.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

import sqlalchemy as sa

from harness.contract.records import SCHEMA_VERSION, CaseRecord, RunRecord, SuiteSpec
from harness.contract.secrets import hide_passwords_in
from harness.store.migrations import MIGRATIONS, columns_at

__all__ = ["SCHEMA_VERSION", "case_record", "case_row", "cases", "meta", "metadata", "migrate", "read_version",
           "run_leases", "run_record", "runs", "set_version", "timestamp"]

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


def timestamp() -> str:
    """When a row is written: UTC, ISO 8601, to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def read_version(conn: sa.Connection, tables: set[str]) -> int:
    """The schema version of a store holding ``tables``."""
    if "bench_meta" not in tables:
        return 1                                       # the first release had no version table
    value = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    return int(value) if value is not None else 1


def set_version(conn: sa.Connection, version: int) -> None:
    """Record ``version`` in ``bench_meta`` (made if missing)."""
    meta.create(conn, checkfirst=True)
    conn.execute(meta.delete().where(meta.c.key == "schema_version"))
    conn.execute(meta.insert().values(key="schema_version", value=str(version)))


def migrate(conn: sa.Connection, version: int) -> int:
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
        set_version(conn, m.to)
        version = m.to
    return version


def case_row(run_id: str, rec: CaseRecord, finished_at: str) -> dict[str, Any]:
    """The ``cases`` row of a finished case."""
    row = asdict(rec)
    row.update(run_id=run_id, finished_at=finished_at, samples_s=list(rec.samples_s), config=dict(rec.config),
               workload=dict(rec.workload), metrics=dict(rec.metrics), rounds=list(rec.rounds),
               group_key=rec.group, sdpa_backend=rec.sdpa_backend)
    del row["group"]
    return row


_CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
                "duration_s", "run_id", "finished_at")


def case_record(row: dict[str, Any]) -> CaseRecord:
    """A ``cases`` row (lifted to the newest schema) as its record."""
    return CaseRecord(**{k: row[k] for k in _CASE_FIELDS}, samples_s=tuple(row["samples_s"] or ()),
                      rounds=tuple(row.get("rounds") or ()), group=row.get("group_key") or "",
                      sdpa_backend=row.get("sdpa_backend") or "")


def run_record(row: dict[str, Any]) -> RunRecord:
    """A ``runs`` row (lifted to the newest schema) as its record, passwords hidden."""
    spec = row.get("suite_spec")
    return RunRecord(id=row["id"], suite=row["suite"], quick=bool(row["quick"]), status=row["status"],
                     n_cases=int(row["n_cases"]), started_at=row["started_at"],
                     env=hide_passwords_in(row["env"] or {}), options=hide_passwords_in(row["options"] or {}),
                     suite_path=row.get("suite_path") or "",
                     finished_at=row.get("finished_at") or "", stored=int(row.get("stored") or 0),
                     suite_text=row.get("suite_text"), spec=SuiteSpec.from_dict(spec) if spec is not None else None,
                     invocation=hide_passwords_in(row.get("invocation") or {}))

