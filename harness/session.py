"""Running a suite into the store: open (or resume) a run, calibrate the peak, execute the cases.

Shared by ``bench run`` and ``bench claims``. Nothing here prints: progress goes to the ``on_record``
callback and to the ``bench`` logger; the caller renders both.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.calibrate import calibrate_run
from harness.env import fingerprint, usable_cores
from harness.executors import make_executor
from harness.records import CaseRecord
from harness.runner import RunOptions
from harness.spec import Case
from harness.store import Store
from harness.suite import Suite
from harness.timing import TimingConfig

log = logging.getLogger("bench")


def run_options(quick: bool, timeout: float | None = None, **kw: Any) -> RunOptions:
    """The timing and per-case timeout of a ``--quick`` or full run (timeout default 120 s / 600 s)."""
    return RunOptions(timing=TimingConfig.quick() if quick else TimingConfig(),
                      timeout_s=timeout or (120.0 if quick else 600.0), **kw)


@dataclass(frozen=True)
class OpenedRun:
    """A run ready to execute: its id, the cases still to measure, and how many were already stored."""

    run_id: str
    todo: list[Case]
    already_stored: int = 0


def open_run(store: Store, suite: Suite, cases: Sequence[Case], *, resume: bool, quick: bool,
             timeout: float | None, calibrate: bool = True, extra_options: dict[str, Any] | None = None
             ) -> OpenedRun:
    """A new run for ``cases`` (with the suite's text and spec), or the newest run of the suite to complete."""
    previous = store.resumable(suite.name, quick) if resume else None
    if previous is not None:
        done = store.stored_keys(previous.id)
        todo = [c for c in cases if c.key not in done]
        store.reopen_run(previous.id, max(previous.n_cases, len(cases)))
        log.info("resuming run %s: %d of %d cases already stored", previous.id, len(cases) - len(todo), len(cases))
        return OpenedRun(previous.id, todo, len(cases) - len(todo))
    if resume:
        log.info("no earlier run of %s to resume; starting a new one", suite.name)
    threads = max({c.workload.threads or usable_cores() for c in cases} or {usable_cores()})
    options = {"quick": quick, "timeout": timeout, "argv": sys.argv[1:], **(extra_options or {})}
    if calibrate:
        used: dict[str, set[str]] = {}
        for c in cases:
            used.setdefault(c.workload.device, set()).add(c.workload.dtype)
        options["peak"] = calibrate_peak(used, threads)
    run_id = store.create_run(suite.name, str(Path(suite.path).resolve()), quick, len(cases),
                              fingerprint(threads=threads), options, suite_text=suite.text, spec=suite.spec)
    return OpenedRun(run_id, list(cases))


def calibrate_peak(devices: dict[str, set[str]], threads: int) -> dict[str, Any]:
    """This machine's measured peak per device and dtype the cases use (stored in the run's options);
    {} if calibration fails."""
    log.info("calibrating peak matmul FLOP/s and copy bandwidth (%d threads; --no-calibrate skips)", threads)
    try:
        peak = calibrate_run(devices, threads)
    except Exception as exc:  # noqa: BLE001 — a failed calibration must not cost the run
        log.warning("calibration failed, run stored without a peak: %s: %s", type(exc).__name__, exc)
        return {}
    for device, p in peak.items():
        rates = ", ".join(f"{dt} {v / 1e9:,.0f}" for dt, v in p["matmul_flops_per_s"].items())
        log.info("peak on %s: matmul GFLOP/s %s; copy %.1f GB/s", device, rates, p["copy_bytes_per_s"] / 1e9)
    return peak


def execute(store: Store, run_id: str, todo: Sequence[Case], opts: RunOptions, executor_name: str,
            on_record: Callable[[CaseRecord], None] | None = None) -> int:
    """Run the cases, storing each as it finishes (then ``on_record(record)``); returns how many errored.

    On Ctrl-C the run is marked ``interrupted`` (finished cases stay stored) and KeyboardInterrupt propagates.
    """
    failed = 0
    executor = make_executor(executor_name)
    try:
        for rec in executor.run(todo, opts):
            store.add_record(run_id, rec)
            failed += rec.status == "error"
            if on_record is not None:
                on_record(rec)
    except KeyboardInterrupt:
        store.finish_run(run_id, "interrupted")
        raise
    finally:
        executor.close()
    store.finish_run(run_id, "done")
    return failed
