"""A run that owns its life: open (or resume, with its lease) → execute through any executor → store each case →
account the wall time → finish (``done``) or mark ``interrupted``; the one way every caller measures into a store
(``bench run``, ``bench baseline``/``check`` and ``--against``, ``bench compare --interleave``, ``bench claims``
and the pytest plugin).

Faults lose nothing:

* a case's own failure (an exception, an out-of-memory, a timeout, a dead worker) is its record, from the executor;
* Ctrl-C / SIGTERM: the run is marked ``interrupted`` and stays resumable (``--resume``); a killed driver's run
  stays ``running`` and its lease goes stale, so ``--resume`` completes it; a case is never stored twice;
* the store failing under the run (a database server gone, a disk full, a file turned read-only): writes are
  retried (:func:`harness.store.retry.retrying`: a server restart is ridden out), then the record in hand and every
  later one go to a local SQLite file (:data:`FALLBACK_DIR`), the executor is stopped, and
  :class:`StoreLostError` says in one line where they are and how to merge them back (``bench merge``).

Nothing here prints: progress goes to ``on_record`` and the ``bench`` logger.
"""
from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.instruments.calibrate import calibrate_run
from harness.instruments.energy import EnergyConfig
from harness.engine.env import fingerprint, usable_cores
from harness.contract.errors import BenchInputError
from harness.executors import Executor, make_executor
from harness.engine.overhead import RunOverhead, process_age_s, run_overhead, summary_line
from harness.contract.records import FAILED, CaseRecord, RunRecord, SuiteSpec
from harness.engine.runner import RunOptions
from harness.contract.spec import Case
from harness.store.db import Store, StoreWriteError
from harness.instruments.timing import TimingConfig

log = logging.getLogger("bench")

FALLBACK_DIR = Path("results")
"""Where the cases a lost store could not take are kept (``unsaved-RUN.sqlite``); the temporary folder if it
cannot be written either."""
PEAK_DRIFT = 0.2
"""An end-of-run peak more than this share away from the start's is reported (the machine changed under the run)."""


class StoreLostError(BenchInputError):
    """The store stopped taking writes during a run; the cases since are in a local SQLite file (exit 2)."""


def run_options(quick: bool, timeout: float | None = None, **kw: Any) -> RunOptions:
    """The timing and per-case timeout of a ``--quick`` or full run (timeout default 120 s / 600 s)."""
    if quick:
        kw.setdefault("energy_config", EnergyConfig.quick())
    return RunOptions(timing=TimingConfig.quick() if quick else TimingConfig(),
                      timeout_s=timeout or (120.0 if quick else 600.0), **kw)


_process_start_counted = False


def _startup_s() -> float:
    """This process's age the first time a run opens in it (its imports and set-up belong to that run); 0 after."""
    global _process_start_counted
    if _process_start_counted:
        return 0.0
    _process_start_counted = True
    try:
        return process_age_s()
    except Exception as exc:  # noqa: BLE001 — no process table: the run's wall then starts at open
        log.warning("this process's start time is unknown (%s): start-up left out of the run's time", exc)
        return 0.0


def devices_used(cases: Iterable[Case]) -> dict[str, set[str]]:
    """The dtypes the cases use on each device (what calibration measures)."""
    used: dict[str, set[str]] = {}
    for c in cases:
        used.setdefault(c.workload.device, set()).add(c.workload.dtype)
    return used


def run_threads(cases: Sequence[Case]) -> int:
    """The most threads any case pins (0 in a workload: every usable core)."""
    return max({c.workload.threads or usable_cores() for c in cases} or {usable_cores()})


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


