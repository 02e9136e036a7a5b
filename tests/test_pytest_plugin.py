"""The pytest plugin (harness/tools/pytest_plugin.py, entry point ``pytest11: bench``): a benchmark case written as a
test, run in a pytest of its own (pytester, in a subprocess: the entry point loads the plugin there as it would
for a user). The cases are tiny (decoder-tiny at seq_len 16, quick timing)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

TINY = 'arch="decoder-tiny", seq_len=16, batch_size=1, threads=1'


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run ``source`` as the test file of a pytest in a subprocess, with the installed plug-ins loaded."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_inner=textwrap.dedent(source))
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    return run


def test_the_plugin_is_a_pytest11_entry_point_and_imports_without_torch():
    assert any(ep.name == "bench" and ep.value == "harness.tools.pytest_plugin" for ep in entry_points(group="pytest11"))
    code = "import sys, harness.tools.pytest_plugin; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_inline_case_is_measured_stored_and_summarized(inner, tmp_path):
    from harness.store.db import Store

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    result = inner(f"""
        def test_tiny(bench_case):
            rec = bench_case({TINY}, d_ff=256)
            assert rec.ok and rec.arch == "decoder-tiny" and rec.suite == "pytest"
            assert rec.line.endswith("test_inner.py::test_tiny")
            assert rec.config["d_ff"] == 256 and rec.workload["seq_len"] == 16
            assert rec.metric("macs") > 0 and rec.metric("median_ms") > 0 and rec.metric("peak_bytes") > 0
            assert rec.run_id
        """, "--bench-quick", "--bench-inline", "--bench-store", url)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*bench cases (quick timing, inline)*",
                                 "*test*arch*median ms [[]95% CI]*MACs*peak memory*",
                                 "test_inner.py::test_tiny*decoder-tiny*[[]*, *]*M*iB*",
                                 "stored as run * (suite 'pytest') in sqlite:///*"])
    store = Store(url, create=False)
    (run,) = store.list_runs()
    assert (run.suite, run.status, run.quick, run.n_cases, run.stored) == ("pytest", "done", True, 1, 1)
    assert run.options["executor"] == "inline" and run.hard_env["threads"] == 1
    (rec,) = store.records(run.id)
    assert rec.status == "ok" and rec.line == "test_inner.py::test_tiny" and rec.metric("macs") > 0


def test_bad_input_fails_the_test_with_its_message(inner):
    result = inner("""
        def test_unknown_arch(bench_case):
            bench_case("no-such-arch", seq_len=16)

        def test_unknown_metric(bench_case):
            bench_case("decoder-tiny", seq_len=16, metrics=("latency", "speed"))
        """, "--bench-quick", "--bench-inline")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*bench case error: arch: unknown architecture 'no-such-arch'*"])
    result.stdout.fnmatch_lines(["*bench case error: metrics: expected some of*'speed'*"])


def test_isolated_worker_by_default_and_a_case_not_ok_fails_the_test(inner):
    # the second case's estimated peak (a batch of ten million) exceeds any memory budget: the worker records it
    # as skipped, which fails the test with the record's message
    result = inner(f"""
        def test_isolated(bench_case):
            rec = bench_case({TINY}, metrics=("latency", "flops"))
            assert rec.metric("macs") > 0 and rec.metric("median_ms") > 0
            assert rec.metric("peak_bytes") is None           # memory not asked for

        def test_too_big(bench_case):
            bench_case("decoder-tiny", seq_len=16, batch_size=10_000_000)
        """, "--bench-quick", "--bench-timeout", "60")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*bench case skipped: estimated peak * MiB exceeds the memory budget*"])
    result.stdout.fnmatch_lines(["*bench cases (quick timing, process)*",
                                 "test_inner.py::test_isolated*decoder-tiny*",
                                 "test_inner.py::test_too_big*decoder-tiny*skipped*"])
    assert "stored as run" not in result.stdout.str()


def test_a_session_without_bench_cases_prints_no_table(inner):
    result = inner("""
        def test_plain():
            assert 1 + 1 == 2
        """, "--bench-quick")
    result.assert_outcomes(passed=1)
    assert "bench cases" not in result.stdout.str()


def test_options_are_listed_in_help(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["bench: benchmark cases as tests*", "*--bench-store=URL*", "*--bench-quick*",
                                 "*--bench-inline*", "*--bench-timeout=S*"])
