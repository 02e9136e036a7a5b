"""Run one Case: resolve → fake pass (params, MACs, memory estimate, guard) → build → time → memory.

Owns the mapping of failures to statuses: an out-of-memory is ``oom``, a case that cannot fit
the memory budget is ``skipped`` with its estimate, anything else is ``error``. Timeouts and
crashes are the executor's (a case cannot time itself out from inside).
"""
from __future__ import annotations

import contextlib
import gc
import time
import traceback
from dataclasses import asdict, dataclass
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from harness import flops as flop_counter
from harness import kernels, memory, registry
from harness.compiled import compile_model, warm_up_compiled
from harness.env import usable_cores
from harness.errors import BenchInputError
from harness.fake import fake_case
from harness.load import Load, LoadMonitor
from harness.overhead import metric_name, warmup_shares
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


@contextlib.contextmanager
def _timed(metrics: dict[str, float], part: str) -> Iterator[None]:
    """Add the block's wall seconds to ``metrics["time_<part>_s"]`` (harness.overhead), also when it raises."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        name = metric_name(part)
        metrics[name] = metrics.get(name, 0.0) + time.perf_counter() - t0


# -- cheap weight initialisation -----------------------------------------------------------------------------
_POOL_N = 1_048_573      # a prime: a tensor filled from the pool at a rotating offset repeats no row or column
_pools: dict[str, torch.Tensor] = {}


def _pool(kind: str) -> torch.Tensor:
    """``_POOL_N`` standard normal (``"normal"``) or uniform [0, 1) (``"uniform"``) fp32 values, seeded: the same
    in every process."""
    if kind not in _pools:
        g = torch.Generator().manual_seed(0 if kind == "normal" else 1)
        _pools[kind] = (torch.randn if kind == "normal" else torch.rand)(_POOL_N, generator=g)
    return _pools[kind]


def _scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


class _PoolFill:
    """Fills a tensor from a pool, continuing where the previous fill stopped (deterministic per build)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, t: torch.Tensor, kind: str, scale: float, shift: float) -> torch.Tensor:
        pool, flat, n = _pool(kind), t.view(-1), t.numel()
        done = 0
        with torch.no_grad():
            while done < n:
                start = self.offset % _POOL_N
                m = min(n - done, _POOL_N - start)
                chunk, src = flat[done:done + m], pool[start:start + m]
                if chunk.dtype == src.dtype and chunk.device == src.device:
                    torch.add(_scalar(shift), src, alpha=scale, out=chunk)     # one pass: shift + scale·pool
                else:
                    chunk.copy_(src).mul_(scale).add_(shift)
                done += m
                self.offset += m + 7       # a new phase for the next chunk and the next tensor
        return t


