"""The `bench` command line: run/runs/show/export on a tiny suite, and every kind of bad input.

Most calls go through click's CliRunner in this process with ``--executor inline`` (fast); a few
run the installed console script in a subprocess, as a user would.
"""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from harness.store.db import Store
from harness.contract.suite import load_suite
from tests.helpers import TINY_SUITE, invoke
from tests.test_suite import BAD

_SCRIPT = Path(sys.executable).with_name("bench")
BENCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli"]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


# -- a real run of the tiny suite, shared by the read-only commands below ---------------------------

@pytest.fixture(scope="module")
def tiny_run(tiny_store, _tiny_measured):
    """(suite path, store URL, `bench run` result) of the tiny run measured once per process (tests/conftest.py: one
    thread, ``--set threads=1``), this module's copy of its store: a run of its own cost ~8 CPU-s."""
    suite, url = tiny_store
    return suite, url, _tiny_measured[2]


def tiny_cases(suite: Path) -> list:
    """The cases of the shared tiny run, as it was run (one thread: part of each case's key)."""
    return list(load_suite(str(suite), quick=True, sets={"threads": 1}).cases)


def test_run_stores_every_case_ok_prints_the_headline_and_writes_the_report(tiny_run):
    suite, url, result = tiny_run
    assert result.exit_code == 0, result.stderr
    store = Store(url, create=False)
    run = store.get_run("latest")
    rows = store.records(run.id)
    assert len(rows) == 6 and {r.status for r in rows} == {"ok"}
    assert {r.case_key for r in rows} == {c.key for c in tiny_cases(suite)}
    assert run.status == "done" and run.n_cases == 6 and run.quick
    assert run.suite_text == suite.read_text() and run.spec.sweep == {"seq_len": [16, 32, 64]}
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"tiny · run {run.id} · 6 cases: 6 ok")
    assert any(line.strip().startswith("MHA: time ∝ n^") for line in lines)
    assert any(line.strip().startswith("MQA: time ∝ n^") for line in lines)
    assert any("MQA vs MHA (n_kv_heads 1 vs 4)" in line for line in lines)       # the one-parameter contrast
    report = suite.parent / "report.html"
    assert f"report: {report}" in result.stdout and report.read_text().startswith("<!DOCTYPE html>")
    assert "95% CI ms" not in result.stdout                  # the full table of cases is `bench show`'s job
    # MQA is MHA's variant: the lines side by side against MHA (the first line) lead, at the smallest and the
    # largest of the three lengths
    head = result.stdout.index("side by side at seq_len=16")
    assert head < result.stdout.index("side by side at seq_len=64") < result.stdout.index("MHA: time ∝ n^")
    assert "side by side at seq_len=32" not in result.stdout
    assert f"2 of 3 sweep points shown (the smallest and the largest); bench show {run.id} has every one" in result.stdout


def test_report_goes_beside_the_store_unless_no_report(write_suite, tmp_path):
    suite = write_suite(TINY_SUITE.replace("[16, 32, 64]", "[16]").replace("MQA = { n_kv_heads = 1 }\n", ""))
    # where the report goes: one case
    url = f"sqlite:///{tmp_path / 'store' / 'bench.sqlite'}"
    base = ("run", str(suite), "--quick", "--executor", "inline", "--no-calibrate", "--store", url)
    first = invoke(*base)
    assert first.exit_code == 0, first.stderr
    run_id = Store(url, create=False).get_run("latest").id
    report = tmp_path / "store" / f"report-{run_id}.html"
    assert report.is_file() and f"report: {report}" in first.stdout
    second = invoke(*base, "--no-report")
    assert second.exit_code == 0 and "report:" not in second.stdout
    assert [p.name for p in (tmp_path / "store").glob("report-*.html")] == [report.name]


def test_runs_lists_the_run(tiny_run):
    _, url, _ = tiny_run
    result = invoke("runs", "--store", url)
    assert result.exit_code == 0
    run_id = Store(url, create=False).get_run("latest").id
    assert run_id in result.stdout and "6/6" in result.stdout and "tiny" in result.stdout


@pytest.mark.parametrize("ref", ["latest", "id", "prefix"])
def test_show_by_latest_id_or_prefix(tiny_run, ref):
    _, url, _ = tiny_run
    run_id = Store(url, create=False).get_run("latest").id
    arg = {"latest": "latest", "id": run_id, "prefix": run_id[:-2]}[ref]
    result = invoke("show", arg, "--store", url)
    assert result.exit_code == 0, result.stderr
    assert f"run {run_id}" in result.stdout
    cases, _, fits = result.stdout.partition("scaling exponents vs seq_len")
    assert cases.count("│ MHA") == 3 and cases.count("│ MQA") == 3      # one row per case
    assert fits.count("│ MHA") == 1 and fits.count("│ MQA") == 1        # one fit per line


