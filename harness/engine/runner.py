"""Run one Case: resolve → fake pass (params, MACs, memory estimate, guard) → build → time → memory.

Owns the mapping of failures to statuses: an out-of-memory is ``oom``, a case that cannot fit
the memory budget is ``skipped`` with its estimate, anything else is ``error``. Timeouts and
crashes are the executor's (a case cannot time itself out from inside).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from dataclasses import asdict, dataclass
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from harness.instruments import flops as flop_counter
from harness.instruments import energy
from harness.engine import generation
from harness.engine import ranks
from harness.instruments import kernels
from harness.instruments import memory
from harness.contract import registry
from harness.engine import training
from harness.engine.compiled import captured_graphs, compile_model, compiled_key, mark_batch_dynamic, warm_up_compiled
from harness.instruments.energy import EnergyConfig
from harness.engine.env import usable_cores
from harness.contract.replication import PRECISION
from harness.contract.errors import BenchInputError
from harness.instruments.load import Load, LoadMonitor
from harness.engine.models import MODELS, fake_case, model_key, release
from harness.engine.overhead import metric_name, warmup_shares
from harness.contract.plugins import load_files as load_plugin_files
from harness.contract.records import CaseRecord
from harness.contract.spec import ArchSpec, Case, Workload
from harness.analysis.stats import summarize_rounds
from harness.engine.steps import Step, cast_inputs, make_step
from harness.instruments.timing import TimingConfig, TimingResult, measure, measure_interleaved
from harness.instruments.torch_types import torch_dtype

MiB = 1024 * 1024


@dataclass(frozen=True)
class RunOptions:
    """How cases are measured; the same for every case of a run."""

    timing: TimingConfig = TimingConfig()
    timeout_s: float = 300.0
    memory_budget_bytes: int | None = None   # None: harness.instruments.memory.memory_budget(device)
    debug: bool = False
    plugins: tuple[str, ...] = ()   # plug-in files (``--plugin``), imported once per process before a case
    interleave: bool = False        # time the cases of a sweep point side by side (harness.engine.runner.run_group)
    energy: bool = False            # the energy pass (harness.instruments.energy) after timing, where a counter is readable
    energy_config: EnergyConfig = EnergyConfig()
    processes: int = 1              # fresh worker processes per case, records merged (harness.engine.replicate)
    max_processes: int = 0          # > processes: more for a group whose interval is wider than ×/÷ precision
    precision: float = PRECISION    # harness.engine.replicate.imprecise


def resolved_threads(w: Workload) -> int:
    return w.threads or usable_cores()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                             or "failed to allocate" in text)


def static_bytes(model: nn.Module, inputs: tuple) -> int:
    """Bytes alive before a step runs: parameters, buffers and inputs (a step adds its own: ``Step.state_bytes``)."""
    return memory.tensor_bytes(model) + memory.tensor_bytes(x for x in inputs if isinstance(x, torch.Tensor))


def workload_step(model: nn.Module, inputs: tuple, w: Workload, compile: str = "none",
                  eager: Step | None = None) -> Step:
    """The timed unit of ``w``: a whole greedy generation for mode "generate" (harness.engine.generation), a training
    step for "train_step" (:class:`harness.engine.training.TrainStep`; ``eager``: the eager train step of a compiled
    ``model``, whose parameters and optimizer the compiled step shares), else :func:`harness.engine.steps.make_step`'s
    forward or forward + backward."""
    if w.mode == "generate":
        return generation.make_generation(model, inputs, w)
    if w.mode == "train_step":
        if isinstance(eager, training.TrainStep):
            return training.make_train_step(eager.model, inputs, w, compiled=model, optimizer=eager.optimizer)
        return training.make_train_step(model, inputs, w)
    return make_step(model, inputs, w.mode, compile)


def fake_pass(spec: ArchSpec, w: Workload, device: torch.device, want_flops: bool,
              gaps: dict[str, str] | None = None) -> dict[str, float]:
    """Params, MACs/FLOPs, bytes moved and the estimated peak bytes, on fake tensors (no memory, no arithmetic).
    Work the counter cannot count leaves ``macs``/``flops`` out (never a partial count, never 0): the ops and
    why go into ``gaps`` when given, else :class:`harness.instruments.flops.UncountedFlopsError` is raised."""
    out: dict[str, float] = {}
    model, inputs, mode = fake_case(spec, generation.inputs_workload(w), device)
    with mode:
        out["params"] = float(flop_counter.count_params(model))
        step = workload_step(model, inputs, w)
        if want_flops and isinstance(step, generation.Generation):     # the prefill's own count (its % of peak)
            prefill = flop_counter.count_flops(generation.prefill_step(step), allow_gaps=gaps is not None)
            if prefill.complete:
                out["prefill_macs"] = float(prefill.macs)
        if w.mode == "train_step":
            out.update(training.analytic_memory(step.params, w.optimizer))
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
        out["est_peak_bytes"] = float(static_bytes(model, inputs) + step.state_bytes() + peak[0])
    if want_flops and w.mode == "train_step" and "flops" in out:
        out.update(train_flops(spec, w, device, out))
    if spec.cost is not None and w.mode != "generate":   # cost() is of one forward (of seq_len tokens)
        names = {"macs": "analytic_fwd_macs"}   # cost() gives forward MACs whatever the mode
        out.update({names.get(k, f"analytic_{k}"): float(v) for k, v in spec.cost(spec.config, w).items()})
    return out


def train_flops(spec: ArchSpec, w: Workload, device: torch.device, counted: dict[str, float]) -> dict[str, float]:
    """A training step's FLOPs beside the counted ``flops`` (the step as run: forward, loss, backward, optimizer;
    with checkpointing the recomputed forwards too): ``model_flops`` — the same step without checkpointing
    (counted again on fake tensors), what MFU divides — and the 6·N·D rule as ``est_6nd_flops`` (N: trainable
    parameters, D: tokens of the step), an estimate labelled so."""
    out: dict[str, float] = {"model_flops": counted["flops"]}
    if w.checkpointing != "none":
        plain = dataclasses.replace(w, checkpointing="none")
        model, inputs, mode = fake_case(spec, plain, device)
        with mode:
            out["model_flops"] = float(flop_counter.count_flops(workload_step(model, inputs, plain)).flops)
    if w.seq_len:
        out["est_6nd_flops"] = 6.0 * counted["params"] * w.batch_size * w.seq_len
    return out


@contextlib.contextmanager
def _timed(metrics: dict[str, float], part: str) -> Iterator[None]:
    """Add the block's wall seconds to ``metrics["time_<part>_s"]`` (harness.engine.overhead), also when it raises."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        name = metric_name(part)
        metrics[name] = metrics.get(name, 0.0) + time.perf_counter() - t0




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


