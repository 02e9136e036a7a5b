"""Running a suite into the store: open (or resume) a run, calibrate the peak, execute the cases.

Shared by ``bench run`` and ``bench claims``. Nothing here prints: progress goes to the ``on_record``
callback and to the ``bench`` logger; the caller renders both.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.calibrate import calibrate_run
from harness.env import fingerprint, usable_cores
from harness.executors import make_executor
from harness.overhead import RunOverhead, process_age_s, run_overhead, summary_line
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
    opened_at: float = 0.0        # perf_counter when open_run began (the run's wall time counts from there)
    startup_s: float = 0.0        # this process's life before that (imports, suite loading): first run only
    calibrate_s: float = 0.0


_opened: dict[str, OpenedRun] = {}
"""Runs opened in this process, by id, until :func:`execute` accounts their wall time."""
_process_start_counted = False


def _startup_s() -> float:
    """This process's age the first time a run opens in it (its imports and set-up belong to that run); 0 after."""
    global _process_start_counted
    if _process_start_counted:
        return 0.0
    _process_start_counted = True
    try:
        return process_age_s()
    except Exception as exc:  # noqa: BLE001 — no process table: the run's wall then starts at open_run
        log.warning("this process's start time is unknown (%s): start-up left out of the run's time", exc)
        return 0.0


def open_run(store: Store, suite: Suite, cases: Sequence[Case], *, resume: bool, quick: bool,
             timeout: float | None, calibrate: bool = True, extra_options: dict[str, Any] | None = None
             ) -> OpenedRun:
    """A new run for ``cases`` (with the suite's text and spec), or the newest run of the suite to complete.

    Either way this process becomes the run's one driver (its lease, released when :func:`execute` ends): a
    ``resume`` of a run another live process is driving raises :class:`harness.store.RunBusyError`."""
    opened_at, startup_s = time.perf_counter(), _startup_s()
    previous = store.resumable(suite.name, quick) if resume else None
    if previous is not None:
        store.claim_run(previous.id)     # one driver per run: RunBusyError (one line, exit 2) if another is live
        done = store.stored_keys(previous.id)
        todo = [c for c in cases if c.key not in done]
        store.reopen_run(previous.id, max(previous.n_cases, len(cases)))
        log.info("resuming run %s: %d of %d cases already stored", previous.id, len(cases) - len(todo), len(cases))
        return _remember(OpenedRun(previous.id, todo, len(cases) - len(todo), opened_at, startup_s))
    if resume:
        log.info("no earlier run of %s to resume; starting a new one", suite.name)
    threads = max({c.workload.threads or usable_cores() for c in cases} or {usable_cores()})
    options = {"quick": quick, "timeout": timeout, "argv": sys.argv[1:], **(extra_options or {})}
    calibrate_s = 0.0
    if calibrate:
        used: dict[str, set[str]] = {}
        for c in cases:
            used.setdefault(c.workload.device, set()).add(c.workload.dtype)
        t0 = time.perf_counter()
        options["peak"] = calibrate_peak(used, threads)
        calibrate_s = time.perf_counter() - t0
    run_id = store.create_run(suite.name, str(Path(suite.path).resolve()), quick, len(cases),
                              fingerprint(threads=threads), options, suite_text=suite.text, spec=suite.spec,
                              lease=True)
    return _remember(OpenedRun(run_id, list(cases), 0, opened_at, startup_s, calibrate_s))


def _remember(opened: OpenedRun) -> OpenedRun:
    _opened[opened.run_id] = opened
    return opened


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


PEAK_DRIFT = 0.2
"""An end-of-run peak more than this share away from the start's is reported (the machine changed under the run)."""