@dataclass
class Run:
    """One run in a store, from :meth:`open` to :meth:`finish` (or ``with Run.open(...) as run:``)."""

    store: Store
    id: str
    todo: list[Case]                           # the cases still to measure (all of them, unless resumed)
    already_stored: int = 0
    opened_at: float = 0.0                     # perf_counter when open began (the run's wall time counts from there)
    startup_s: float = 0.0                     # this process's life before that (imports, suite loading): first run only
    calibrate_s: float = 0.0
    stored: int = 0                            # records this Run stored (here or in the fallback)
    failed: int = 0                            # records whose status is in FAILED
    status: str = "running"
    _parts: list[tuple[dict[str, float], float | None]] = field(default_factory=list)
    _workers: tuple[float, int, int] = (0.0, 0, 1)        # executors' start-up seconds, starts, most concurrency
    _fallback: Store | None = None
    _lost: str = ""                            # why the store stopped taking writes ("" while it takes them)

    # -- opening ---------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, store: Store, suite: str, cases: Sequence[Case], *, quick: bool, resume: bool = False,
             calibrate: bool = False, options: dict[str, Any] | None = None, suite_path: str = "",
             suite_text: str | None = None, spec: SuiteSpec | None = None, env: dict[str, Any] | None = None,
             invocation: dict[str, Any] | None = None) -> Run:
        """A new run of ``suite`` for ``cases``, or (``resume``) the newest run of the suite at this size, with the
        cases it still lacks. Either way this process becomes the run's one driver (its lease, released by
        :meth:`finish`): resuming a run another live process drives raises :class:`harness.store.leases.RunBusyError`.
        ``calibrate`` measures the machine's peak first (stored as ``options["peak"]``, re-checked at the end);
        ``invocation``: the command and options that made the run, stored with it as data."""
        opened_at, startup_s = time.perf_counter(), _startup_s()
        previous = store.resumable(suite, quick) if resume else None
        if previous is not None:
            store.claim_run(previous.id)
            done = store.stored_keys(previous.id)
            todo = [c for c in cases if c.key not in done]
            store.reopen_run(previous.id, max(previous.n_cases, len(cases)))
            log.info("resuming run %s: %d of %d cases already stored", previous.id, len(cases) - len(todo),
                     len(cases))
            return cls(store, previous.id, todo, len(cases) - len(todo), opened_at, startup_s)
        if resume:
            log.info("no earlier run of %s to resume; starting a new one", suite)
        threads = run_threads(cases)
        opts = {"quick": quick, "argv": sys.argv[1:], **(options or {})}
        calibrate_s = 0.0
        if calibrate and cases:
            t0 = time.perf_counter()
            opts["peak"] = calibrate_peak(devices_used(cases), threads)
            calibrate_s = time.perf_counter() - t0
        run_id = store.create_run(suite, suite_path, quick, len(cases), env or fingerprint(threads=threads), opts,
                                  suite_text=suite_text, spec=spec, lease=True, invocation=invocation)
        return cls(store, run_id, list(cases), 0, opened_at, startup_s, calibrate_s)

    @classmethod
    def open_suite(cls, store: Store, suite: Any, cases: Sequence[Case] | None = None, *, quick: bool,
                   **kw: Any) -> Run:
        """:meth:`open` for a loaded :class:`harness.contract.suite.Suite` (its name, path, text and spec stored)."""
        return cls.open(store, suite.name, list(suite.cases if cases is None else cases), quick=quick,
                        suite_path=str(Path(suite.path).resolve()), suite_text=suite.text, spec=suite.spec, **kw)

    # -- measuring -------------------------------------------------------------------------------------------------
    def execute(self, executor: Executor | str, opts: RunOptions, cases: Sequence[Case] | None = None,
                on_record: Callable[[CaseRecord], None] | None = None) -> int:
        """Measure ``cases`` (default: :attr:`todo`) through ``executor`` (an instance the caller keeps, or a name:
        made here and closed after), storing each record as it comes; returns how many failed. A store that stops
        taking writes ends the execution (:class:`StoreLostError`, after the cases are kept locally)."""
        owned = isinstance(executor, str)
        ex = make_executor(executor) if isinstance(executor, str) else executor
        before = (float(getattr(ex, "startup_s", 0.0) or 0.0), int(getattr(ex, "starts", 0) or 0))
        try:
            for rec in ex.run(self.todo if cases is None else cases, opts):
                self.add(rec)
                if on_record is not None:
                    on_record(rec)
        finally:
            if owned:
                ex.close()
            self.note_executor(ex, before)
        return self.failed

    def add(self, rec: CaseRecord) -> CaseRecord:
        """Store one finished case (the one place a run's records are written) and account its time parts; the
        record as stored. If the store has stopped taking writes, the record goes to the local fallback file
        and :class:`StoreLostError` is raised (once the caller has it, later records go there too)."""
        self._parts.append((dict(rec.metrics), None if rec.group else rec.duration_s))   # a group's overlap
        self.failed += rec.status in FAILED
        if not self._lost:
            try:
                self.store.add_record(self.id, rec)
                self.stored += 1
                return rec
            except StoreWriteError as exc:
                self._lost = exc.cause
        self._keep_locally(rec)
        raise self._lost_error()

    def note_executor(self, ex: object, before: tuple[float, int] = (0.0, 0)) -> None:
        """Account an executor's worker start-ups (and how many workers measured at once) to this run; ``before``:
        its start-up seconds and starts already counted (a kept executor that measured other runs)."""
        s, n, w = self._workers
        self._workers = (s + float(getattr(ex, "startup_s", 0.0) or 0.0) - before[0],
                         n + int(getattr(ex, "starts", 0) or 0) - before[1],
                         max(w, int(getattr(ex, "concurrency", 1) or 1)))

    # -- the end ---------------------------------------------------------------------------------------------------
    def finish(self, status: str = "done") -> RunOverhead | None:
        """End the run: re-check the peak (a completed, calibrated run), store the time accounting, set its status
        (``done`` or ``interrupted``) and release the lease; the accounting. Safe to call once the store is lost
        (nothing more is written there) and more than once (later calls do nothing)."""
        if self.status != "running":
            return None
        self.status = status
        overhead = None
        try:
            if self._lost:
                return None
            if status == "done" and self.calibrate_s > 0:
                t0 = time.perf_counter()
                self._recheck_peak()
                self.calibrate_s += time.perf_counter() - t0
            overhead = self._store_overhead()
            self.store.finish_run(self.id, status)
        except StoreWriteError as exc:
            self._lost = exc.cause
            raise self._lost_error() from None
        finally:
            self.store.release_run(self.id)        # also after an error: the run stays resumable, by anyone
        return overhead

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """``done`` after a clean exit, ``interrupted`` after Ctrl-C/SIGTERM (finished cases stay stored); after
        any other exception the run stays ``running`` (resumable) and its lease is released."""
        if kind is None:
            self.finish("done")
        elif issubclass(kind, (KeyboardInterrupt, SystemExit)):
            self.finish("interrupted")
        else:
            self.store.release_run(self.id)
            self.status = "failed"

    def record(self) -> RunRecord:
        return self.store.get_run(self.id)

    def records(self) -> list[CaseRecord]:
        return self.store.records(self.id)

    # -- inside ----------------------------------------------------------------------------------------------------
    def _recheck_peak(self) -> None:
        """Calibrate again at the end of the run, under the conditions its cases met: the run keeps both
        (``peak_start``, ``peak_end``) and its ``peak`` becomes the higher of the two per device and dtype, so
        ``% peak`` is never inflated by a calibration taken at a slow moment; a drift over PEAK_DRIFT is logged.
        CPU devices only (a GPU's peak does not move with the host's load)."""
        run = self.store.get_run(self.id)
        start = run.options.get("peak") or {}
        if not start or "peak_end" in run.options or not self.todo:
            return
        # CPU devices only: the CPU's peak moves with the machine's load (other processes, and the worker's start,
        # which overlaps the start calibration: ``prestart``); a GPU's does not, so a run on CUDA calibrates once
        used = {dev: dts for dev, dts in devices_used(self.todo).items() if dev == "cpu"}
        if not used:
            return
        end = calibrate_peak(used, run_threads(self.todo))
        if not end:
            return
        for device, p in end.items():
            for dt, v in p.get("matmul_flops_per_s", {}).items():
                before = (start.get(device) or {}).get("matmul_flops_per_s", {}).get(dt)
                if before and abs(v / before - 1) > PEAK_DRIFT:
                    log.warning("peak on %s %s moved from %.0f to %.0f GFLOP/s during the run: %% peak uses the "
                                "higher", device, dt, before / 1e9, v / 1e9)
        self.store.update_options(self.id, peak_start=start, peak_end=end, peak=max_peak(start, end))

    def _store_overhead(self) -> RunOverhead | None:
        """Account the run's wall time, store it with the run (options ``overhead``) and log its summary line. With
        several workers measuring at once (``--devices``), the parts are accounted against worker-seconds."""
        startup_s, starts, workers = self._workers
        wall = self.startup_s + time.perf_counter() - self.opened_at
        try:
            o = run_overhead(wall * workers, self._parts, startup_s=self.startup_s, calibrate_s=self.calibrate_s,
                             workers_s=startup_s, worker_starts=starts)
        except ValueError as exc:          # parts that overlap: a bug in the accounting, said rather than stored
            log.warning("time accounting failed: %s", exc)
            return None
        self.store.update_options(self.id, overhead={**o.to_dict(), "workers": workers})
        log.info("%s%s", summary_line(o), f" (worker-seconds of {workers} workers)" if workers > 1 else "")
        return o

    def _fallback_path(self) -> Path:
        name = f"unsaved-{self.id}.sqlite"
        for folder in (FALLBACK_DIR, Path(tempfile.gettempdir())):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                probe = folder / f".{name}.probe"
                probe.write_bytes(b"")
                probe.unlink()
                return (folder / name).resolve()
            except OSError:
                continue
        raise BenchInputError(f"the store {self.store.shown} stopped taking writes ({self._lost}) and no local "
                              "folder is writable to keep the cases measured", where="--store")

    def _keep_locally(self, rec: CaseRecord) -> None:
        """Write ``rec`` to the fallback file, creating it (with this run's id, environment and options) first."""
        if self._fallback is None:
            path = self._fallback_path()
            self._fallback = Store(f"sqlite:///{path}")
            try:
                run = self.store.get_run(self.id)
                env, options, suite, quick, n = run.env, run.options, run.suite, run.quick, run.n_cases
                invocation = dict(run.invocation)
            except Exception:  # noqa: BLE001 — the lost store cannot say: what this process knows
                env, options, suite, quick, n = fingerprint(), {}, rec.suite, False, len(self.todo)
                invocation = {}
            self._fallback.create_run(suite, "", quick, n, env, {**options, "fallback_of": self.store.shown},
                                      run_id=self.id, invocation=invocation)
        self._fallback.add_record(self.id, rec)
        self.stored += 1

    def _lost_error(self) -> StoreLostError:
        where = self._fallback.url.removeprefix("sqlite:///") if self._fallback is not None else "?"
        return StoreLostError(
            f"the store {self.store.shown} stopped taking writes ({self._lost}); the cases measured since are kept "
            f"in {where}: `bench merge {where} --store {self.store.shown}` adds them back, then `bench run ... "
            "--resume` completes the run", where="--store")
