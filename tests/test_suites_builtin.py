"""Every built-in suite under suites/ loads (full and --quick), expands to cases whose architectures
resolve, and dry-runs through the CLI with exit code 0."""
from __future__ import annotations

import pytest

from harness import registry
from harness.suite import list_suites, load_suite

SUITES = list_suites()


def test_there_are_builtin_suites():
    assert SUITES, "no suites/*.toml found"


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_builtin_suite_loads_and_resolves(path, quick):
    suite = load_suite(str(path), quick=quick)
    assert suite.name == path.stem
    assert suite.description, f"{path.name} has no description"
    assert len(suite.cases) > 0
    assert len({c.key for c in suite.cases}) == len(suite.cases), "two cases share a key"
    for case in suite.cases:
        spec = registry.resolve(case.arch, **dict(case.overrides))
        assert spec.config is not None


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_builtin_suite_dry_run_exits_0(cli, path, quick):
    args = ["run", str(path), "--dry-run"] + (["--quick"] if quick else [])
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "nothing measured" in result.output
