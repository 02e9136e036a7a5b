"""Run one Case: resolve → fake pass (params, MACs, memory estimate, guard) → build → compile → measure
(:func:`harness.engine.measure.measure_prepared`); or a group of cases built side by side and timed in rounds.

What differs between a forward, a training step and a generation is the step's (:class:`harness.engine.steps.Step`,
its class from :data:`harness.engine.modes.STEPS`): this module never asks which mode it holds.

Owns the mapping of failures to statuses: an out-of-memory is ``oom``, a case that cannot fit
the memory budget is ``skipped`` with its estimate, anything else is ``error``. Timeouts and
crashes are the executor's (a case cannot time itself out from inside).
"""
from __future__ import annotations

import time
from dataclasses import asdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from harness.instruments import flops as flop_counter
from harness.instruments import memory
from harness.contract import registry
from harness.engine import ranks
from harness.engine.compiled import captured_graphs, compile_model, compiled_key, warm_up_compiled
from harness.engine.env import usable_cores
from harness.instruments.load import LoadMonitor
from harness.engine.measure import (Prepared, Timed, failed_record, is_oom, measure_prepared, static_bytes,
                                    timed_part)
from harness.engine.models import MODELS, fake_case, model_key, release
from harness.engine.modes import step_class
from harness.engine.options import RunOptions
from harness.engine.overhead import metric_name, warmup_shares
from harness.contract.plugins import load_files as load_plugin_files
from harness.contract.records import CaseRecord
from harness.contract.spec import ArchSpec, Case, Workload
from harness.engine.steps import cast_inputs
from harness.instruments.timing import measure_interleaved
from harness.instruments.torch_types import torch_dtype

__all__ = ["Prepared", "RunOptions", "fake_pass", "is_oom", "measure_prepared", "prepare", "resolved_threads",
           "run_case", "run_group"]

MiB = 1024 * 1024


def resolved_threads(w: Workload) -> int:
    return w.threads or usable_cores()


def fake_pass(spec: ArchSpec, w: Workload, device: torch.device, want_flops: bool,
              gaps: dict[str, str] | None = None) -> dict[str, float]:
    """Params, MACs/FLOPs, bytes moved and the estimated peak bytes, on fake tensors (no memory, no arithmetic),
    with what the step counts beside them (``Step.counts``, ``Step.flop_figures``). Work the counter cannot
    count leaves ``macs``/``flops`` out (never a partial count, never 0): the ops and why go into ``gaps`` when
    given, else :class:`harness.instruments.flops.UncountedFlopsError` is raised."""
    kind = step_class(w.mode)
    out: dict[str, float] = {}
    model, inputs, mode = fake_case(spec, kind.inputs_workload(w), device)

    def count(fn: Any) -> flop_counter.FlopCount:
        return flop_counter.count_flops(fn, allow_gaps=gaps is not None)

    with mode:
        out["params"] = float(flop_counter.count_params(model))
        step = kind.for_workload(model, inputs, w)
        out.update(step.counts(w, count if want_flops else None))    # a prefill's MACs, training memory, ...
        peak: list[int] = []
        if want_flops:   # one fake step both counted and tracked: fake dispatch is the cost here
            counted = count(lambda: peak.append(memory.estimate_peak(step)))
            if counted.complete:
                out["macs"], out["flops"] = float(counted.macs), float(counted.flops)
                out["bytes_moved"] = float(counted.bytes_moved)   # op-level traffic, no cross-op reuse (flops.py)
            else:
                gaps.update(counted.gaps)                         # type: ignore[union-attr]
        else:
            peak.append(memory.estimate_peak(step))
        out["est_peak_bytes"] = float(static_bytes(model, inputs) + step.state_bytes() + peak[0])
    if want_flops and "flops" in out:
        out.update(kind.flop_figures(w, out, lambda other: counted_flops(spec, other, device)))
    if spec.cost is not None and kind.forward_cost:   # cost() is of one forward (of seq_len tokens)
        names = {"macs": "analytic_fwd_macs"}   # cost() gives forward MACs whatever the mode
        out.update({names.get(k, f"analytic_{k}"): float(v) for k, v in spec.cost(spec.config, w).items()})
    return out