METRICS_WITH_UNITS = {"median_ms", "ci_low_ms", "ci_high_ms", "macs", "flops", "params", "peak_bytes",
                      "est_peak_bytes"}


def _no_nan(text: str):
    def refuse(token):
        raise AssertionError(f"export has a non-JSON number: {token}")
    return json.loads(text, parse_constant=refuse)


def test_export_json_one_object_per_case(tiny_run):
    suite, url, _ = tiny_run
    result = invoke("export", "latest", "--format", "json", "--store", url)
    assert result.exit_code == 0, result.stderr
    data = _no_nan(result.stdout)
    assert isinstance(data, list) and len(data) == 6
    expected = {c.key: c for c in tiny_cases(suite)}
    for obj in data:
        assert {"case_key", "suite", "line", "arch", "status", "message", "config", "workload",
                "metrics"} <= set(obj)
        case = expected[obj["case_key"]]
        assert (obj["suite"], obj["line"], obj["arch"], obj["status"]) == ("tiny", case.line, "decoder-tiny", "ok")
        assert obj["message"] == ""
        # the resolved config: the preset's fields with the line's override applied
        assert obj["config"]["n_kv_heads"] == {"MHA": 4, "MQA": 1}[case.line]
        assert obj["config"]["d_model"] == 128 and obj["config"]["n_heads"] == 4
        assert obj["workload"]["seq_len"] == case.workload.seq_len and obj["workload"]["batch_size"] == 1
        assert METRICS_WITH_UNITS <= set(obj["metrics"])
        assert all(isinstance(v, (int, float)) for v in obj["metrics"].values())
        assert obj["metrics"]["median_ms"] > 0 and obj["metrics"]["macs"] > 0 and obj["metrics"]["params"] > 0
    assert {o["case_key"] for o in data} == set(expected)


def test_export_csv_one_row_per_case(tiny_run):
    _, url, _ = tiny_run
    result = invoke("export", "latest", "--format", "csv", "--store", url)
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 6
    cols = set(rows[0])
    assert {"case_key", "suite", "line", "arch", "status", "message", "seq_len", "batch_size",
            "cfg.n_kv_heads"} <= cols
    assert METRICS_WITH_UNITS <= cols
    assert len({r["case_key"] for r in rows}) == 6 and {r["status"] for r in rows} == {"ok"}
    for r in rows:
        assert float(r["median_ms"]) > 0 and float(r["macs"]) > 0 and float(r["peak_bytes"]) > 0
        assert int(r["cfg.n_kv_heads"]) == {"MHA": 4, "MQA": 1}[r["line"]]


def test_export_to_file_matches_stdout(tiny_run, tmp_path):
    _, url, _ = tiny_run
    target = tmp_path / "out.json"
    result = invoke("export", "latest", "--format", "json", "-o", str(target), "--store", url)
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(target.read_text()) == json.loads(invoke("export", "latest", "--format", "json",
                                                               "--store", url).stdout)


