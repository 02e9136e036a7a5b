"""The metric catalog: every metric a case may record, as plain data (torch-free).

One :class:`Metric` per name — its unit, its kind, whether it is exact (the same on every run of the same code and
torch: a count, or the CPU's tensor peak) or measured (with noise), which direction is better, and one line on what
it means. The lists other modules test metrics against (the gate's equal metrics, the exact counts an affine fit
reads within rounding, the timing metrics a busy machine spoils) are derived here, and the docs' metrics reference
is generated from :data:`METRICS`, so a metric is described in one place.

Three families are named by a pattern: ``time_<part>_s`` (the seconds a case spent in each part of its measurement),
``process_median_ms_<i>`` (the median of worker process ``i``) and ``analytic_<figure>`` (a figure of an architecture's
cost formula); :func:`lookup` resolves a concrete name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["time", "rate", "memory", "count", "energy", "accuracy", "share", "spread", "load", "tally"]
Better = Literal["lower", "higher", "none"]


@dataclass(frozen=True)
class Metric:
    """One metric: ``name`` (units in the name, as stored), ``unit``, ``kind``, ``exact`` (no noise: the same on every
    run of the same code and torch) or measured, the ``better`` direction, and a one-line ``meaning``.

    ``fake_pass``: computed by the counting pass on fake tensors (no arithmetic), so equal on every executor and
    device model. ``gate``: ``bench check`` requires it equal to the baseline (CUDA allocator peaks within 10 %)."""

    name: str
    unit: str
    kind: Kind
    exact: bool
    better: Better
    meaning: str
    fake_pass: bool = False
    gate: bool = False


def _m(name: str, unit: str, kind: Kind, exact: bool, better: Better, meaning: str, *, fake_pass: bool = False,
       gate: bool = False) -> Metric:
    return Metric(name, unit, kind, exact, better, meaning, fake_pass, gate)


_LOW, _HIGH, _NONE = "lower", "higher", "none"

METRICS: tuple[Metric, ...] = (
    # -- counted on fake tensors (the fake pass): exact -------------------------------------------------------
    _m("macs", "MAC", "count", True, _LOW, "multiply-accumulates of one call (dense: attention over all n² scores)",
       fake_pass=True, gate=True),
    _m("flops", "FLOP", "count", True, _LOW, "2 × macs, as torch.utils.flop_counter counts", fake_pass=True, gate=True),
    _m("params", "count", "count", True, _LOW, "parameters of the built model", fake_pass=True, gate=True),
    _m("bytes_moved", "B", "count", True, _LOW,
       "memory traffic if every aten op reads its inputs and writes its outputs once (no cache reuse)", fake_pass=True),
    _m("est_peak_bytes", "B", "memory", True, _LOW, "peak memory estimated by the fake pass, before anything runs",
       fake_pass=True, gate=True),
    _m("executed_macs", "MAC", "count", True, _LOW,
       "MACs the kernels ran: macs less the scores a fused causal kernel skips (one real call sees the kernel)"),
    _m("analytic_params", "count", "count", True, _LOW, "parameters from the architecture's own cost formula"),
    _m("analytic_fwd_macs", "MAC", "count", True, _LOW, "forward MACs from the architecture's own cost formula"),
    _m("analytic_<figure>", "as named", "count", True, _LOW,
       "any other figure of the architecture's cost formula, e.g. analytic_kv_cache_bytes"),
    # -- timing: the summary of the timed samples (harness.analysis.stats) ------------------------------------
    _m("median_ms", "ms", "time", False, _LOW, "median time of one call over the timed samples"),
    _m("mean_ms", "ms", "time", False, _LOW, "mean time of one call"),
    _m("min_ms", "ms", "time", False, _LOW, "fastest sample"),
    _m("max_ms", "ms", "time", False, _LOW, "slowest sample"),
    _m("stdev_ms", "ms", "spread", False, _LOW, "standard deviation of the samples"),
    _m("q1_ms", "ms", "time", False, _LOW, "first quartile of the samples"),
    _m("q3_ms", "ms", "time", False, _LOW, "third quartile of the samples"),
    _m("iqr_ms", "ms", "spread", False, _LOW, "interquartile range of the samples"),
    _m("p90_ms", "ms", "time", False, _LOW, "90th percentile of the samples"),
    _m("p99_ms", "ms", "time", False, _LOW, "99th percentile of the samples"),
    _m("ci_low_ms", "ms", "time", False, _NONE,
       "95 % interval of the median, low end (over processes where there are several, else the wider of the "
       "samples' and the rounds' interval)"),
    _m("ci_high_ms", "ms", "time", False, _NONE, "95 % interval of the median, high end"),
    _m("rel_iqr", "ratio", "spread", False, _LOW, "IQR / median"),
    _m("noisy", "flag", "spread", False, _LOW, "1 when IQR / median ≥ 10 %"),
    _m("cold_ms", "ms", "time", False, _LOW, "the first call, timed alone before the warm-up"),
    _m("throughput_per_s", "1/s", "rate", False, _HIGH, "samples (batch items) per second at the median time"),
    _m("round_cv", "ratio", "spread", False, _LOW, "coefficient of variation of the rounds' medians (drift)"),
    _m("round_ci_low_ms", "ms", "time", False, _NONE, "Student-t interval over the rounds' log medians, low end"),
    _m("round_ci_high_ms", "ms", "time", False, _NONE, "Student-t interval over the rounds' log medians, high end"),
    _m("pooled_ci_low_ms", "ms", "time", False, _NONE, "with several processes: the pooled samples' interval, low end"),
    _m("pooled_ci_high_ms", "ms", "time", False, _NONE, "with several processes: the pooled samples' interval, high end"),
    _m("n_samples", "count", "tally", True, _NONE, "timed samples"),
    _m("n_rounds", "count", "tally", True, _NONE, "timing rounds"),
    _m("block_size", "count", "tally", True, _NONE, "calls per timed sample (fast calls are timed in blocks)"),
    # -- processes (bench run --processes N, baseline, check) -------------------------------------------------
    _m("n_processes", "count", "tally", True, _NONE, "fresh worker processes the case was measured in"),
    _m("process_rounds", "count", "tally", True, _NONE, "rounds per process"),
    _m("process_median_ms_<i>", "ms", "time", False, _LOW, "the median of worker process i"),
    _m("process_gmean_ms", "ms", "time", False, _LOW, "geometric mean of the process medians"),
    _m("process_cv", "ratio", "spread", False, _LOW, "coefficient of variation between the process medians"),
    _m("process_ci_low_ms", "ms", "time", False, _NONE, "two-level bootstrap interval over processes, low end"),
    _m("process_ci_high_ms", "ms", "time", False, _NONE, "two-level bootstrap interval over processes, high end"),
    # -- memory -----------------------------------------------------------------------------------------------
    _m("activation_peak_bytes", "B", "memory", True, _LOW,
       "the step's peak less what was allocated before it (activations)", gate=True),
    _m("peak_bytes", "B", "memory", True, _LOW,
       "peak of the step: on CPU parameters + inputs + the live-tensor peak (exact); on CUDA the allocator's",
       gate=True),
    _m("rss_hwm_bytes", "B", "memory", False, _LOW, "the worker's resident-set high-water mark during the step"),
    _m("rss_delta_bytes", "B", "memory", False, _LOW, "resident-set growth during the step"),
    _m("cuda_max_allocated_bytes", "B", "memory", False, _LOW, "CUDA allocator: torch.cuda.max_memory_allocated"),
    _m("cuda_max_reserved_bytes", "B", "memory", False, _LOW, "CUDA allocator: torch.cuda.max_memory_reserved"),
    # -- the machine while a case was timed (harness.instruments.load) ----------------------------------------
    _m("load_others_cores", "cores", "load", False, _LOW, "CPU used by processes outside bench's own tree"),
    _m("load_yielding_cores", "cores", "load", False, _LOW,
       "CPU used by niced processes, which yield to a nice-0 case (not counted as others)"),
    _m("load_steal_cores", "cores", "load", False, _LOW, "hypervisor steal, where the OS reports it"),
    _m("load_busy", "flag", "load", False, _LOW, "1 when others used more than half a core: its timings decide nothing"),
    _m("threads", "count", "tally", True, _NONE, "torch threads the case ran with"),
    # -- where a case's time went (harness.engine.overhead) -----------------------------------------------------
    _m("time_<part>_s", "s", "time", False, _LOW,
       "seconds the case spent in each part: count, build, compile, warmup, timed, memory, energy"),
    _m("compile_s", "s", "time", False, _LOW, "torch.compile time, measured apart from the steady state"),
    _m("compile_graphs", "count", "tally", False, _NONE, "graphs dynamo captured for the case"),
    # -- generation (mode = "generate") ---------------------------------------------------------------------
    _m("ttft_ms", "ms", "time", False, _LOW, "time to first token: prefill and its argmax"),
    _m("tpot_ms", "ms", "time", False, _LOW, "time per output token after the first (vLLM's (e2e − TTFT)/(N − 1))"),
    _m("itl_p50_ms", "ms", "time", False, _LOW, "inter-token latency, median over every decode step"),
    _m("itl_p90_ms", "ms", "time", False, _LOW, "inter-token latency, 90th percentile"),
    _m("itl_p99_ms", "ms", "time", False, _LOW, "inter-token latency, 99th percentile"),
    _m("e2e_ms", "ms", "time", False, _LOW, "one whole generation"),
    _m("output_tokens_per_s", "tokens/s", "rate", False, _HIGH, "B·N / e2e"),
    _m("total_tokens_per_s", "tokens/s", "rate", False, _HIGH, "B·(P + N) / e2e"),
    _m("decode_tokens_per_s", "tokens/s", "rate", False, _HIGH, "B / TPOT"),
    _m("generations", "count", "tally", True, _NONE, "timed generations"),
    _m("kv_cache_bytes", "B", "memory", True, _LOW, "bytes of the generation state: the static KV cache, or an SSM's state"),
    _m("prefill_macs", "MAC", "count", True, _LOW, "MACs of the prefill alone"),
    _m("decode_min_bytes", "B", "memory", True, _LOW,
       "bytes a decode step must read and write at least: weights (less embeddings) + the KV cache"),
    # -- training (mode = "train_step") ---------------------------------------------------------------------
    _m("samples_per_s", "1/s", "rate", False, _HIGH, "training samples per second"),
    _m("tokens_per_s", "tokens/s", "rate", False, _HIGH, "training tokens per second"),
    _m("model_flops", "FLOP", "count", True, _LOW, "the step's counted FLOPs without recomputation (what MFU divides)"),
    _m("est_6nd_flops", "FLOP", "count", True, _NONE, "the 6·N·D rule, an estimate beside the count"),
    _m("mfu", "ratio", "share", False, _HIGH, "model FLOPs per second over the device's published dense peak"),
    _m("hfu", "ratio", "share", False, _HIGH, "counted FLOPs (recomputation included) per second over that peak"),
    _m("weight_bytes", "B", "memory", True, _LOW, "analytic: the parameters' bytes"),
    _m("grad_bytes", "B", "memory", True, _LOW, "analytic: the gradients' bytes"),
    _m("optimizer_state_bytes", "B", "memory", True, _LOW, "analytic: the optimizer's state"),
    _m("static_train_bytes", "B", "memory", True, _LOW, "analytic: weights + gradients + optimizer state"),
    _m("measured_weight_bytes", "B", "memory", True, _LOW, "the weights' tensors, measured"),
    _m("measured_grad_bytes", "B", "memory", True, _LOW, "the .grad tensors after the backward, measured"),
    _m("measured_optimizer_state_bytes", "B", "memory", True, _LOW, "the optimizer's state tensors, measured"),
    _m("activation_bytes", "B", "memory", True, _LOW, "what the forward and loss leave alive for the backward"),
    # -- one case across ranks (workload world_size / parallel: harness.engine.ranks) ---------------------------
    _m("rank<i>_median_ms", "ms", "time", False, _LOW, "rank i's own median step (the step's is the slowest rank's)"),
    _m("tokens_per_s_per_rank", "tokens/s", "rate", False, _HIGH, "tokens per second of one rank (all ranks' / N)"),
    _m("output_tokens_per_s_per_rank", "tokens/s", "rate", False, _HIGH,
       "a generation's output tokens per second of one rank (all ranks' / N)"),
    _m("samples_per_s_per_rank", "1/s", "rate", False, _HIGH, "samples per second of one rank (all ranks' / N)"),
    _m("flops_all_ranks", "FLOP", "count", True, _LOW, "the step's counted FLOPs summed over the ranks"),
    _m("rank<i>_weight_bytes", "B", "memory", True, _LOW, "rank i's parameters (its shard under FSDP and TP)"),
    _m("rank<i>_grad_bytes", "B", "memory", True, _LOW, "rank i's gradients after the backward (its shard under FSDP)"),
    _m("rank<i>_optimizer_state_bytes", "B", "memory", True, _LOW, "rank i's optimizer state"),
    _m("rank<i>_activation_bytes", "B", "memory", True, _LOW, "what rank i's forward keeps for the backward"),
    _m("rank<i>_activation_peak_bytes", "B", "memory", True, _LOW, "rank i's step peak above what was alive before"),
    _m("rank<i>_peak_bytes", "B", "memory", True, _LOW,
       "rank i's peak (the unprefixed peak_bytes of a case across ranks is the largest rank's, never a sum)"),
    _m("comm_payload_bytes", "B", "count", True, _LOW,
       "tensor bytes the step's collectives carry on a rank, derived from the parameter (TP: activation) sizes"),
    _m("comm_bytes_per_rank", "B", "count", True, _LOW, "bytes one rank sends per step with ring collectives (derived)"),
    _m("comm_counted_bytes", "B", "count", True, _LOW,
       "tensor bytes passed to the collectives of one step on a rank, counted at torch.distributed"),
    _m("comm_counted_bytes_per_rank", "B", "count", True, _LOW,
       "bytes one rank sends per step with ring collectives, from the counted bytes"),
    _m("comm_calls", "count", "tally", True, _NONE, "collectives one rank calls in one step, counted"),
    _m("comm_ms", "ms", "time", False, _LOW, "the step's counted collectives replayed alone, no compute to overlap"),
    _m("comm_share", "ratio", "share", False, _LOW, "comm_ms / median_ms: an upper bound of the step's share"),
    _m("grad_max_rel_err", "ratio", "spread", False, _LOW,
       "largest relative difference of one step's gradients from one process's on the same batches"),
    _m("logit_max_rel_err", "ratio", "spread", False, _LOW,
       "tensor parallelism: largest relative difference of the logits from the whole model's on the same batch"),
    # -- energy (bench run --energy) --------------------------------------------------------------------------
    _m("energy_j", "J", "energy", False, _LOW, "energy of one call, from the device's cumulative counter"),
    _m("energy_per_sample_j", "J", "energy", False, _LOW, "energy per batch item"),
    _m("energy_per_token_j", "J", "energy", False, _LOW, "energy per token (batch × seq_len)"),
    _m("avg_power_w", "W", "energy", False, _LOW, "average power over the energy window"),
    _m("energy_window_s", "s", "time", False, _NONE, "length of the energy window"),
    _m("energy_calls", "count", "tally", False, _NONE, "calls in the energy window"),
    _m("energy_step_j", "J", "energy", False, _NONE, "the counter's smallest step seen"),
    _m("energy_step_share", "ratio", "share", False, _LOW, "counter step / energy read (> 0.02: window stopped at its cap)"),
    _m("energy_power_integral_j", "J", "energy", False, _LOW, "energy per call from the power readings (a cross-check)"),
    _m("energy_power_samples", "count", "tally", False, _NONE, "power readings integrated"),
    # -- quoted, never measured -------------------------------------------------------------------------------
    _m("quoted_top1", "%", "accuracy", True, _HIGH, "published ImageNet-1k top-1 of the model's weights (quoted)"),
)
"""Every metric, in the order the reference lists them."""

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"<[a-z]+>", "[a-z0-9_]+", re.escape(name)) + "$")


_PATTERNS: tuple[tuple[re.Pattern[str], Metric], ...] = tuple((_pattern(m.name), m) for m in METRICS if "<" in m.name)


def lookup(name: str) -> Metric | None:
    """The catalog entry of ``name`` (a pattern entry for ``time_timed_s``, ``process_median_ms_3``), else None."""
    if name in BY_NAME:
        return BY_NAME[name]
    return next((m for p, m in _PATTERNS if p.match(name)), None)


def names(*, kind: tuple[Kind, ...] = (), exact: bool | None = None, fake_pass: bool | None = None,
          gate: bool | None = None) -> tuple[str, ...]:
    """The names (catalog order) of the metrics that match every condition given."""
    return tuple(m.name for m in METRICS if "<" not in m.name
                 and (not kind or m.kind in kind)
                 and (exact is None or m.exact == exact)
                 and (fake_pass is None or m.fake_pass == fake_pass)
                 and (gate is None or m.gate == gate))


EXACT_COUNTS: tuple[str, ...] = names(kind=("count",), fake_pass=True)
"""Counts of the fake pass (MACs, FLOPs, params, bytes moved): an affine fit of them is exact within rounding."""
GATE_EQUAL: tuple[str, ...] = names(gate=True)
"""Metrics ``bench check`` requires equal to the baseline (with the torch version unchanged)."""
FAKE_PASS: tuple[str, ...] = names(fake_pass=True)
"""Metrics the fake pass computes: the same on every executor."""
TIMINGS: tuple[str, ...] = names(kind=("time", "rate"), exact=False)
"""Measured times and rates: a figure read from them on a busy machine decides nothing."""