def failed_record(case: Case, exc: BaseException, opts: RunOptions, **kw: Any) -> CaseRecord:
    """A case's failure as its record: ``oom`` for out-of-memory, ``error`` otherwise (one-line message)."""
    if isinstance(exc, BenchInputError):
        return case.record("error", str(exc), **kw)
    status = "oom" if is_oom(exc) else "error"
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if opts.debug:
        message += "\n" + "".join(traceback.format_exception(exc))
    return case.record(status, message, **kw)


def prepare(case: Case, opts: RunOptions, in_use: Sequence[tuple[nn.Module, str]] = ()) -> CaseRecord | Prepared:
    """Resolve, fake pass (params, MACs, memory estimate), budget guard, build (or reuse: :data:`MODELS`;
    ``in_use``: (model, mode) other prepared cases still step). A case that ends here (skipped, failed,
    or needing neither latency nor memory) comes back as its record. Parts' seconds go into ``metrics``
    (``time_count_s``, ``time_build_s``: harness.engine.overhead)."""
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
        MODELS.keep_only(model_key(case))    # another model next: free this process's kept one first
        gaps: dict[str, str] = {}
        with _timed(metrics, "count"):
            metrics.update(fake_pass(spec, w, device, "flops" in case.metrics, gaps))
        note = ("MACs not counted (no formula for: " + "; ".join(f"{op}: {why}" for op, why in gaps.items())
                + ")") if gaps else ""
        for q in (q for q in spec.quoted if q.applies(spec.config)):   # published figures (harness.contract.quoted)
            metrics[q.metric] = float(q.value)
            note = "; ".join(x for x in (note, q.note()) if x)
        # a kept model of this case is resident now, but a fresh build would not be yet: give its bytes back
        budget = (opts.memory_budget_bytes or memory.memory_budget(device)) + MODELS.held_bytes(case)
        if metrics["est_peak_bytes"] > budget:
            return done("skipped", f"estimated peak {metrics['est_peak_bytes'] / MiB:,.0f} MiB exceeds the "
                                   f"memory budget {budget / MiB:,.0f} MiB")
        if not {"latency", "memory"} & set(case.metrics):
            return done("ok", note)
        with _timed(metrics, "build"):
            model = MODELS.get(spec, case, in_use=in_use)
            inputs = cast_inputs(spec.make_inputs(spec.config, generation.inputs_workload(w), device),
                                 torch_dtype(w))
            step = workload_step(model, inputs, w)
        eager_step = None
        if w.compile != "none":     # compiled apart from the steady state, before the memory pass and timing
            with _timed(metrics, "compile"):
                eager_step = step
                if isinstance(step, generation.Generation):     # the decode step compiled; the prefill eager
                    step = step.with_decode(compile_model(step.decoding, w.compile, "fwd"), compiled=True)
                else:       # one compile per model for all its batches (harness.engine.compiled: mark_batch_dynamic)
                    mark_batch_dynamic(inputs, w.batch_size)
                    fast = MODELS.compiled(model, compiled_key(w), lambda: compile_model(model, w.compile, w.mode))
                    step = workload_step(fast, inputs, w, w.compile, eager_step)
                events = captured_graphs()
                metrics["compile_s"] = warm_up_compiled(step, device, w.compile)
                metrics["compile_graphs"] = float(captured_graphs() - events)    # 0: an earlier batch's graph served
        return Prepared(case, spec, metrics, config, note, t0, model, inputs, step, eager_step)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        return failed_record(case, exc, opts, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)


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


