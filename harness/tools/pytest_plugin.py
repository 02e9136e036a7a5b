"""A pytest plugin (entry point ``pytest11: bench``): one benchmark case written as a test, measured by the harness.

``bench_case(arch, **params)`` builds a :class:`harness.contract.spec.Case` (suite ``pytest``, line = the test's node id;
keyword arguments that are :class:`harness.contract.spec.Workload` fields go to the workload, the others override the
architecture's config, exactly as in a suite file), runs it in an isolated worker with a timeout (``process``
executor; ``--bench-inline`` runs it in the test's own process), stores it with ``--bench-store URL`` (one run of
suite ``pytest`` per pytest session, opened on the first case) and returns its :class:`harness.contract.records.CaseRecord`.
A case whose status is not ``ok`` fails the test. The session ends with a table of the cases measured.

The plugin is loaded into every pytest session of an environment where ``bench`` is installed, so importing it
must stay cheap: torch and the harness are imported only once a test asks for ``bench_case``, and a session that
never does is left exactly as it was.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from harness.contract.spec import METRICS           # the contract is torch-free: cheap to import here
from harness.contract.secrets import hide_passwords

if TYPE_CHECKING:
    from harness.executors.base import Executor
    from harness.contract.records import CaseRecord
    from harness.session import Run
    from harness.engine.runner import RunOptions
    from harness.contract.spec import Case
    from harness.store.db import Store

SUITE = "pytest"
DEFAULT_METRICS: tuple[str, ...] = METRICS


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bench", "bench: benchmark cases as tests (the bench_case fixture)")
    group.addoption("--bench-store", metavar="URL", default=None,
                    help="store the bench cases in this results store (SQLAlchemy URL, e.g. sqlite:///results/"
                         "bench.sqlite), one run of suite 'pytest' per session; default: keep them in memory only")
    group.addoption("--bench-quick", action="store_true", default=False,
                    help="quick timing (fewer samples, shorter; as `bench run --quick`)")
    group.addoption("--bench-inline", action="store_true", default=False,
                    help="measure in the test's own process (no isolation, no timeout) instead of a spawned worker")
    group.addoption("--bench-timeout", metavar="S", type=float, default=None,
                    help="per-case timeout in seconds of the isolated worker (default 120 with --bench-quick, "
                         "else 600; ignored with --bench-inline)")


class BenchSession:
    """The bench state of one pytest session: the executor (its worker reused across tests), the store and run
    (opened on the first case) and the records measured, in order, with their tests' node ids."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.url: str | None = config.getoption("bench_store")
        self.quick: bool = config.getoption("bench_quick")
        self.executor_name = "inline" if config.getoption("bench_inline") else "process"
        self.timeout: float | None = config.getoption("bench_timeout")
        self.results: list[tuple[str, CaseRecord]] = []
        self.run_id: str | None = None
        self._store: Store | None = None
        self._run: Run | None = None
        self._executor: Executor | None = None
        self._options: RunOptions | None = None
        self._keys: set[str] = set()

    # -- measuring ---------------------------------------------------------------------------------------
    def make_case(self, nodeid: str, arch: str, metrics: Sequence[str], params: dict[str, Any]) -> Case:
        """The case of one ``bench_case`` call; bad input raises BenchInputError naming the key."""
        from harness.contract.errors import BenchInputError
        from harness.contract.spec import METRICS
        from harness.contract.suite import make_case       # a suite line's split into workload and overrides, and its checks
        from harness.engine.checks import WORKLOAD_CHECKS

        metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
        unknown = [m for m in metrics if m not in METRICS]
        if unknown or not metrics:
            raise BenchInputError(f"expected some of {list(METRICS)}, got {list(metrics)}", where="metrics")
        case = make_case(SUITE, nodeid, {**params, "arch": arch}, metrics, WORKLOAD_CHECKS)
        n = 1
        while case.key in self._keys:           # the same case twice in a session (a loop, a rerun): its own line
            n += 1
            case = dataclasses.replace(case, line=f"{nodeid} [{n}]")
        self._keys.add(case.key)
        return case

    def measure(self, case: Case) -> CaseRecord:
        if self._executor is None:
            from harness.executors import make_executor
            from harness.session import run_options
            self._options = run_options(self.quick, self.timeout)
            self._executor = make_executor(self.executor_name)
        assert self._options is not None
        if self._run is not None:
            got: list[CaseRecord] = []
            self._run.execute(self._executor, self._options, cases=[case], on_record=got.append)
            (rec,) = got
            self._store.reopen_run(self._run.id, self._run.stored)   # n_cases: the cases stored so far (running)
            rec = dataclasses.replace(rec, run_id=self._run.id)
        else:
            (rec,) = self._executor.run([case], self._options)
        self.results.append((case.line, rec))
        return rec

    def open_store(self, case: Case) -> None:
        """With ``--bench-store``: open the store and the session's run, once (before the first case runs, so a
        bad URL costs no measurement); bad input raises BenchInputError."""
        if self.url is None or self._store is not None:
            return
        from harness.engine.env import fingerprint, usable_cores
        from harness.session import Run
        from harness.store.db import Store
        store = Store(self.url)
        options = {"timeout": self.timeout, "executor": self.executor_name,
                   "argv": list(self.config.invocation_params.args), "runner": "pytest"}
        self._run = Run.open(store, SUITE, (), quick=self.quick, options=options, suite_path=str(self.config.rootpath),
                             env=fingerprint(threads=case.workload.threads or usable_cores()))
        self.run_id = self._run.id
        self._store = store

    def finish(self, interrupted: bool) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._run is not None and self._store is not None:
            self._run.finish("interrupted" if interrupted else "done")
            self._store.engine.dispose()


