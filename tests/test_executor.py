"""Worker isolation: a hang, a crash, a kill or an OOM in one case is that case's status; the sweep goes on.

The misbehaving architecture (`faulty`) lives in tests/plugin_faulty.py and is registered only
inside the spawned workers (``RunOptions.plugins``), never in this pytest process. One sweep
through one ProcessExecutor is run per module and the tests read its records.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.executors import ProcessExecutor
from harness.executors.inline import InlineExecutor
from harness.engine.runner import RunOptions, run_case
from harness.contract.records import CaseRecord
from harness.contract.spec import Case, Workload
from harness.store.db import Store
from harness.instruments.timing import TimingConfig

PLUGIN = str(Path(__file__).with_name("plugin_faulty.py"))
FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=0.5)
HANG_TIMEOUT_S = 20.0   # a normal case must finish within it on a loaded machine too (6 s was cut at load 7)
HANG_SLEEP_S = 60.0     # how long plugin_faulty's "hang" case sleeps: a record sooner means it was cut off


def faulty_case(line: str, behavior: str = "ok", **over) -> Case:
    overrides = tuple(sorted({"behavior": behavior, **over}.items()))
    return Case("faults", line, "faulty", overrides, Workload(batch_size=2), ("latency",))


@dataclass
class Outcome:
    rec: CaseRecord
    worker_pid: int | None      # the executor's worker right after the record was yielded (None: stopped)
    seconds: float              # wall time from the previous record to this one
    built_in: set[int]          # pids of the processes that built this case's model (from its pid file)


@dataclass
class Sweep:
    cases: dict[str, Case]
    out: dict[str, Outcome]
    last_worker: int | None
    cli: dict[str, tuple[subprocess.Popen, str]]   # a CLI test's `bench run` (below), started with the sweep
    interleaved: dict[str, Outcome]                # INTERLEAVED's records, run next through the same executor


PLAN = [("ok_a", "ok"), ("ok_b", "ok"), ("hang", "hang"), ("ok_c", "ok"), ("sigkill", "sigkill"),
        ("exit3", "exit3"), ("boom", "boom"), ("torch_oom", "torch_oom"), ("memory_error", "memory_error"),
        ("ok_d", "ok")]


# (sweep point, line, behavior): a point whose worker dies mid-group, then a point whose group has a case that
# raises; run with ``interleave=True`` after PLAN, through the same executor
INTERLEAVED = [(0, "fine", "ok"), (0, "killer", "sigkill"), (0, "also fine", "ok"),
               (1, "next point", "ok"), (1, "raises", "boom"), (1, "after it", "ok")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Iterator[Sweep]:
    """The module's one sweep. The `bench run`s of the CLI tests below start from here, and their tests read their
    exit status and stores when they run (each run's process and store are its test's alone): the one of
    test_cli_exit_1_when_a_case_errors (inline: no timeout it could miss) under SCHED_IDLE, so it runs only while
    this core would otherwise be idle and never slows a timed case of the sweep; the one of
    test_cli_exit_0_when_cases_only_oom_or_time_out at normal priority (its cases have a timeout to meet), so its
    hung case's wait overlaps the sweep's (20 s of this core idle once, not twice)."""
    tmp = tmp_path_factory.mktemp("pids")
    cases = {line: faulty_case(line, b, pid_file=str(tmp / f"{line}.pid")) for line, b in PLAN}
    opts = RunOptions(timing=FAST, timeout_s=HANG_TIMEOUT_S, plugins=(PLUGIN,))
    ex = ProcessExecutor()
    out: dict[str, Outcome] = {}
    cli: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        cli["errors"] = _start_cli(tmp_path_factory.mktemp("cli_errors"), CLI_ERRORS, idle=True)
        cli["timeouts"] = _start_cli(tmp_path_factory.mktemp("cli_timeouts"), CLI_TIMEOUTS)
        try:
            t = time.perf_counter()
            for rec in ex.run(list(cases.values()), opts):
                now = time.perf_counter()
                out[rec.line] = Outcome(rec, ex.proc.pid if ex.proc is not None else None, now - t,
                                        _pids(tmp / f"{rec.line}.pid"))
                t = now
            # the interleaved groups next, in ok_d's worker (one worker start less than an executor of its own)
            group = [dataclasses.replace(faulty_case(line, b, pid_file=str(tmp / f"group {line}.pid")), point=p)
                     for p, line, b in INTERLEAVED]
            after = {r.line: (r, ex.proc.pid if ex.proc is not None else None)
                     for r in ex.run(group, dataclasses.replace(opts, interleave=True))}
            interleaved = {line: Outcome(r, pid, 0.0, _pids(tmp / f"group {line}.pid"))
                           for line, (r, pid) in after.items()}
            last_worker = ex.proc.pid if ex.proc is not None else None
        finally:
            ex.close()
        assert ex.proc is None and ex.conn is None
        yield Sweep(cases, out, last_worker, cli, interleaved)
    finally:
        for proc, _ in cli.values():      # a CLI run its test did not wait for (e.g. the sweep failed)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _pids(path: Path) -> set[int]:
    return {int(line.split()[0]) for line in path.read_text().splitlines()} if path.exists() else set()


def test_every_case_has_one_record_in_order(sweep):
    assert list(sweep.out) == [line for line, _ in PLAN]
    for line, o in sweep.out.items():
        case = sweep.cases[line]
        assert (o.rec.case_key, o.rec.suite, o.rec.arch) == (case.key, "faults", "faulty")
        assert o.rec.workload["batch_size"] == 2


def test_ok_cases_are_measured_in_a_worker_not_here(sweep):
    for line in ("ok_a", "ok_b", "ok_c", "ok_d"):
        o = sweep.out[line]
        assert o.rec.status == "ok", (line, o.rec.message)
        assert o.rec.metrics["median_ms"] > 0 and o.rec.samples_s
        assert len(o.built_in) == 1 and os.getpid() not in o.built_in, o.built_in
        assert o.worker_pid in o.built_in


def test_worker_is_reused_across_ok_cases(sweep):
    assert sweep.out["ok_a"].built_in == sweep.out["ok_b"].built_in


def test_hang_is_a_timeout_and_the_next_case_runs_in_a_fresh_worker(sweep):
    hang = sweep.out["hang"]
    assert hang.rec.status == "timeout"
    assert f"{HANG_TIMEOUT_S:g} s" in hang.rec.message
    assert hang.seconds < HANG_SLEEP_S, "the hung case was waited out, not cut off at its timeout"
    assert hang.worker_pid is None
    (hung,) = sweep.out["ok_a"].built_in      # the worker that ran ok_a, ok_b, then hung
    assert not psutil.pid_exists(hung), "the hung worker was left running"
    ok_c = sweep.out["ok_c"]
    assert ok_c.rec.status == "ok" and ok_c.built_in and hung not in ok_c.built_in


def test_sigkilled_worker_is_crashed_not_oom(sweep):
    """A real SIGKILL with no out-of-memory kill recorded by the kernel: ``crashed`` naming the signal."""
    rec = sweep.out["sigkill"].rec
    assert rec.status == "crashed", rec.message
    assert "SIGKILL" in rec.message and "out-of-memory" in rec.message


def test_worker_exit_is_crashed_with_exit_code(sweep):
    rec = sweep.out["exit3"].rec
    assert rec.status == "crashed"
    assert "exit code 3" in rec.message


def test_exception_is_error_with_its_message(sweep):
    rec = sweep.out["boom"].rec
    assert rec.status == "error"
    assert "boom" in rec.message and "RuntimeError" in rec.message


@pytest.mark.parametrize("line", ["torch_oom", "memory_error"])
def test_out_of_memory_exceptions_are_oom(sweep, line):
    rec = sweep.out[line].rec
    assert rec.status == "oom", rec.message
    assert ("OutOfMemoryError" if line == "torch_oom" else "MemoryError") in rec.message


def test_a_fresh_worker_after_a_hang_or_a_crash(sweep):   # ok_c after the hang, ok_d after sigkill + exit3
    workers = [sweep.out[line].built_in for line in ("ok_a", "ok_c", "ok_d")]
    assert all(len(w) == 1 for w in workers) and len(set().union(*workers)) == 3


def test_close_leaves_no_worker(sweep):
    assert sweep.out["ok_d"].rec.status == "ok"
    assert sweep.last_worker is not None
    assert not psutil.pid_exists(sweep.last_worker)


def test_memory_guard_skips_with_the_estimate():
    from harness.contract.registry import list_archs   # built-ins only: runs in this process
    assert "decoder-tiny" in list_archs()
    case = Case("guard", "default", "decoder-tiny", (), Workload(seq_len=16), ("latency", "memory"))
    rec = run_case(case, RunOptions(timing=FAST, memory_budget_bytes=1))
    assert rec.status == "skipped"
    assert "estimated peak" in rec.message and "budget" in rec.message
    assert rec.metrics["est_peak_bytes"] > 1
    assert "median_ms" not in rec.metrics and not rec.samples_s    # nothing was measured


def test_missing_plugin_file_is_a_case_error_naming_it(tmp_path):
    missing = str(tmp_path / "nope.py")
    case = Case("p", "default", "decoder-tiny", (), Workload(seq_len=8), ("flops",))
    rec = next(InlineExecutor().run([case], RunOptions(plugins=(missing,))))
    assert rec.status == "error" and missing in rec.message


# -- at the command line: exit code 1 only for an unexpected error ------------------------------------

BENCH = [sys.executable, "-m", "cli"]
ROOT = Path(__file__).resolve().parent.parent


def _suite(tmp_path: Path, lines: dict[str, str]) -> Path:
    body = "\n".join(f'{label} = {{ behavior = "{b}" }}' for label, b in lines.items())
    path = tmp_path / "faults.toml"
    path.write_text(f'name = "faults"\nmetrics = ["latency"]\nfixed = {{ arch = "faulty" }}\n'
                    f"sweep = {{ batch_size = [1] }}\n[lines]\n{body}\n")
    return path


# (lines, extra `bench run` arguments) of the CLI test that the ``sweep`` fixture starts
CLI_ERRORS = ({"broken": "boom", "fine": "ok"}, ("--executor", "inline"))
# the hang last: its worker is not replaced for a case after it (a worker's start costs ~3 CPU-s)
CLI_TIMEOUTS = ({"fine": "ok", "no_memory": "memory_error", "hangs": "hang"}, ("--timeout", f"{HANG_TIMEOUT_S:g}"))


def _idle_priority() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _start_cli(tmp_path: Path, spec: tuple[dict[str, str], tuple[str, ...]], idle: bool = False
               ) -> tuple[subprocess.Popen, str]:
    """Start `bench run` of a suite of ``spec``'s lines into a fresh store; returns (process, store URL). ``idle``:
    under SCHED_IDLE (it runs when nothing else on its core wants to; never for a run with a timeout to meet)."""
    lines, extra = spec
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    proc = subprocess.Popen([*BENCH, "run", str(_suite(tmp_path, lines)), "--quick", *extra, "--plugin", PLUGIN,
                             "--store", url, "--no-calibrate", "--no-report"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_idle_priority if idle else None)
    return proc, url


def _finished(started: tuple[subprocess.Popen, str], timeout: float = 120) -> tuple[int, str, str]:
    """(exit status, stderr, store URL) of a `bench run` from :func:`_start_cli`, once it has ended."""
    proc, url = started
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err, url


def _latest_rows(url: str) -> dict[str, dict]:
    store = Store(url, create=False)
    return {r.line: r for r in store.records(store.get_run("latest").id)}


def test_cli_exit_1_when_a_case_errors(sweep):
    code, err, url = _finished(sweep.cli["errors"])
    assert code == 1, err
    rows = _latest_rows(url)
    assert rows["fine"].status == "ok" and rows["broken"].status == "error"
    assert "boom" in rows["broken"].message


def test_cli_exit_0_when_cases_only_oom_or_time_out(sweep):
    code, err, url = _finished(sweep.cli["timeouts"])
    assert code == 0, err
    rows = _latest_rows(url)
    assert {k: r.status for k, r in rows.items()} == {"fine": "ok", "hangs": "timeout", "no_memory": "oom"}


def test_an_interleaved_group_whose_worker_dies_is_run_case_by_case(sweep):
    """A sweep point timed side by side in one worker: when a case kills that worker (the kernel's OOM killer)
    or hangs it, the group's cases are measured again one by one, so the one at fault is recorded and the
    others are measured; the sweep goes on. (INTERLEAVED, run by the ``sweep`` fixture after its own cases.)"""
    recs = {line: o.rec for line, o in sweep.interleaved.items()}
    assert recs["killer"].status == "crashed"
    assert recs["fine"].ok and recs["also fine"].ok and recs["next point"].ok
    assert not recs["fine"].group                                  # measured alone after the group was lost


def test_an_interleaved_group_with_an_exception_keeps_its_worker(sweep):
    """A case of a group that raises is that case's error; the group's other cases are measured in the same
    worker, which lives on."""
    out = sweep.interleaved
    assert [out[line].rec.status for line in ("next point", "raises", "after it")] == ["ok", "error", "ok"]
    assert len(out["next point"].built_in) == 1
    assert out["next point"].built_in == out["raises"].built_in == out["after it"].built_in
    assert out["after it"].worker_pid in out["after it"].built_in


@pytest.mark.parametrize("crash, after", [("sigkill", "exit3"), ("exit3", "boom")])
def test_a_crash_replaces_the_worker(sweep, crash, after):
    """The worker that crashed is gone when its case's record comes; the next case is built by a fresh one."""
    o = sweep.out[crash]
    assert o.rec.status == "crashed" and o.worker_pid is None
    assert len(o.built_in) == 1 and not psutil.pid_exists(next(iter(o.built_in)))
    assert sweep.out[after].built_in and sweep.out[after].built_in.isdisjoint(o.built_in)


def test_the_worker_outlives_exceptions_and_caught_ooms(sweep):
    """Only a crash or a timeout replaces the worker: the worker started after exit3 ran boom,
    both OOMs and ok_d."""
    workers = [sweep.out[line].built_in for line in ("boom", "torch_oom", "memory_error", "ok_d")]
    assert all(len(w) == 1 for w in workers) and len(set().union(*workers)) == 1
    assert sweep.out["ok_d"].worker_pid in workers[0]


def test_a_prestarted_worker_is_taken_by_the_next_executor():
    """``prestart`` spawns the worker before the run calibrates (issue 26: start the worker while calibrating);
    the executor then waits only for what is left of its start, and uses that worker."""
    from harness.executors import process
    process.prestart()
    process.prestart()                                    # at most one is kept
    assert len(process._prestarted) == 1
    proc = process._prestarted[0][0]
    ex = process.ProcessExecutor()
    try:
        ex._ensure()
        assert ex.proc is proc and process._prestarted == [] and ex.starts == 1 and proc.is_alive()
    finally:
        ex.close()