def memory_and_kernels(p: Prepared) -> None:
    """The memory pass (when the case measures memory) and :func:`harness.instruments.kernels.probe` in one real step: the
    SDPA kernel(s) that ran, and ``executed_macs`` = the counted (dense) ``macs`` minus what fused causal
    attention skipped (forward and backward). The probe watches the memory pass's call; a case without one, or
    a compiled case (the probe's function swap would make dynamo recompile), is probed on its eager step."""
    if "memory" in p.case.metrics and p.eager_step is None:
        with _timed(p.metrics, "memory"):
            report = kernels.probe(lambda: measure_memory(p))
    else:
        if "memory" in p.case.metrics:
            with _timed(p.metrics, "memory"):
                measure_memory(p)
        with _timed(p.metrics, "count"):
            report = kernels.probe(p.eager_step or p.step)
    p.sdpa_backend = report.sdpa_backend
    if "macs" in p.metrics:
        p.metrics["executed_macs"] = float(report.executed_macs(p.metrics["macs"]))


def measure_memory(p: Prepared) -> None:
    """The memory pass (separate from timing), as the step takes it (:meth:`harness.engine.steps.Step.memory`)."""
    p.metrics.update(p.step.memory(static_bytes(p.model, p.inputs), torch.device(p.case.workload.device)))


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
    with _timed(p.metrics, "energy"):
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


def add_time_parts(p: Prepared, timed: TimingResult, warmup_s: float | None = None) -> None:
    """The timing's parts (harness.engine.overhead): the timed samples (Σ per-call sample × block size) and the rest of
    ``measure`` — cold call, warm-up, block-size calibration (``warmup_s`` when the caller split it)."""
    timed_s = sum(timed.samples_s) * timed.block_size
    p.metrics[metric_name("timed")] = timed_s
    p.metrics[metric_name("warmup")] = max(0.0, timed.total_s - timed_s) if warmup_s is None else warmup_s


