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
from typing import Any

import torch
from torch import nn

from harness import flops as flop_counter
from harness import memory, registry
from harness.env import usable_cores
from harness.errors import BenchInputError
from harness.fake import fake_case
from harness.plugins import load_files as load_plugin_files
from harness.records import CaseRecord
from harness.spec import ArchSpec, Case, Workload
from harness.stats import summarize
from harness.steps import cast_inputs, make_step
from harness.timing import TimingConfig, measure

MiB = 1024 * 1024


@dataclass(frozen=True)
class RunOptions:
    """How cases are measured; the same for every case of a run."""

    timing: TimingConfig = TimingConfig()
    timeout_s: float = 300.0
    memory_budget_bytes: int | None = None   # None: harness.memory.memory_budget(device)
    debug: bool = False
    plugins: tuple[str, ...] = ()   # plug-in files (``--plugin``), imported once per process before a case


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


def measure_case(case: Case, spec: ArchSpec, opts: RunOptions, metrics: dict[str, float]) -> list[float]:
    """The real passes: timing, then memory in a separate pass. Fills ``metrics``; returns raw samples."""
    w = case.workload
    device = torch.device(w.device)
    torch.manual_seed(0)
    model = spec.build(spec.config).to(device=device, dtype=w.torch_dtype)
    inputs = cast_inputs(spec.make_inputs(spec.config, w, device), w.torch_dtype)
    step = make_step(model, inputs, w.mode)
    samples: list[float] = []
    if "latency" in case.metrics:
        timed = measure(step, opts.timing, device)
        samples = list(timed.samples_s)
        metrics.update(summarize(samples))
        metrics.update(cold_ms=timed.cold_s * 1e3, block_size=float(timed.block_size),
                       throughput_per_s=w.batch_size / (metrics["median_ms"] / 1e3))
    if "memory" in case.metrics:
        static = static_bytes(model, inputs)
        if device.type == "cuda":
            metrics.update({k: float(v) for k, v in memory.measure_peak_cuda(step, device).items()})
            metrics["peak_bytes"] = metrics["cuda_max_allocated_bytes"]
        else:
            peak = memory.measure_peak_cpu(step)
            metrics["activation_peak_bytes"] = float(peak["tensor_peak_bytes"])
            metrics["peak_bytes"] = float(static + peak["tensor_peak_bytes"])
            if peak.get("rss_hwm_bytes") is not None:
                metrics["rss_hwm_bytes"] = float(peak["rss_hwm_bytes"])
                metrics["rss_delta_bytes"] = float(peak["rss_hwm_bytes"] - peak["rss_before_bytes"])
    return samples


def run_case(case: Case, opts: RunOptions) -> CaseRecord:
    """Measure one case in this process and return its Record (never raises for a case's own failure)."""
    t0 = time.perf_counter()
    w = case.workload
    threads = resolved_threads(w)
    torch.set_num_threads(threads)
    metrics: dict[str, float] = {"threads": float(threads)}
    config: dict[str, Any] = {}

    def done(status: str, message: str = "", samples: list[float] | None = None) -> CaseRecord:
        return case.record(status, message, config=config, metrics=metrics, samples_s=samples or (),
                           duration_s=time.perf_counter() - t0)

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
        samples = measure_case(case, spec, opts, metrics)
        return done("ok", note, samples=samples)
    except BenchInputError as exc:
        return done("error", str(exc))
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        status = "oom" if is_oom(exc) else "error"
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if opts.debug:
            message += "\n" + traceback.format_exc()
        return done(status, message)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
