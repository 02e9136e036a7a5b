"""The claims' training experiments in the results store: one row per trained experiment (its name, size, seeds, the
environment that trained it and its result), so a later ``bench claims`` reuses it instead of training again.

The table is the claims' own, kept in the same database through the store's interface for its clients
(:meth:`harness.store.db.Store.add_table`); the store itself knows nothing of experiments. Stores written before
it moved here hold the same table, so their experiments are found.
"""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from harness.store.db import Store
from harness.store.schema import timestamp

experiments = sa.Table(
    "experiments", sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False, index=True),
    sa.Column("quick", sa.Boolean, nullable=False),
    sa.Column("seeds", sa.JSON, nullable=False),
    sa.Column("env", sa.JSON, nullable=False),
    sa.Column("result", sa.JSON, nullable=False),
    sa.Column("finished_at", sa.String(40), nullable=False),
)


class ExperimentStore:
    """The experiments kept in ``store``: :meth:`add` one, :meth:`find` the newest that matches."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, name: str, quick: bool, seeds: list[int], env: dict[str, Any], result: dict[str, Any]) -> None:
        """Store the result of experiment ``name`` trained at this size and seeds in the environment ``env``."""
        self.store.add_table(experiments)
        self.store.insert(experiments, dict(name=name, quick=quick, seeds=seeds, env=env, result=result,
                                            finished_at=timestamp()))

    def find(self, name: str, quick: bool, seeds: list[int], hard_env: dict[str, Any]) -> dict[str, Any] | None:
        """The newest stored result of experiment ``name`` at this size, seeds and hard environment (its row), or
        None (also when the store has no experiments table: nothing was trained into it)."""
        if not self.store.add_table(experiments):
            return None
        q = (sa.select(experiments).where(experiments.c.name == name, experiments.c.quick == quick)
             .order_by(experiments.c.id.desc()))
        for row in self.store.select(q):
            if row["seeds"] == seeds and row["env"].get("hard") == hard_env:
                return row
        return None