def test_dry_run_lists_cases_and_writes_nothing(write_suite, tmp_path):
    suite = write_suite(TINY_SUITE)
    db = tmp_path / "sub" / "results.sqlite"
    result = invoke("run", str(suite), "--dry-run", "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.stderr
    for case in load_suite(str(suite)).cases:
        assert case.key in result.stdout
    assert "6 cases" in result.stdout
    assert not db.exists() and not db.parent.exists()


def test_set_pins_a_swept_key(write_suite):
    suite = write_suite(TINY_SUITE)
    dry = invoke("run", str(suite), "--dry-run", "--set", "seq_len=16")
    assert dry.exit_code == 0, dry.stderr
    pinned = load_suite(str(suite), sets={"seq_len": 16}).cases
    assert len(pinned) == 2 and {c.workload.seq_len for c in pinned} == {16}
    listed = [line.split()[0] for line in dry.stdout.splitlines() if "decoder-tiny" in line]
    assert listed == [c.key for c in pinned]
    assert "2 cases" in dry.stdout


# -- bad input: exit 2, one line naming file and key, nothing written --------------------------------

BAD_SUITES = BAD   # every malformed suite of the loader's tests, now through the whole CLI


@pytest.mark.parametrize("name", list(BAD_SUITES))
def test_bad_suite_exit_2_one_line_nothing_written(write_suite, tmp_path, name):
    text, key = BAD_SUITES[name]
    path = write_suite(text)
    db = tmp_path / "results.sqlite"
    result = invoke("run", str(path), "--quick", "--executor", "inline", "--store", f"sqlite:///{db}")
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert str(path) in line and key in line
    assert result.stdout == ""
    assert not db.exists()


def test_unknown_key_in_fixed_is_not_blamed_on_a_line(write_suite):
    path = write_suite(TINY_SUITE.replace("batch_size = 1", "batch_size = 1, colour = 1"))
    result = invoke("run", str(path), "--dry-run")
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "colour" in line and "fixed" in line and "lines.MHA" not in line


def test_missing_suite_file(tmp_path):
    missing = tmp_path / "nope.toml"
    result = invoke("run", str(missing), "--dry-run")
    assert result.exit_code == 2
    assert str(missing) in one_line(result.stderr)


BAD_OPTIONS = {
    "negative timeout": (["run", "{suite}", "--timeout", "-1"], "--timeout"),
    "unknown executor": (["run", "{suite}", "--executor", "nope"], "--executor"),
    "unknown flag": (["run", "{suite}", "--frobnicate"], "--frobnicate"),
    "set without =": (["run", "{suite}", "--set", "seq_len"], "--set"),
    "set unknown key": (["run", "{suite}", "--set", "n_kv_headz=2"], "n_kv_headz"),
    "unknown device": (["run", "{suite}", "--device", "tpu"], "device"),
    "missing plugin": (["run", "{suite}", "--plugin", "{tmp}/nope.py"], "nope.py"),
    "export format": (["export", "latest", "--format", "xml"], "--format"),
    "unknown command": (["frobnicate"], "frobnicate"),
    "unknown list kind": (["list", "models"], "models"),
}


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_bad_option_exit_2_one_line_nothing_written(write_suite, tmp_path, name):
    args, key = BAD_OPTIONS[name]
    suite = write_suite(TINY_SUITE)
    db = tmp_path / "results.sqlite"
    args = [a.format(suite=suite, tmp=tmp_path) for a in args]
    args += ["--store", f"sqlite:///{db}"] if args[0] in ("run", "export") else []
    result = invoke(*args)
    assert result.exit_code == 2
    assert key in one_line(result.stderr)
    assert not db.exists()


def _stores(tmp_path: Path) -> dict[str, tuple[str, Path | None]]:
    text = tmp_path / "notes.sqlite"
    text.write_text("these are my notes, not a database\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"text file": (f"sqlite:///{text}", text), "directory": (f"sqlite:///{folder}", folder),
            "unknown dialect": ("notaurl://", None), "not a url": (":::", None),
            "no such driver": ("postgresql+nosuchdriver://u@localhost/db", None)}


@pytest.mark.parametrize("store", ["text file", "directory", "unknown dialect", "not a url", "no such driver"])
@pytest.mark.parametrize("command", ["run", "runs", "show", "export"])
def test_unreadable_store_exit_2_one_line_unchanged(write_suite, tmp_path, store, command):
    url, path = _stores(tmp_path)[store]
    before = path.read_bytes() if path and path.is_file() else sorted(path.iterdir()) if path else None
    suite = write_suite(TINY_SUITE)
    args = {"run": ["run", str(suite), "--quick", "--executor", "inline"], "runs": ["runs"],
            "show": ["show", "latest"], "export": ["export", "latest", "--format", "json"]}[command]
    result = invoke(*args, "--store", url)
    assert result.exit_code == 2, result.stderr
    assert "--store" in one_line(result.stderr)
    after = path.read_bytes() if path and path.is_file() else sorted(path.iterdir()) if path else None
    assert before == after


@pytest.mark.parametrize("command", [["show", "latest"], ["export", "latest", "--format", "csv"], ["runs"]])
def test_missing_store_is_not_created(tmp_path, command):
    db = tmp_path / "nothing" / "here.sqlite"
    result = invoke(*command, "--store", f"sqlite:///{db}")
    assert result.exit_code == 2
    assert str(db) in one_line(result.stderr)
    assert not db.parent.exists()


@pytest.mark.parametrize("command", [["show", "latest"], ["export", "latest", "--format", "json"]])
def test_empty_store_has_no_latest_run(store_url, command):
    Store(store_url)          # a valid store with no runs yet
    result = invoke(*command, "--store", store_url)
    assert result.exit_code == 2
    assert "no runs" in one_line(result.stderr)
    runs = invoke("runs", "--store", store_url)             # listing an empty store is fine
    assert runs.exit_code == 0 and "stored runs" in runs.stdout


def test_unknown_run_id(tiny_run):
    _, url, _ = tiny_run
    result = invoke("show", "19990101-nope", "--store", url)
    assert result.exit_code == 2
    assert "19990101-nope" in one_line(result.stderr)


# -- the installed console script, as a user runs it -------------------------------------------------

def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_script_bad_suite_is_one_line_exit_2(write_suite, tmp_path):
    path = write_suite(TINY_SUITE.replace("decoder-tiny", "decoder-nope"))
    res = _bench("run", str(path), cwd=tmp_path)
    assert res.returncode == 2
    line = one_line(res.stderr)
    assert line.startswith("bench: error") and str(path) in line and "decoder-nope" in line
    assert res.stdout == ""
    assert not (tmp_path / "results").exists()          # the default store was not created


def test_script_dry_run(write_suite, tmp_path):
    path = write_suite(TINY_SUITE)
    res = _bench("run", str(path), "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "6 cases" in res.stdout
    assert not (tmp_path / "results").exists()


def test_default_store_is_not_created_by_readers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                         # the default store is results/bench.sqlite here
    for command in (["runs"], ["show", "latest"], ["export", "latest", "--format", "json"]):
        result = invoke(*command)
        assert result.exit_code == 2
        assert "results/bench.sqlite" in one_line(result.stderr)
    assert not (tmp_path / "results").exists()


def test_every_command_is_listed_for_lazy_loading_under_its_own_name() -> None:
    """cli.app imports a command's module only when it runs: its table names every command of every module."""
    import importlib

    from cli.app import COMMANDS, SHORT_HELP, main
    from cli.bisect import COMMANDS as BISECT
    from cli.check import COMMANDS as CHECK
    from cli.history import COMMANDS as HISTORY
    from cli.runs import COMMANDS as RUNS
    assert set(SHORT_HELP) == set(COMMANDS)
    for name, ref in COMMANDS.items():
        module, attr = ref.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert command.name == name
        for limit in (20, 45, 70, 120, 10_000):   # `bench --help` lists it as click would have from its own help
            assert click.Command(name, help=SHORT_HELP[name]).get_short_help_str(limit) == \
                command.get_short_help_str(limit), (name, limit)
    defined = {c.name for c in (*RUNS, *CHECK, *HISTORY, *BISECT)} | {"report", "claims", "flops"}
    assert set(COMMANDS) == defined
    assert invoke("--help").exit_code == 0 and all(f" {name} " in invoke("--help").output for name in COMMANDS)


def test_bench_run_does_not_import_the_other_commands() -> None:
    """``bench --help`` imports no command's module (nor torch); then ``bench run --help`` imports cli.runs only: not
    cli.check, cli.claims, cli.flops, nor pandas and matplotlib (which a run without a report never uses), nor
    scipy.stats (imported when a run's timings are judged)."""
    modules = ("cli.check", "cli.claims", "cli.flops", "cli.report", "cli.runs", "pandas", "matplotlib", "scipy.stats")
    show = "print(sorted(m for m in {} if m in sys.modules), file=sys.stderr)\n"
    code = ("import sys\nfrom cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n" +
            show.format((*modules, "torch")) + "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n" +
            show.format(modules))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stderr.strip().splitlines()[-2:] == ["[]", "['cli.runs']"], res.stderr


def test_debug_is_accepted_by_the_group_and_every_command(tmp_path, monkeypatch) -> None:
    """Every error that says "rerun with --debug" can be rerun so: each command takes --debug (before or after
    its name), and with it an unexpected error prints its traceback, passwords hidden as everywhere."""
    from cli.app import COMMANDS
    from harness.store import db
    for name in COMMANDS:
        assert "--debug" in invoke(name, "--help").output, name
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    db.Store(url)                                                   # an empty store
    assert invoke("runs", "--store", url).exit_code == 0

    def broken(self, *a, **k):
        raise RuntimeError("lost postgresql://alice:S3cretPW@db.example/bench")
    monkeypatch.setattr(db.Store, "list_runs", broken)
    plain = invoke("runs", "--store", url)
    assert plain.exit_code == 1 and "(rerun with --debug)" in plain.stderr and "Traceback" not in plain.stderr
    for args in (("runs", "--debug"), ("--debug", "runs")):
        loud = invoke(*args, "--store", url)
        assert loud.exit_code == 1 and "Traceback" in loud.stderr and "rerun with --debug" not in loud.stderr
        assert "S3cretPW" not in loud.stderr + plain.stderr and "alice:***@db.example" in loud.stderr


def test_help_lists_the_commands_in_the_order_a_user_meets_them() -> None:
    from cli.app import COMMANDS
    text = invoke("--help").output
    listed = [line.split()[0] for line in text.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS) and listed[:3] == ["list", "run", "runs"]
    assert "Example" in text and "bench run " in text


def test_claim_ids_in_help_come_from_the_catalog_not_the_text() -> None:
    """No help repeats a fact kept elsewhere: which claims exist is the catalog's to say."""
    from cli.app import SHORT_HELP
    assert not re.search(r"C\d\d\s*[–-]\s*C\d\d", SHORT_HELP["claims"] + invoke("claims", "--help").output)
