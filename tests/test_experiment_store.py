"""The claims' training experiments, kept in the results store in a table of the claims' own
(claims.experiment_store), on both backends, and found in stores written while the store still held the table."""
from __future__ import annotations

import sqlalchemy as sa

from claims.experiment_store import ExperimentStore
from harness.store.db import Store
from tests.test_store import _copy, _schema6

pytest_plugins = ["tests.postgres"]     # fixtures: postgres, postgres_url, store_url_of

HARD = {"cpu": "x"}


def _tables(store: Store) -> set[str]:
    return set(sa.inspect(store.engine).get_table_names())


def test_experiments_round_trip_in_the_claims_own_table(store_url_of):
    store = Store(store_url_of)
    reader = ExperimentStore(Store(store_url_of, create=False))
    assert "experiments" not in _tables(store)                       # the store alone has no experiments
    assert reader.find("exp", True, [0, 1], HARD) is None and "experiments" not in _tables(store)
    kept = ExperimentStore(store)
    kept.add("exp", True, [0, 1], {"hard": HARD}, {"loss": [1.0, 0.5]})
    assert kept.find("exp", True, [0, 1], HARD)["result"] == {"loss": [1.0, 0.5]}
    assert kept.find("exp", True, [0], HARD) is None                 # other seeds
    assert kept.find("exp", False, [0, 1], HARD) is None             # another size
    assert kept.find("exp", True, [0, 1], {"cpu": "y"}) is None      # another machine
    assert kept.find("other", True, [0, 1], HARD) is None
    kept.add("exp", True, [0, 1], {"hard": HARD}, {"loss": [0.25]})
    assert kept.find("exp", True, [0, 1], HARD)["result"] == {"loss": [0.25]}      # the newest
    assert reader.find("exp", True, [0, 1], HARD)["result"] == {"loss": [0.25]}    # a reader sees it now


def test_experiments_stored_before_the_table_moved_to_the_claims_are_found(tmp_path):
    url = f"sqlite:///{_schema6(tmp_path)}"
    stored = {"accuracy": [0.5, 0.75], "code_hash": "abc"}
    assert ExperimentStore(Store(url, create=False)).find("mnist1d", True, [0, 1], {"cpu": "x86_64"})["result"] == stored
    kept = ExperimentStore(Store(url))
    assert kept.find("mnist1d", True, [0, 1], {"cpu": "x86_64"})["result"] == stored
    kept.add("mnist1d", True, [0, 1], {"hard": {"cpu": "x86_64"}}, {"accuracy": [0.8]})
    assert kept.find("mnist1d", True, [0, 1], {"cpu": "x86_64"})["result"] == {"accuracy": [0.8]}

    first = ExperimentStore(Store(f"sqlite:///{_copy(tmp_path)}"))   # schema 1: the table is there, empty
    assert first.find("mnist1d", True, [0], HARD) is None
    first.add("mnist1d", True, [0], {"hard": HARD}, {"accuracy": [0.5]})
    assert first.find("mnist1d", True, [0], HARD)["result"] == {"accuracy": [0.5]}
