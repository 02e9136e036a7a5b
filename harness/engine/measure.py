"""Measure a prepared step (:func:`measure_prepared`): the one measuring protocol of every path — a run's case, a
group timed side by side (``--interleave``), the A/B worker of ``bench check --against``, and each of the
processes a replicated case (``--processes``) runs in.

A case is first prepared (:func:`harness.engine.runner.prepare`: fake pass, build, compile) into a
:class:`Prepared`: its step (:class:`harness.engine.steps.Step`), built model and inputs, and the metrics counted
so far. Then, in one order whatever the path:

1. **timing** (when the case measures latency): cold call, warm-up and blocked samples in rounds
   (:class:`harness.instruments.timing.Sampler`) — the step timed alone here (:func:`harness.instruments.timing.measure`,
   under a load monitor), or side by side with others by the caller and handed in as :class:`Timed`; then the
   timing's summary, the step's own figures (``Step.figures``) and the time parts (harness.engine.overhead);
2. **the memory pass and the counting pass** (:func:`memory_and_kernels`): the step's memory by kind
   (``Step.memory``) and, in one real call, the SDPA kernels that ran and the MACs they executed;
3. **energy** (``RunOptions.energy``): the step repeated over a window the device's energy counter can resolve;
4. **the record**. A case's failure in any part is its record (``oom`` or ``error``), never raised; what was
   measured before it stays in the record's metrics.
"""
from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.analysis.stats import summarize_rounds
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord
from harness.contract.spec import ArchSpec, Case
from harness.engine.models import MODELS
from harness.engine.options import RunOptions
from harness.engine.overhead import metric_name
from harness.engine.steps import Step
from harness.instruments import energy, kernels, memory
from harness.instruments.load import Load, LoadMonitor
from harness.instruments.timing import TimingResult, measure


@dataclass
class Prepared:
    """A case past its fake pass and built on its device, ready to be timed and measured."""

    case: Case
    spec: ArchSpec
    metrics: dict[str, float]
    config: dict[str, Any]
    note: str
    t0: float
    model: nn.Module               # the built model (a compiled case steps ``step``, its compiled wrapper)
    inputs: tuple
    step: Step
    eager_step: Step | None = None   # the uncompiled step of a compiled case (the kernel probe)
    sdpa_backend: str = ""


@dataclass(frozen=True)
class Timed:
    """A prepared step's timing taken by the caller: side by side with other steps
    (:func:`harness.instruments.timing.measure_interleaved`, harness.engine.runner.run_group) or round by round on
    request (the A/B worker, harness.engine.ab_worker)."""

    result: TimingResult
    load: Load | None = None         # the machine's load while it was taken
    warmup_s: float | None = None    # this step's share of the time outside the samples (None: ``result.total_s`` less them)
    group: str = ""                  # the group label of steps timed side by side


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                             or "failed to allocate" in text)


def failed_record(case: Case, exc: BaseException, opts: RunOptions, **kw: Any) -> CaseRecord:
    """A case's failure as its record: ``oom`` for out-of-memory, ``error`` otherwise (one-line message)."""
    if isinstance(exc, BenchInputError):
        return case.record("error", str(exc), **kw)
    status = "oom" if is_oom(exc) else "error"
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if opts.debug:
        message += "\n" + "".join(traceback.format_exception(exc))
    return case.record(status, message, **kw)


def static_bytes(model: nn.Module, inputs: tuple) -> int:
    """Bytes alive before a step runs: parameters, buffers and inputs (a step adds its own: ``Step.state_bytes``)."""
    return memory.tensor_bytes(model) + memory.tensor_bytes(x for x in inputs if isinstance(x, torch.Tensor))