def max_peak(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per device and dtype, the higher of two calibrations' matmul FLOP/s and copy bandwidth: the most this
    machine was seen to reach during the run (a case above it is above the roof, not above a slow calibration)."""
    out: dict[str, Any] = {}
    for device in sorted(set(a) | set(b)):
        pa, pb = a.get(device) or {}, b.get(device) or {}
        if not pa or not pb:
            out[device] = pa or pb
            continue
        merged = {**pa, **{k: v for k, v in pb.items() if k not in pa}}
        fa, fb = pa.get("matmul_flops_per_s", {}), pb.get("matmul_flops_per_s", {})
        merged["matmul_flops_per_s"] = {dt: max(v for v in (fa.get(dt), fb.get(dt)) if v is not None)
                                        for dt in sorted(set(fa) | set(fb))}
        if "copy_bytes_per_s" in pa or "copy_bytes_per_s" in pb:
            merged["copy_bytes_per_s"] = max(v for v in (pa.get("copy_bytes_per_s"), pb.get("copy_bytes_per_s"))
                                             if v is not None)
        out[device] = merged
    return out


def recheck_peak(store: Store, run_id: str, cases: Sequence[Case]) -> None:
    """Calibrate again at the end of the run, under the conditions its cases met (same threads, the machine's
    load then): the run keeps both (``peak_start``, ``peak_end``) and its ``peak`` becomes the higher of the two
    per device and dtype, so ``% peak`` is never inflated by a calibration taken at a slow moment; a drift of
    more than :data:`PEAK_DRIFT` is logged. A run opened without a peak, or resumed, is left as it is.

    CPU devices only (issue 26: the GPU runs calibrated twice): the CPU's peak moves with the machine's load
    (other processes, and the worker's start, which overlaps the start calibration: ``prestart``), a GPU's
    does not, so a run on CUDA alone calibrates once."""
    run = store.get_run(run_id)
    start = run.options.get("peak") or {}
    if not start or "peak_end" in run.options or not cases:
        return
    used: dict[str, set[str]] = {}
    for c in cases:
        if c.workload.device == "cpu":   # a GPU's peak does not move with the host's load: calibrated once
            used.setdefault(c.workload.device, set()).add(c.workload.dtype)
    if not used:
        return
    threads = max({c.workload.threads or usable_cores() for c in cases})
    end = calibrate_peak(used, threads)
    if not end:
        return
    for device, p in end.items():
        for dt, v in p.get("matmul_flops_per_s", {}).items():
            before = (start.get(device) or {}).get("matmul_flops_per_s", {}).get(dt)
            if before and abs(v / before - 1) > PEAK_DRIFT:
                log.warning("peak on %s %s moved from %.0f to %.0f GFLOP/s during the run: %% peak uses the higher",
                            device, dt, before / 1e9, v / 1e9)
    store.update_options(run_id, peak_start=start, peak_end=end, peak=max_peak(start, end))


def execute(store: Store, run_id: str, todo: Sequence[Case], opts: RunOptions, executor_name: str,
            on_record: Callable[[CaseRecord], None] | None = None) -> int:
    """Run the cases, storing each as it finishes (then ``on_record(record)``); returns how many errored.

    At the end (also on Ctrl-C) the run's time accounting (:class:`harness.overhead.RunOverhead`: each part's
    share of the wall time since :func:`open_run` began, this process's start-up included) is stored in the
    run's options as ``overhead`` and its summary line logged. On Ctrl-C the run is marked ``interrupted``
    (finished cases stay stored) and KeyboardInterrupt propagates.
    """
    opened = _opened.pop(run_id, None)
    started = time.perf_counter()
    failed = 0
    parts: list[tuple[dict[str, float], float | None]] = []
    executor = make_executor(executor_name)
    status: str | None = None       # another exception leaves the run "running" (resumable), as it was
    try:
        for rec in executor.run(todo, opts):
            store.add_record(run_id, rec)
            parts.append((dict(rec.metrics), None if rec.group else rec.duration_s))   # a group's overlap
            failed += rec.status == "error"
            if on_record is not None:
                on_record(rec)
        status = "done"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        try:
            executor.close()
            if status == "done" and opened is not None and opened.calibrate_s > 0:
                t0 = time.perf_counter()
                recheck_peak(store, run_id, todo)
                opened = dataclasses.replace(opened, calibrate_s=opened.calibrate_s + time.perf_counter() - t0)
            if status is not None:
                wall = (opened.startup_s + time.perf_counter() - opened.opened_at if opened is not None
                        else time.perf_counter() - started)
                _store_overhead(store, run_id, wall, parts, opened, executor)
                store.finish_run(run_id, status)
        finally:
            store.release_run(run_id)    # also after an error: the run stays resumable, by anyone
    return failed


def _store_overhead(store: Store, run_id: str, wall_s: float, parts: list[tuple[dict[str, float], float | None]],
                    opened: OpenedRun | None, executor: object) -> RunOverhead | None:
    """Account the run's wall time, store it with the run (options ``overhead``) and log its summary line. With
    several workers measuring at once (``--devices``: the executor's ``concurrency``), the parts are accounted
    against worker-seconds (wall × workers), since the workers' case parts overlap in wall time."""
    workers = max(1, int(getattr(executor, "concurrency", 1) or 1))
    try:
        o = run_overhead(wall_s * workers, parts, startup_s=opened.startup_s if opened else 0.0,
                         calibrate_s=opened.calibrate_s if opened else 0.0,
                         workers_s=getattr(executor, "startup_s", 0.0), worker_starts=getattr(executor, "starts", 0))
    except ValueError as exc:          # parts that overlap: a bug in the accounting, said rather than stored
        log.warning("time accounting failed: %s", exc)
        return None
    store.update_options(run_id, overhead={**o.to_dict(), "workers": workers})
    log.info("%s%s", summary_line(o), f" (worker-seconds of {workers} workers)" if workers > 1 else "")
    return o
