"""Store schema versions and the migrations between them.

Every change to what the store holds is one :class:`Migration` here: the DDL that upgrades a store in
place (run when a store is opened for writing), and the row functions that lift one row of the older
version to the newer one (used both by that in-place upgrade and to read an older store without writing
to it, e.g. a read-only copy). A store written by any earlier version stays readable.

Version 1 is the store as first released: the ``runs`` and ``cases`` tables (and ``experiments``, now a client's
own table) and no version table. Later versions record themselves in ``bench_meta``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.contract.secrets import hide_passwords_in

Row = dict[str, Any]


def _same(row: Row) -> Row:
    return row


@dataclass(frozen=True)
class Migration:
    """From version ``to - 1`` to ``to``: ``ddl`` statements, then each row through ``runs``/``cases``."""

    to: int
    what: str
    ddl: tuple[str, ...] = ()
    runs: Callable[[Row], Row] = _same
    cases: Callable[[Row], Row] = _same
    new_run_columns: tuple[str, ...] = ()          # columns the DDL adds to ``runs`` (absent before ``to``)
    new_case_columns: tuple[str, ...] = ()


def _v2_runs(row: Row) -> Row:
    return {**row, "suite_text": row.get("suite_text"), "suite_spec": row.get("suite_spec")}


def _v3_cases(row: Row) -> Row:
    return {**row, "rounds": row.get("rounds") or [], "group_key": row.get("group_key") or ""}


def _v4_cases(row: Row) -> Row:
    return {**row, "sdpa_backend": row.get("sdpa_backend") or ""}


def _v6_runs(row: Row) -> Row:
    return {**row, "invocation": row.get("invocation") or {}, "options": hide_passwords_in(row.get("options") or {})}


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2, "runs store the suite's text and its resolved spec (a report no longer re-reads the suite file)",
        ddl=("ALTER TABLE runs ADD COLUMN suite_text TEXT", "ALTER TABLE runs ADD COLUMN suite_spec JSON"),
        runs=_v2_runs, new_run_columns=("suite_text", "suite_spec")),
    Migration(
        3, "cases store their timing rounds and interleave group (intervals that cover drift; paired ratios)",
        ddl=("ALTER TABLE cases ADD COLUMN rounds JSON", "ALTER TABLE cases ADD COLUMN group_key VARCHAR(80)"),
        cases=_v3_cases, new_case_columns=("rounds", "group_key")),
    Migration(
        4, "cases store the SDPA kernel a real call ran (harness.instruments.kernels.probe)",
        ddl=("ALTER TABLE cases ADD COLUMN sdpa_backend VARCHAR(80)",),
        cases=_v4_cases, new_case_columns=("sdpa_backend",)),
    Migration(
        5, "run leases: one driver per run at a time (a second concurrent --resume is refused; a dead one's "
           "lease goes stale)",
        ddl=("CREATE TABLE IF NOT EXISTS run_leases (run_id VARCHAR(40) NOT NULL PRIMARY KEY, "
             "owner VARCHAR(120) NOT NULL, host VARCHAR(200) NOT NULL, pid INTEGER NOT NULL, "
             "pid_started FLOAT NOT NULL, acquired_at VARCHAR(40) NOT NULL, heartbeat FLOAT NOT NULL)",)),
    Migration(
        6, "runs store the command and options that made them (bench show prints them); a password an older "
           "bench kept in a run's options (its argv) is hidden",
        ddl=("ALTER TABLE runs ADD COLUMN invocation JSON",),
        runs=_v6_runs, new_run_columns=("invocation",)),
)


def upgrade_row(kind: str, row: Row, from_version: int) -> Row:
    """``row`` of table ``kind`` ("runs" or "cases") as written at ``from_version``, lifted to the newest."""
    for m in MIGRATIONS:
        if m.to > from_version:
            row = getattr(m, kind)(row)
    return row


def columns_at(kind: str, all_columns: list[str], version: int) -> list[str]:
    """The columns table ``kind`` has in a store at ``version`` (the newest schema's minus later additions)."""
    later = {c for m in MIGRATIONS if m.to > version
             for c in (m.new_run_columns if kind == "runs" else m.new_case_columns)}
    return [c for c in all_columns if c not in later]
