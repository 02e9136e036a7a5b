"""Running a suite into the store: open (or resume) a run, calibrate the peak, execute the cases.

Shared by ``bench run`` and ``bench claims``; prints progress on the console it is given.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.env import fingerprint, usable_cores
from harness.executors import make_executor
from harness.runner import RunOptions
from harness.store import Store
from harness.timing import TimingConfig


def run_options(quick: bool, timeout: float | None = None, **kw: Any) -> RunOptions:
    """The timing and per-case timeout of a ``--quick`` or full run (timeout default 120 s / 600 s)."""
    return RunOptions(timing=TimingConfig.quick() if quick else TimingConfig(),
                      timeout_s=timeout or (120.0 if quick else 600.0), **kw)


def open_run(store: Store, suite: Any, cases: list, *, resume: bool, quick: bool, timeout: float | None,
             calibrate: bool = True, console: Console, extra_options: dict[str, Any] | None = None
             ) -> tuple[str, list]:
    """A new run for ``cases`` (or the newest run of the suite to complete); returns its id and the cases to do."""
    previous = store.resumable(suite.name, quick) if resume else None
    if previous is not None:
        done = store.stored_keys(previous["id"])
        todo = [c for c in cases if c.key not in done]
        store.reopen_run(previous["id"], max(previous["n_cases"], len(cases)))
        console.print(f"resuming run {previous['id']}: {len(cases) - len(todo)} of {len(cases)} cases already stored")
        return previous["id"], todo
    if resume:
        console.print(f"no earlier run of {suite.name} to resume; starting a new one")
    threads = {c.workload.threads or usable_cores() for c in cases}
    env = fingerprint(threads=max(threads))
    options = {"quick": quick, "timeout": timeout, "argv": sys.argv[1:], **(extra_options or {})}
    if calibrate:
        options["peak"] = calibrate_peak(cases, max(threads), console)
    run_id = store.create_run(suite.name, str(Path(suite.path).resolve()), quick, len(cases), env, options)
    return run_id, cases


def calibrate_peak(cases: list, threads: int, console: Console) -> dict[str, Any]:
    """This machine's measured peak per device the cases use (stored in the run's options)."""
    from harness.calibrate import calibrate_run
    console.print(f"calibrating peak matmul FLOP/s and copy bandwidth ({threads} threads; --no-calibrate skips)")
    try:
        peak = calibrate_run({c.workload.device for c in cases}, threads)
    except Exception as exc:  # noqa: BLE001 — a failed calibration must not cost the run
        console.print(f"calibration failed, run stored without a peak: {type(exc).__name__}: {exc}")
        return {}
    for device, p in peak.items():
        rates = ", ".join(f"{dt} {v / 1e9:,.0f}" for dt, v in p["matmul_flops_per_s"].items())
        console.print(f"peak on {device}: matmul GFLOP/s {rates}; copy {p['copy_bytes_per_s'] / 1e9:,.1f} GB/s")
    return peak


def execute(store: Store, run_id: str, todo: list, opts: RunOptions, executor_name: str, total: int,
            console: Console) -> int:
    """Run the cases, storing each as it finishes; returns the number of cases that errored."""
    failed = 0
    executor = make_executor(executor_name)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[last]}"))
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(run_id, total=total, completed=total - len(todo), last="")
            for rec in executor.run(todo, opts):
                store.add_record(run_id, rec)
                failed += rec.status == "error"
                median = rec.metrics.get("median_ms")
                last = f"{rec.line} {rec.arch} → {rec.status}" + (f" {median:.2f} ms" if median else "")
                progress.update(task, advance=1, last=last)
    except KeyboardInterrupt:
        store.finish_run(run_id, "interrupted")
        console.print(f"interrupted: finished cases are stored; `bench run ... --resume` completes run {run_id}")
        sys.exit(130)
    finally:
        executor.close()
    store.finish_run(run_id, "done")
    return failed