def run_case(case: Case, opts: RunOptions) -> CaseRecord:
    """Measure one case in this process and return its Record (never raises for a case's own failure); a case
    across ranks in its own rank processes (:func:`harness.engine.ranks.run_ranked`)."""
    if ranks.spans_ranks(case.workload):
        return ranks.run_ranked(case, opts, fake_pass)
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
            add_time_parts(p, timed)
        memory_and_kernels(p)
        energy_pass(p, opts)
        return ok_record(p, timed.samples_s if timed else (), timed.rounds if timed else ())
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        MODELS.clear()            # a failed step may leave its model half-way (and an OOM wants the memory)
        return failed_record(case, exc, opts, config=p.config, metrics=p.metrics, duration_s=time.perf_counter() - p.t0)
    finally:
        del p


def run_group(cases: Sequence[Case], opts: RunOptions) -> list[CaseRecord]:
    """Measure ``cases`` side by side in this process: each is prepared (and its memory measured) in turn and
    kept built; their timings then alternate in rounds (:func:`harness.instruments.timing.measure_interleaved`), so a
    ratio of two of them (:func:`harness.analysis.stats.paired_ratio`) cancels the machine's drift. Cases whose models
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
        t_measure = time.perf_counter()
        results = measure_interleaved([p.step for p in timed_cases], opts.timing,
                                      timed_cases[0].case.workload.device, seed=len(out),
                                      before=[lambda t=t: torch.set_num_threads(t) for t in threads]
                                      ) if timed_cases else []
        measure_s = time.perf_counter() - t_measure
        load = monitor.stop()
        ok = [(p, r) for p, r in zip(timed_cases, results) if not isinstance(r, BaseException)]
        # the group's time outside every side's samples (cold calls, warm-ups, a failed side's calls), split
        # among the sides by their cold call + warm-up calls × median call
        warm = warmup_shares(measure_s, [sum(r.samples_s) * r.block_size for _, r in ok],
                             [r.cold_s + r.warmup_calls * sorted(r.samples_s)[len(r.samples_s) // 2] for _, r in ok])
        for (p, res), w in zip(ok, warm):
            add_time_parts(p, res, w)
        if len(ok) < len(timed_cases) and not ok:   # every side failed: the time went to the failures
            for p in timed_cases:
                p.metrics[metric_name("warmup")] = measure_s / len(timed_cases)
        for p, res in zip(timed_cases, results):
            if isinstance(res, BaseException):
                out[p.case.key] = failed_record(p.case, res, opts, config=p.config, metrics=p.metrics,
                                                duration_s=time.perf_counter() - p.t0)
            else:
                add_timing(p, res, load)
                try:
                    energy_pass(p, opts)     # after the group's timing: its samples stay undisturbed
                except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the group goes on
                    out[p.case.key] = failed_record(p.case, exc, opts, config=p.config, metrics=p.metrics,
                                                    duration_s=time.perf_counter() - p.t0)
                    continue
                out[p.case.key] = ok_record(p, res.samples_s, res.rounds, group)
        for p in built:
            out.setdefault(p.case.key, ok_record(p))
        built.clear()
        release()

    for case in cases:
        if ranks.spans_ranks(case.workload):      # its own rank processes: never side by side with another
            out[case.key] = ranks.run_ranked(case, opts, fake_pass)
            continue
        p = prepare(case, opts, in_use=[(b.model, b.case.workload.mode) for b in built])
        if isinstance(p, CaseRecord):
            out[case.key] = p
            continue
        if budget is None:
            budget = opts.memory_budget_bytes or memory.memory_budget(torch.device(case.workload.device))
        # the models kept built (one storage once: cases of one model share it), with their inputs
        held = memory.tensor_bytes([t for b in built for t in (*b.model.parameters(), *b.model.buffers(),
                                                                *(x for x in b.inputs if isinstance(x, torch.Tensor)))])
        if built and any(b.model is p.model for b in built):
            held -= memory.tensor_bytes(p.model)          # already in this case's estimate
        if built and held + p.metrics["est_peak_bytes"] > budget:
            flush()                       # measure those already built, then start a new sub-group with this one
        try:
            memory_and_kernels(p)
        except Exception as exc:  # noqa: BLE001
            MODELS.clear()
            out[case.key] = failed_record(case, exc, opts, config=p.config, metrics=p.metrics,
                                          duration_s=time.perf_counter() - p.t0)
            continue
        built.append(p)
    if built:
        flush()
    return [out[c.key] for c in cases]
