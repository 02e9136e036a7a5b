"""Run one Case: resolve → fake pass (params, MACs, memory estimate, guard) → build → time → memory.

Owns the mapping of failures to statuses: an out-of-memory is ``oom``, a case that cannot fit
the memory budget is ``skipped`` with its estimate, anything else is ``error``. Timeouts and
crashes are the executor's (a case cannot time itself out from inside).
"""
from __future__ import annotations

import gc
import time
import traceback
from dataclasses import asdict, dataclass
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from harness import flops as flop_counter
from harness import memory, registry
from harness.env import usable_cores
from harness.errors import BenchInputError
from harness.fake import fake_case
from harness.load import Load, LoadMonitor
from harness.plugins import load_files as load_plugin_files
from harness.records import CaseRecord
from harness.spec import ArchSpec, Case, Workload
from harness.stats import summarize_rounds
from harness.steps import cast_inputs, make_step
from harness.timing import TimingConfig, TimingResult, measure, measure_interleaved

MiB = 1024 * 1024


@dataclass(frozen=True)
class RunOptions:
    """How cases are measured; the same for every case of a run."""

    timing: TimingConfig = TimingConfig()
    timeout_s: float = 300.0
    memory_budget_bytes: int | None = None   # None: harness.memory.memory_budget(device)
    debug: bool = False
    plugins: tuple[str, ...] = ()   # plug-in files (``--plugin``), imported once per process before a case
    interleave: bool = False        # time the cases of a sweep point side by side (harness.runner.run_group)


def resolved_threads(w: Workload) -> int:
    return w.threads or usable_cores()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                             or "failed to allocate" in text)


def static_bytes(model: nn.Module, inputs: tuple) -> int:
    """Bytes alive before a step runs: parameters, buffers and inputs."""
    return memory.tensor_bytes(model) + memory.tensor_bytes(x for x in inputs if isinstance(x, torch.Tensor))


def fake_pass(spec: ArchSpec, w: Workload, device: torch.device, want_flops: bool,
              gaps: dict[str, str] | None = None) -> dict[str, float]:
    """Params, MACs/FLOPs, bytes moved and the estimated peak bytes, on fake tensors (no memory, no arithmetic).
    Work the counter cannot count leaves ``macs``/``flops`` out (never a partial count, never 0): the ops and
    why go into ``gaps`` when given, else :class:`harness.flops.UncountedFlopsError` is raised."""
    out: dict[str, float] = {}
    model, inputs, mode = fake_case(spec, w, device)
    with mode:
        out["params"] = float(flop_counter.count_params(model))
        step = make_step(model, inputs, w.mode)
        peak: list[int] = []
        if want_flops:   # one fake step both counted and tracked: fake dispatch is the cost here
            counted = flop_counter.count_flops(lambda: peak.append(memory.estimate_peak(step)),
                                               allow_gaps=gaps is not None)
            if counted.complete:
                out["macs"], out["flops"] = float(counted.macs), float(counted.flops)
                out["bytes_moved"] = float(counted.bytes_moved)   # op-level traffic, no cross-op reuse (flops.py)
            else:
                gaps.update(counted.gaps)                         # type: ignore[union-attr]
        else:
            peak.append(memory.estimate_peak(step))
        out["est_peak_bytes"] = float(static_bytes(model, inputs) + peak[0])
        if spec.cost is not None:
            names = {"macs": "analytic_fwd_macs"}   # cost() gives forward MACs whatever the mode
            out.update({names.get(k, f"analytic_{k}"): float(v) for k, v in spec.cost(spec.config, w).items()})
    return out


@dataclass
class Prepared:
    """A case past its fake pass and built on its device, ready to be timed and measured."""

    case: Case
    spec: ArchSpec
    metrics: dict[str, float]
    config: dict[str, Any]
    note: str
    t0: float
    model: nn.Module
    inputs: tuple
    step: Callable[[], object]


def failed_record(case: Case, exc: BaseException, opts: RunOptions, **kw: Any) -> CaseRecord:
    """A case's failure as its record: ``oom`` for out-of-memory, ``error`` otherwise (one-line message)."""
    if isinstance(exc, BenchInputError):
        return case.record("error", str(exc), **kw)
    status = "oom" if is_oom(exc) else "error"
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if opts.debug:
        message += "\n" + "".join(traceback.format_exception(exc))
    return case.record(status, message, **kw)