_SESSION = pytest.StashKey[BenchSession]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SESSION] = BenchSession(config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_SESSION, None)
    if state is not None:
        state.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)


@pytest.fixture
def bench_case(request: pytest.FixtureRequest) -> Callable[..., CaseRecord]:
    """Measure one benchmark case with the harness and return its CaseRecord::

        def test_decoder_tiny(bench_case):
            rec = bench_case("decoder-tiny", seq_len=16, batch_size=1, d_model=64)
            assert rec.metric("macs") < 1e7 and rec.metric("median_ms") < 50

    ``metrics`` (default latency, memory and flops) picks what is measured; keyword arguments that are
    Workload fields (batch_size, seq_len, img_size, dtype, mode, device, threads) set the workload, the others
    override the architecture's config. Bad input, or a status other than ``ok``, fails the test.
    """
    state = request.config.stash[_SESSION]

    def measure(arch: str, *, metrics: Sequence[str] = DEFAULT_METRICS, **params: Any) -> CaseRecord:
        __tracebackhide__ = True
        from harness.contract.errors import BenchInputError
        try:
            case = state.make_case(request.node.nodeid, arch, metrics, params)
            state.open_store(case)
            problem = ""
        except BenchInputError as exc:
            if exc.where == "--store":           # the store's own errors name the CLI's option
                problem = "bench store error: --bench-store" + str(exc).removeprefix("--store")
            else:
                problem = f"bench case error: {exc}"
        if problem:                              # failed outside the handler: no "during handling" traceback
            pytest.fail(problem)
        rec = state.measure(case)
        if rec.status != "ok":
            pytest.fail(f"bench case {rec.status}: {rec.message}")
        return rec

    return measure


# -- the summary table -----------------------------------------------------------------------------------
def _si(v: float | None) -> str:
    if v is None:
        return "-"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:.3g}{suffix}"
    return f"{v:.3g}"


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for factor, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= factor:
            return f"{v / factor:.3g} {suffix}"
    return f"{v:.0f} B"


def _median(rec: CaseRecord) -> str:
    if not rec.ok:
        return rec.status
    median = rec.metric("median_ms")
    if median is None:
        return "-"
    lo, hi = rec.metric("ci_low_ms"), rec.metric("ci_high_ms")
    ci = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
    return f"{median:.3g}{ci}"


def summary_rows(results: Sequence[tuple[str, CaseRecord]]) -> list[tuple[str, ...]]:
    """The table's rows, a header first: test id, arch, median ms [95% CI], MACs, peak memory."""
    rows = [("test", "arch", "median ms [95% CI]", "MACs", "peak memory")]
    rows += [(test, rec.arch, _median(rec), _si(rec.metric("macs")), _bytes(rec.metric("peak_bytes")))
             for test, rec in results]
    return rows


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None or not state.results:
        return
    rows = summary_rows(state.results)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    align = ("<", "<", ">", ">", ">")
    mode = ("quick" if state.quick else "full") + " timing, " + state.executor_name
    terminalreporter.write_sep("-", f"bench cases ({mode})")
    for i, row in enumerate(rows):
        line = "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths)).rstrip()
        terminalreporter.write_line(line, bold=i == 0)
    if state.run_id is not None:
        terminalreporter.write_line(f"stored as run {state.run_id} (suite {SUITE!r}) in {hide_passwords(state.url)}")
