"""Shared fixtures (temporary suite files and stores, a CLI runner) and the Hypothesis profiles; the shared
helper functions are in tests/helpers.py."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Property tests: `.ci/run` loads the derandomized "ci" profile (the same examples every run, so CI cannot
# flake); local runs use "dev" (fresh random examples each run, to find new bugs; pin each one with @example).
# "hunt" draws many more. Tests set neither the randomness nor the number of examples: the profile does.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", max_examples=25, deadline=None, print_blob=True)
settings.register_profile("hunt", max_examples=400, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


SERIAL_MODULES = frozenset({"test_load", "test_timing", "test_interleave", "test_calibrate",
                            "test_timer_gpu"})
"""Modules whose tests judge timings, a calibrated peak or the machine's load: `make test` runs them alone, after the
parallel tests (marker ``serial``), so another test running beside them cannot pass for a busy machine."""

PARTLY_SERIAL_MODULES = frozenset({"test_claims_blocks", "test_ci_gate", "test_replicate_adaptive", "test_history"})
"""Modules where only some tests judge a timing or the process's memory: those carry ``@pytest.mark.serial``
themselves and run in the serial phase; the rest (counts, synthetic data, structure) run in the parallel phase.
The serial phase collects these modules too (:func:`pytest_ignore_collect`); a test marked ``serial`` in a module in
neither set is refused at collection (:func:`_check_serial_marks`), so none is lost between the phases.
test_executor_devices and test_process_stats run in the parallel phase: the first checks where cases ran and under
which keys, the second judges statistics on simulated timers; neither times anything. test_replicate_adaptive's
process-adding test is serial: it judges the spread of timings between processes, which a parallel phase disturbs."""

COLLECTED_SERIALLY = SERIAL_MODULES | PARTLY_SERIAL_MODULES
"""The modules the serial phase collects (:func:`pytest_ignore_collect`): a ``serial`` test anywhere else is refused."""


SLOW_MODULES_FIRST = ("test_claims_figures", "test_executor", "test_executor_ray", "test_ranks", "test_tensor_parallel",
                      "test_history", "test_concurrent_runs", "test_hf_models", "test_report", "test_pytest_plugin", "test_cli",
                      "test_compile", "test_vision_zoo", "test_overhead", "test_vision", "test_report_browser",
                      "test_faults_pg", "test_side_by_side", "test_resume", "test_claims_mnist1d", "test_timm_models",
                      "test_claims_cost", "test_faults", "test_ab_versions", "test_transformer",
                      "test_history_browser", "test_hf_vs_ours", "test_roofline", "test_docs_readme",
                      "test_docs_metrics", "test_packaging")
"""The modules that take longest (`pytest --durations`, summed per module, 2 cores, from a parallel phase measured
on 2026-11-28, the modules whose tests were cut since then at their new cost, measured alone; test_claims_figures
first, as it must start in a fresh worker), longest first: `make test`'s
parallel phase hands out whole modules (``--dist loadfile``) in the order of the collection
(``--no-loadscope-reorder``), so the longest start first and the many short modules fill the end evenly (the
longest-job-first rule). xdist's own order, by number of tests, left these few-test, long modules for last, and one
core worked alone at the end. Modules not named here follow, those with more tests first; a test's order within
its module never changes. test_claims_figures (5 s) goes first, into a fresh process: its C03 test reads the
process's resident set growing by one 67 MB tensor, which it did not after other modules had run in the same
worker (seen once at 20:44 on the loaded machine; it passes alone and first)."""


def _schedule_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` reordered module by module: :data:`SLOW_MODULES_FIRST` in its order, then by number of tests."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]
    counts: dict[str, int] = {}
    for item in items:
        counts[module(item)] = counts.get(module(item), 0) + 1
    rank = {name: i for i, name in enumerate(SLOW_MODULES_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int]:
        name = module(item).rsplit("/", 1)[-1].removesuffix(".py")
        return rank.get(name, len(rank)), -counts[module(item)]
    return sorted(items, key=key)           # stable: the order within a module (and among equals) is kept


def pytest_configure(config):
    """Under pytest-xdist (``make test``'s parallel phase), each worker takes its own share of the cores.

    Unpinned, every worker's torch (and every ``bench`` it starts) runs as many threads as the machine has cores,
    so two workers on two cores oversubscribe them: an OpenMP thread descheduled mid-region stalls its peers,
    and a small training test measured 20 times slower in wall time (and 20 times the CPU time, spent spinning).
    Worker i of n keeps cores i, i+n, ... (one core, shared, when there are fewer cores than workers): its torch, the
    runs it measures (threads default to the usable cores, ``harness.engine.env.usable_cores``) and the processes it
    starts inherit that share. A plain ``pytest`` (and the serial phase) keeps every core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    n, i = int(count), int(worker.removeprefix("gw"))
    share = cores[i % n::n] if len(cores) >= n else [cores[i % len(cores)]]
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """``pytest -m serial`` (``make test``'s serial phase, exactly that expression) collects only the modules of
    :data:`SERIAL_MODULES`: every test of another module would be deselected anyway, and importing and collecting
    them all cost ~10 CPU-s of that phase (``pytest -q --collect-only -m serial``: 15.3 s, 14.2 user CPU-s; the
    nine modules alone: 5.8 s, 5.1 CPU-s). Any other expression, or none, collects everything."""
    if config.getoption("markexpr", "") != "serial":
        return None
    name = collection_path.name
    if collection_path.parent == Path(__file__).parent and name.startswith("test_") and name.endswith(".py"):
        return name.removesuffix(".py") not in COLLECTED_SERIALLY or None
    return None


def _check_serial_marks(items: list[pytest.Item]) -> None:
    """A test marked ``serial`` by hand must live in :data:`PARTLY_SERIAL_MODULES` (or :data:`SERIAL_MODULES`):
    elsewhere the serial phase would not collect it, and it would run in neither phase."""
    lost = sorted(item.nodeid for item in items if item.get_closest_marker("serial") is not None
                  and item.module is not None
                  and item.module.__name__.rsplit(".", 1)[-1] not in COLLECTED_SERIALLY)
    if lost:
        raise pytest.UsageError(f"tests marked serial outside SERIAL_MODULES/PARTLY_SERIAL_MODULES "
                                f"(tests/conftest.py): {', '.join(lost[:5])}")


def pytest_collection_finish(session) -> None:
    """The imports and the collected tests are left out of every later garbage collection
    (:func:`harness.engine.env.freeze_heap`): the harness collects before each memory measurement and after each
    dropped model, and in a test process, with pytest, hypothesis, pandas and matplotlib loaded beside torch, a full
    collection took 0.34 s (cProfile of ten modules: 42 of their 194 s)."""
    from harness.engine.env import freeze_heap
    freeze_heap()


@pytest.fixture(scope="module", autouse=True)
def _freeze_between_modules() -> None:
    """Before each module: the model kept by the modules before it dropped, then what is still alive frozen
    (:func:`pytest_collection_finish`): the imports made since (dynamo, inductor, scipy, the reports) and the
    session's fixtures. Frozen once at the collection only, a collection still took 0.15 s by the tenth module.
    The kept model is dropped first because a frozen object is never collected, and a compiled wrapper's reference
    cycles must be (:class:`harness.engine.models.ModelCache`)."""
    from harness.engine.env import freeze_heap
    from harness.engine.models import MODELS
    MODELS.clear()
    freeze_heap()


def pytest_collection_modifyitems(config, items):
    _check_serial_marks(items)
    items[:] = _schedule_order(items)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # the marker, not ``item.keywords`` (which also holds the names of parent directories: a checkout in a
        # folder called "gpu" would skip every test)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture
def write_suite(tmp_path: Path):
    def write(text: str, name: str = "suite.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


@pytest.fixture(scope="session")
def _tiny_measured(tmp_path_factory) -> tuple[Path, Path, Any]:
    """One real, calibrated quick run of the tiny suite (one thread: steadier on a shared machine), measured once per
    pytest process: (suite path, SQLite file, the ``bench run`` CliRunner result: its output, and its report at
    ``report.html`` beside the suite). Read the store through :func:`tiny_store`, never in place."""
    from tests.helpers import run_tiny      # imported on use: a test of one package need not load them all
    tmp = tmp_path_factory.mktemp("tiny-shared")
    suite, _, res = run_tiny(tmp, "--set", "threads=1")
    assert res.exit_code == 0, res.stderr
    return suite, tmp / "results.sqlite", res


@pytest.fixture(scope="module")
def tiny_store(_tiny_measured, tmp_path_factory) -> tuple[Path, str]:
    """(suite path, store URL) of a copy, for this module, of the tiny run measured once per process
    (:func:`_tiny_measured`): the modules that only need some measured run share one instead of measuring their own
    (each `bench run` of the tiny suite, calibrated at its start and end, costs ~8 CPU-s), and a module that adds
    runs or records writes to its own copy."""
    import sqlite3
    suite, db, _ = _tiny_measured
    copy = tmp_path_factory.mktemp("tiny-copy") / "results.sqlite"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)                     # SQLite's own copy: the write-ahead log's pages included
    src.close()
    dst.close()
    return suite, f"sqlite:///{copy}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.sqlite'}"


@pytest.fixture
def cli():
    """The CLI in this process (tests.helpers.invoke); stderr is kept apart (``result.stderr``)."""
    from tests.helpers import invoke      # imported on use: a test of one package need not load them all
    return invoke


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch pinned to one thread for the test, then restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