@contextlib.contextmanager
def timed_part(metrics: dict[str, float], part: str) -> Iterator[None]:
    """Add the block's wall seconds to ``metrics["time_<part>_s"]`` (harness.engine.overhead), also when it raises."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        name = metric_name(part)
        metrics[name] = metrics.get(name, 0.0) + time.perf_counter() - t0


def add_timing(p: Prepared, timed: TimingResult, load: Load | None) -> None:
    """The timing's summary (its interval covers the spread between rounds) and the machine's load."""
    w = p.case.workload
    p.metrics.update(summarize_rounds(timed.samples_s, timed.rounds))
    p.metrics["n_processes"] = 1.0          # harness.engine.replicate overwrites this when the case ran in several
    p.metrics.update(cold_ms=timed.cold_s * 1e3, block_size=float(timed.block_size),
                     throughput_per_s=w.batch_size / (p.metrics["median_ms"] / 1e3))
    if timed.l2_flush_bytes:
        p.metrics["l2_flush_bytes"] = float(timed.l2_flush_bytes)
    extra, why = p.step.figures(timed, w, p.metrics)     # a generation's clocks, a training step's rates, ...
    p.metrics.update(extra)
    if why and why not in p.note:
        p.note = f"{p.note}; {why}" if p.note else why
    if load is not None:
        p.metrics.update(load.metrics())


def add_time_parts(p: Prepared, timed: TimingResult, warmup_s: float | None = None) -> None:
    """The timing's parts (harness.engine.overhead): the timed samples (Σ per-call sample × block size) and the rest of
    the timing — cold call, warm-up, block-size calibration (``warmup_s`` when the caller split it)."""
    timed_s = sum(timed.samples_s) * timed.block_size
    p.metrics[metric_name("timed")] = timed_s
    p.metrics[metric_name("warmup")] = max(0.0, timed.total_s - timed_s) if warmup_s is None else warmup_s


def measure_memory(p: Prepared) -> None:
    """The memory pass (separate from timing), as the step takes it (:meth:`harness.engine.steps.Step.memory`)."""
    p.metrics.update(p.step.memory(static_bytes(p.model, p.inputs), torch.device(p.case.workload.device)))


def memory_and_kernels(p: Prepared) -> None:
    """The memory pass (when the case measures memory) and :func:`harness.instruments.kernels.probe` in one real
    step: the SDPA kernel(s) that ran, and ``executed_macs`` = the counted (dense) ``macs`` minus what fused causal
    attention skipped (forward and backward). The probe watches the memory pass's call; a case without one, or
    a compiled case (the probe's function swap would make dynamo recompile), is probed on its eager step."""
    if "memory" in p.case.metrics and p.eager_step is None:
        with timed_part(p.metrics, "memory"):
            report = kernels.probe(lambda: measure_memory(p))
    else:
        if "memory" in p.case.metrics:
            with timed_part(p.metrics, "memory"):
                measure_memory(p)
        with timed_part(p.metrics, "count"):
            report = kernels.probe(p.eager_step or p.step)
    p.sdpa_backend = report.sdpa_backend
    if "macs" in p.metrics:
        p.metrics["executed_macs"] = float(report.executed_macs(p.metrics["macs"]))


def energy_pass(p: Prepared, opts: RunOptions) -> None:
    """The energy pass (``opts.energy``; separate from the timed samples, like the memory pass): the case's step
    repeated over a window long enough for the device's energy counter (:func:`harness.instruments.energy.measure_energy`),
    its seconds counted as the ``energy`` part (harness.engine.overhead). Where no counter is readable, or the counter
    fails, the energy metrics stay absent and the note says why (never a 0)."""
    if not opts.energy or "latency" not in p.case.metrics:
        return
    w = p.case.workload
    meter = energy.find_meter(w.device)
    if isinstance(meter, energy.Absent):
        p.note = "; ".join(x for x in (p.note, f"energy not measured: {meter.reason}") if x)
        return
    device = torch.device(w.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with timed_part(p.metrics, "energy"):
        try:
            median_ms = p.metrics.get("median_ms")
            result = energy.measure_energy(p.step, meter, opts.energy_config, sync,
                                           call_s=median_ms / 1e3 if median_ms else None)
        except energy.EnergyError as exc:
            p.note = "; ".join(x for x in (p.note, f"energy not measured: {exc}") if x)
            return
    p.metrics.update(result.metrics(w.batch_size, w.seq_len))
    if not result.step_ok:
        p.note = "; ".join(x for x in (p.note, f"energy: counter step {result.step_j:.3g} J is "
                                       f"{result.step_j / result.energy_j:.1%} of the window's energy "
                                       f"(over 2 %) at the {result.window_s:.1f} s cap") if x)


def ok_record(p: Prepared, samples: tuple[float, ...] = (), rounds: tuple[int, ...] = (), group: str = ""
              ) -> CaseRecord:
    return p.case.record("ok", p.note, config=p.config, metrics=p.metrics, samples_s=samples, rounds=rounds,
                         group=group, sdpa_backend=p.sdpa_backend, duration_s=time.perf_counter() - p.t0)


def measure_prepared(p: Prepared, opts: RunOptions, timed: Timed | None = None) -> CaseRecord:
    """Measure the prepared case ``p`` and return its record: timing, the memory and counting passes, energy, in
    that order (the module docstring) — the one measuring protocol, whatever path calls it.

    ``timed``: the step's timing, taken by the caller side by side with other steps; None times it alone here
    (:func:`harness.instruments.timing.measure` with ``opts.timing``). Either way only a case that measures
    latency is timed. A replica process (``opts.replica``: one whose record only lends its samples to the first
    process's — a replicated case's second and later processes, the A/B worker's) leaves out the memory, counting
    and energy passes. Never raises for
    the case's own failure: that is its record (:func:`failed_record`), with the metrics measured before it, and
    the process's kept model is dropped (a failed step may leave it half-way, and an out-of-memory wants the
    memory back)."""
    try:
        samples: tuple[float, ...] = ()
        rounds: tuple[int, ...] = ()
        group = ""
        if "latency" in p.case.metrics:
            if timed is None:
                monitor = LoadMonitor()
                monitor.start()
                result = measure(p.step, opts.timing, p.case.workload.device)
                timed = Timed(result, monitor.stop())
            add_timing(p, timed.result, timed.load)
            add_time_parts(p, timed.result, timed.warmup_s)
            samples, rounds, group = timed.result.samples_s, timed.result.rounds, timed.group
        if not opts.replica:
            memory_and_kernels(p)
            energy_pass(p, opts)
        return ok_record(p, samples, rounds, group)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        MODELS.clear()
        return failed_record(p.case, exc, opts, config=p.config, metrics=p.metrics,
                             duration_s=time.perf_counter() - p.t0)