def counted_flops(spec: ArchSpec, w: Workload, device: torch.device) -> float:
    """The counted FLOPs of one step of workload ``w`` on fake tensors (every op countable, else it raises)."""
    kind = step_class(w.mode)
    model, inputs, mode = fake_case(spec, kind.inputs_workload(w), device)
    with mode:
        return float(flop_counter.count_flops(kind.for_workload(model, inputs, w)).flops)


def prepare(case: Case, opts: RunOptions, in_use: Sequence[tuple[nn.Module, str]] = ()) -> CaseRecord | Prepared:
    """Resolve, fake pass (params, MACs, memory estimate), budget guard, build (or reuse: :data:`MODELS`;
    ``in_use``: (model, mode) other prepared cases still step), the step (its compiled form for a compiled
    case, warmed up until steady). A case that ends here (skipped, failed, or needing neither latency nor
    memory) comes back as its record. Parts' seconds go into ``metrics`` (``time_count_s``, ``time_build_s``,
    ``time_compile_s``: harness.engine.overhead)."""
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
        with timed_part(metrics, "count"):
            metrics.update(fake_pass(spec, w, device, "flops" in case.metrics and not opts.replica, gaps))
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
        kind = step_class(w.mode)
        with timed_part(metrics, "build"):
            model = MODELS.get(spec, case, in_use=in_use)
            inputs = cast_inputs(spec.make_inputs(spec.config, kind.inputs_workload(w), device), torch_dtype(w))
            step = kind.for_workload(model, inputs, w)
        eager_step = None
        if w.compile != "none":     # compiled apart from the steady state, before the memory pass and timing
            with timed_part(metrics, "compile"):
                eager_step = step
                # one compile per model for all its batches (harness.engine.compiled: mark_batch_dynamic)
                step = step.compile(w, lambda m: MODELS.compiled(m, compiled_key(w),
                                                                 lambda: compile_model(m, w.compile, w.mode)))
                events = captured_graphs()
                metrics["compile_s"] = warm_up_compiled(step, device, w.compile)
                metrics["compile_graphs"] = float(captured_graphs() - events)    # 0: an earlier batch's graph served
        return Prepared(case, spec, metrics, config, note, t0, model, inputs, step, eager_step)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        return failed_record(case, exc, opts, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)


def run_case(case: Case, opts: RunOptions) -> CaseRecord:
    """Measure one case in this process and return its Record (never raises for a case's own failure); a case
    across ranks in its own rank processes (:func:`harness.engine.ranks.run_ranked`)."""
    if ranks.spans_ranks(case.workload):
        return ranks.run_ranked(case, opts, fake_pass)
    p = prepare(case, opts)
    try:
        return p if isinstance(p, CaseRecord) else measure_prepared(p, opts)
    finally:
        del p


def run_group(cases: Sequence[Case], opts: RunOptions) -> list[CaseRecord]:
    """Measure ``cases`` side by side in this process: each is prepared in turn and kept built; their timings
    then alternate in rounds (:func:`harness.instruments.timing.measure_interleaved`), so a ratio of two of them
    (:func:`harness.analysis.ratios.paired_ratio`) cancels the machine's drift; then each is measured on
    (:func:`harness.engine.measure.measure_prepared` with its timing: memory, counting and energy passes). Cases
    whose models would not fit beside those already built are measured in a next sub-group. Records come back
    in order."""
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
        ok = [r for r in results if not isinstance(r, BaseException)]
        # the group's time outside every side's samples (cold calls, warm-ups, a failed side's calls), split
        # among the sides by their cold call + warm-up calls × median call
        warm = iter(warmup_shares(measure_s, [sum(r.samples_s) * r.block_size for r in ok],
                                  [r.cold_s + r.warmup_calls * sorted(r.samples_s)[len(r.samples_s) // 2]
                                   for r in ok]))
        timing = dict(zip((p.case.key for p in timed_cases), results))
        for p in built:
            res = timing.get(p.case.key)
            if isinstance(res, BaseException):
                if not ok:                    # every side failed: the time went to the failures
                    p.metrics[metric_name("warmup")] = measure_s / len(timed_cases)
                out[p.case.key] = failed_record(p.case, res, opts, config=p.config, metrics=p.metrics,
                                                duration_s=time.perf_counter() - p.t0)
            else:
                out[p.case.key] = measure_prepared(p, opts, Timed(res, load, next(warm), group) if res else None)
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
        built.append(p)
    if built:
        flush()
    return [out[c.key] for c in cases]