def prepare(case: Case, opts: RunOptions) -> CaseRecord | Prepared:
    """Resolve, fake pass (params, MACs, memory estimate), budget guard, build. A case that ends here (skipped,
    failed, or needing neither latency nor memory) comes back as its record."""
    t0 = time.perf_counter()
    w = case.workload
    threads = resolved_threads(w)
    torch.set_num_threads(threads)
    metrics: dict[str, float] = {"threads": float(threads)}
    config: dict[str, Any] = {}

    def done(status: str, message: str = "") -> CaseRecord:
        return case.record(status, message, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)

    try:
        load_plugin_files(opts.plugins)    # a spawned worker has only the built-ins until it imports these
        spec = registry.resolve(case.arch, **dict(case.overrides))
        config = asdict(spec.config)
        device = torch.device(w.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return done("skipped", "CUDA is not available on this machine")
        gaps: dict[str, str] = {}
        metrics.update(fake_pass(spec, w, device, "flops" in case.metrics, gaps))
        note = ("MACs not counted (no formula for: " + "; ".join(f"{op}: {why}" for op, why in gaps.items())
                + ")") if gaps else ""
        budget = opts.memory_budget_bytes or memory.memory_budget(device)
        if metrics["est_peak_bytes"] > budget:
            return done("skipped", f"estimated peak {metrics['est_peak_bytes'] / MiB:,.0f} MiB exceeds the "
                                   f"memory budget {budget / MiB:,.0f} MiB")
        if not {"latency", "memory"} & set(case.metrics):
            return done("ok", note)
        torch.manual_seed(0)
        model = spec.build(spec.config).to(device=device, dtype=w.torch_dtype)
        inputs = cast_inputs(spec.make_inputs(spec.config, w, device), w.torch_dtype)
        step = make_step(model, inputs, w.mode)
        return Prepared(case, spec, metrics, config, note, t0, model, inputs, step)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        return failed_record(case, exc, opts, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)


def add_timing(p: Prepared, timed: TimingResult, load: Load | None) -> None:
    """The timing's summary (its interval covers the spread between rounds) and the machine's load."""
    w = p.case.workload
    p.metrics.update(summarize_rounds(timed.samples_s, timed.rounds))
    p.metrics.update(cold_ms=timed.cold_s * 1e3, block_size=float(timed.block_size),
                     throughput_per_s=w.batch_size / (p.metrics["median_ms"] / 1e3))
    if load is not None:
        p.metrics.update(load.metrics())


def measure_memory(p: Prepared) -> None:
    """The memory pass (separate from timing): allocator peaks on CUDA, the tensor peak and RSS on the CPU."""
    device = torch.device(p.case.workload.device)
    if device.type == "cuda":
        p.metrics.update({k: float(v) for k, v in memory.measure_peak_cuda(p.step, device).items()})
        p.metrics["peak_bytes"] = p.metrics["cuda_max_allocated_bytes"]
    else:
        static = static_bytes(p.model, p.inputs)
        peak = memory.measure_peak_cpu(p.step)
        p.metrics["activation_peak_bytes"] = float(peak["tensor_peak_bytes"])
        p.metrics["peak_bytes"] = float(static + peak["tensor_peak_bytes"])
        if peak.get("rss_hwm_bytes") is not None:
            p.metrics["rss_hwm_bytes"] = float(peak["rss_hwm_bytes"])
            p.metrics["rss_delta_bytes"] = float(peak["rss_hwm_bytes"] - peak["rss_before_bytes"])


def ok_record(p: Prepared, samples: tuple[float, ...] = (), rounds: tuple[int, ...] = (), group: str = ""
            ) -> CaseRecord:
    return p.case.record("ok", p.note, config=p.config, metrics=p.metrics, samples_s=samples, rounds=rounds,
                         group=group, duration_s=time.perf_counter() - p.t0)


def run_case(case: Case, opts: RunOptions) -> CaseRecord:
    """Measure one case in this process and return its Record (never raises for a case's own failure)."""
    p = prepare(case, opts)
    try:
        if isinstance(p, CaseRecord):
            return p
        timed = None
        if "latency" in case.metrics:
            monitor = LoadMonitor()
            monitor.start()
            timed = measure(p.step, opts.timing, p.case.workload.device)
            add_timing(p, timed, monitor.stop())
        if "memory" in case.metrics:
            measure_memory(p)
        return ok_record(p, timed.samples_s if timed else (), timed.rounds if timed else ())
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        return failed_record(case, exc, opts, config=p.config, metrics=p.metrics, duration_s=time.perf_counter() - p.t0)
    finally:
        del p
        _release()


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_group(cases: Sequence[Case], opts: RunOptions) -> list[CaseRecord]:
    """Measure ``cases`` side by side in this process: each is prepared (and its memory measured) in turn and
    kept built; their timings then alternate in rounds (:func:`harness.timing.measure_interleaved`), so a
    ratio of two of them (:func:`harness.stats.paired_ratio`) cancels the machine's drift. Cases whose models
    would not fit beside those already built are measured in a next sub-group. Records come back in order."""
    out: dict[str, CaseRecord] = {}
    built: list[Prepared] = []
    budget: float | None = None          # a group is on one device (harness.executors.base.interleave_groups)

    def flush() -> None:
        timed_cases = [p for p in built if "latency" in p.case.metrics]
        group = f"{timed_cases[0].case.key}+{len(timed_cases)}" if len(timed_cases) > 1 else ""
        monitor = LoadMonitor()
        monitor.start()
        threads = [resolved_threads(p.case.workload) for p in timed_cases]
        results = measure_interleaved([p.step for p in timed_cases], opts.timing,
                                      timed_cases[0].case.workload.device, seed=len(out),
                                      before=[lambda t=t: torch.set_num_threads(t) for t in threads]
                                      ) if timed_cases else []
        load = monitor.stop()
        for p, res in zip(timed_cases, results):
            if isinstance(res, BaseException):
                out[p.case.key] = failed_record(p.case, res, opts, config=p.config, metrics=p.metrics,
                                                duration_s=time.perf_counter() - p.t0)
            else:
                add_timing(p, res, load)
                out[p.case.key] = ok_record(p, res.samples_s, res.rounds, group)
        for p in built:
            out.setdefault(p.case.key, ok_record(p))
        built.clear()
        _release()

    for case in cases:
        p = prepare(case, opts)
        if isinstance(p, CaseRecord):
            out[case.key] = p
            continue
        if budget is None:
            budget = opts.memory_budget_bytes or memory.memory_budget(torch.device(case.workload.device))
        held = sum(static_bytes(b.model, b.inputs) for b in built)      # the models kept built, with their inputs
        if built and held + p.metrics["est_peak_bytes"] > budget:
            flush()                       # measure those already built, then start a new sub-group with this one
        try:
            if "memory" in case.metrics:
                measure_memory(p)
        except Exception as exc:  # noqa: BLE001
            out[case.key] = failed_record(case, exc, opts, config=p.config, metrics=p.metrics,
                                          duration_s=time.perf_counter() - p.t0)
            continue
        built.append(p)
    if built:
        flush()
    return [out[c.key] for c in cases]