@contextlib.contextmanager
def cheap_init() -> Iterator[None]:
    """While a model is built, ``Tensor.uniform_``/``normal_`` and ``nn.init.trunc_normal_`` draw from a seeded
    pool of random values instead of the (single-threaded, ~30 ns per value) CPU generator: every weight keeps
    the distribution its module's own init asks for (bounds, mean, std), finite and never uninitialised, at
    the cost of a copy. Other tensors (made outside the build, e.g. inputs) are untouched."""
    fill = _PoolFill()
    orig_uniform, orig_normal, orig_trunc = torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_

    def usable(t: torch.Tensor) -> bool:
        return (type(t) in (torch.Tensor, nn.Parameter) and t.is_floating_point() and t.is_contiguous()
                and t.device.type in ("cpu", "cuda"))

    def uniform_(self: torch.Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if not usable(self):
            return orig_uniform(self, a, b, generator=generator)
        return fill(self, "uniform", float(b) - float(a), float(a))

    def normal_(self: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if not usable(self):
            return orig_normal(self, mean, std, generator=generator)
        return fill(self, "normal", float(std), float(mean))

    def trunc_normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                      generator: Any = None) -> torch.Tensor:
        if not usable(tensor):
            return orig_trunc(tensor, mean, std, a, b, generator=generator)
        with torch.no_grad():         # normal values past the bounds (|z| > 2 at the defaults) move to the bounds
            return fill(tensor, "normal", float(std), float(mean)).clamp_(a, b)

    own = {name: name in torch.Tensor.__dict__ for name in ("uniform_", "normal_")}   # else TensorBase's
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # memory-bound copies: one thread is as fast, and immune to a busy machine
    torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_ = uniform_, normal_, trunc_normal_
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        nn.init.trunc_normal_ = orig_trunc
        for name, orig in (("uniform_", orig_uniform), ("normal_", orig_normal)):
            if own[name]:
                setattr(torch.Tensor, name, orig)
            else:
                delattr(torch.Tensor, name)


def build_model(spec: ArchSpec, w: Workload, device: torch.device) -> nn.Module:
    """``spec``'s model on ``device`` in ``w``'s dtype, its weights initialised cheaply (:func:`cheap_init`)."""
    torch.manual_seed(0)
    with cheap_init():
        model = spec.build(spec.config)
    return model.to(device=device, dtype=w.torch_dtype)


# -- model reuse ------------------------------------------------------------------------------------------
def model_key(case: Case) -> tuple:
    """Cases with the same key can share one built model: same architecture, overrides and device."""
    return (case.arch, case.overrides, case.workload.device)


def _layout(model: nn.Module) -> tuple:
    """The names and shapes of a model's parameters and buffers (not their dtype): a model that grew state
    (e.g. a cached mask registered as a buffer) is not reused."""
    return tuple((n, tuple(t.shape)) for n, t in (*model.named_parameters(), *model.named_buffers()))


class ModelCache:
    """The model built for the last case, kept in this process for the next cases that differ only in the
    workload: a batch or length change reuses it as is, a dtype change casts it (unless another prepared
    case still steps it). At most one is kept; it is dropped as soon as a case needs another model, before
    that case's fake pass, so memory never holds two. Gradients are dropped on reuse (``fwd_bwd`` leaves them)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.model: nn.Module | None = None
        self.layout: tuple = ()
        self.hits = 0

    def keep_only(self, key: tuple) -> None:
        if self.key is not None and self.key != key:
            self.clear()

    def clear(self) -> None:
        had = self.model is not None
        self.key = self.model = None
        self.layout = ()
        if had:
            _release()

    def held_bytes(self, case: Case) -> int:
        """Bytes of the kept model that ``case`` would reuse (0 when it would build its own)."""
        return memory.tensor_bytes(self.model) if self.model is not None and self.key == model_key(case) else 0

    def get(self, spec: ArchSpec, case: Case, in_use: Sequence[tuple[nn.Module, str]] = ()) -> nn.Module:
        """The model for ``case``: the kept one when it fits, else a fresh build (which is then kept).
        ``in_use``: (model, mode) of prepared cases that still step their model (interleaved groups): a model in
        use is shared only as it is (same dtype and mode: the mode sets train/eval), never cast."""
        w, key = case.workload, model_key(case)
        kept = self.model if self.key == key and self.model is not None and _layout(self.model) == self.layout \
            else None
        users = [mode for m, mode in in_use if m is self.model]
        if kept is not None:
            dtype = next((t.dtype for t in kept.parameters() if t.is_floating_point()), w.torch_dtype)
            if not users or (dtype == w.torch_dtype and all(mode == w.mode for mode in users)):
                self.hits += 1
                kept.zero_grad(set_to_none=True)
                return kept if dtype == w.torch_dtype else kept.to(dtype=w.torch_dtype)
        if not users:
            self.clear()                 # free it before the new build (a prepared case may still hold it)
        model = build_model(spec, w, torch.device(w.device))
        self.key, self.model, self.layout = key, model, _layout(model)
        return model


MODELS = ModelCache()
"""This process's kept model (a worker runs many cases; :class:`ModelCache`)."""


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
    step: Callable[[], object]
    eager_step: Callable[[], object] | None = None   # the uncompiled step of a compiled case (the kernel probe)
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
    (``time_count_s``, ``time_build_s``: harness.overhead)."""
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
        # a kept model of this case is resident now, but a fresh build would not be yet: give its bytes back
        budget = (opts.memory_budget_bytes or memory.memory_budget(device)) + MODELS.held_bytes(case)
        if metrics["est_peak_bytes"] > budget:
            return done("skipped", f"estimated peak {metrics['est_peak_bytes'] / MiB:,.0f} MiB exceeds the "
                                   f"memory budget {budget / MiB:,.0f} MiB")
        if not {"latency", "memory"} & set(case.metrics):
            return done("ok", note)
        with _timed(metrics, "build"):
            model = MODELS.get(spec, case, in_use=in_use)
            inputs = cast_inputs(spec.make_inputs(spec.config, w, device), w.torch_dtype)
            step = make_step(model, inputs, w.mode)
        eager_step = None
        if w.compile != "none":     # compiled apart from the steady state, before the memory pass and timing
            with _timed(metrics, "compile"):
                eager_step = step
                step = make_step(compile_model(model, w.compile, w.mode), inputs, w.mode, w.compile)
                metrics["compile_s"] = warm_up_compiled(step, device, w.compile)
        return Prepared(case, spec, metrics, config, note, t0, model, inputs, step, eager_step)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        return failed_record(case, exc, opts, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)


def add_timing(p: Prepared, timed: TimingResult, load: Load | None) -> None:
    """The timing's summary (its interval covers the spread between rounds) and the machine's load."""
    w = p.case.workload
    p.metrics.update(summarize_rounds(timed.samples_s, timed.rounds))
    p.metrics.update(cold_ms=timed.cold_s * 1e3, block_size=float(timed.block_size),
                     throughput_per_s=w.batch_size / (p.metrics["median_ms"] / 1e3))
    if timed.l2_flush_bytes:
        p.metrics["l2_flush_bytes"] = float(timed.l2_flush_bytes)
    if load is not None:
        p.metrics.update(load.metrics())


def probe_kernels(p: Prepared) -> None:
    """One real step under :func:`harness.kernels.probe`: the SDPA kernel(s) that ran, and ``executed_macs`` =
    the counted (dense) ``macs`` minus what fused causal attention skipped (forward and backward). A compiled
    case probes its eager step (the probe's function swap would make dynamo recompile the compiled one)."""
    with _timed(p.metrics, "count"):
        report = kernels.probe(p.eager_step or p.step)
    p.sdpa_backend = report.sdpa_backend
    if "macs" in p.metrics:
        p.metrics["executed_macs"] = float(report.executed_macs(p.metrics["macs"]))


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
                         group=group, sdpa_backend=p.sdpa_backend, duration_s=time.perf_counter() - p.t0)


def add_time_parts(p: Prepared, timed: TimingResult, warmup_s: float | None = None) -> None:
    """The timing's parts (harness.overhead): the timed samples (Σ per-call sample × block size) and the rest of
    ``measure`` — cold call, warm-up, block-size calibration (``warmup_s`` when the caller split it)."""
    timed_s = sum(timed.samples_s) * timed.block_size
    p.metrics[metric_name("timed")] = timed_s
    p.metrics[metric_name("warmup")] = max(0.0, timed.total_s - timed_s) if warmup_s is None else warmup_s


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
            add_time_parts(p, timed)
        if "memory" in case.metrics:
            with _timed(p.metrics, "memory"):
                measure_memory(p)
        probe_kernels(p)
        return ok_record(p, timed.samples_s if timed else (), timed.rounds if timed else ())
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        MODELS.clear()            # a failed step may leave its model half-way (and an OOM wants the memory)
        return failed_record(case, exc, opts, config=p.config, metrics=p.metrics, duration_s=time.perf_counter() - p.t0)
    finally:
        del p


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
                out[p.case.key] = ok_record(p, res.samples_s, res.rounds, group)
        for p in built:
            out.setdefault(p.case.key, ok_record(p))
        built.clear()
        _release()

    for case in cases:
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
            if "memory" in case.metrics:
                with _timed(p.metrics, "memory"):
                    measure_memory(p)
            probe_kernels(p)
        except Exception as exc:  # noqa: BLE001
            MODELS.clear()
            out[case.key] = failed_record(case, exc, opts, config=p.config, metrics=p.metrics,
                                          duration_s=time.perf_counter() - p.t0)
            continue
        built.append(p)
    if built:
        flush()
    return [out[c.key] for c in cases]
