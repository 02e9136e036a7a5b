"""Cost and complexity claims: suites plus exact counts on fake tensors.

Every figure here is measured — the FLOP counter on the real modules (fake tensors: shapes only), a real
allocation, a timed run, the dependency depth of a dispatched forward — and compared with the formula;
never a formula compared with itself."""
from __future__ import annotations

import contextlib
import math
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from architectures.attention_core import AttentionCore, AttentionCoreConfig, core_inputs
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import (CPU, at, built_params, busy_reason, exponent, interleaved, median_ratio, probe, ratio_figure,
                           select, series)
from claims.power import ratio_resolution
from harness.instruments import memory
from harness.contract import registry
from harness.engine.models import fake_case, materialize
from harness.instruments.fake import new_fake_mode
from harness.instruments.flops import FlopCount, count_flops, count_model, dependency_trace
from harness.contract.records import CaseRecord
from harness.contract.registry import resolve
from harness.engine.runner import fake_pass
from harness.contract.spec import Workload
from harness.analysis.fits import fit_loglog
from harness.analysis.ratios import paired_ratio


CPU = torch.device("cpu")
CONTRACTIONS = ("aten.bmm", "aten.mm", "aten.matmul", "aten.baddbmm", "aten.addmm", "aten.addbmm")


def fake_metrics(arch: str, w: Workload, **overrides) -> dict[str, float]:
    """Params, counted MACs and estimated peak bytes of one case, on fake tensors (no memory used)."""
    return fake_pass(resolve(arch, **overrides), w, CPU, True)


@contextlib.contextmanager
def reference_path(unrolled: bool) -> Iterator[None]:
    """With ``unrolled``, torch's reference CPU kernels (oneDNN off): nn.LSTM runs step by step, one
    addmm per gate matmul, instead of one fused ``mkldnn_rnn_layer`` call per layer."""
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = was and not unrolled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


def fake_model(arch: str, n: int, **overrides) -> tuple[nn.Module, tuple, torch._subclasses.FakeTensorMode]:
    """``arch`` built on fake tensors (eval) with its inputs for batch 1, n tokens, and the fake mode."""
    model, inputs, mode = fake_case(resolve(arch, **overrides), Workload(batch_size=1, seq_len=n), CPU)
    return model.eval(), inputs, mode


def module_macs(arch: str, n: int, parts: Sequence[str], unrolled: bool = False, **overrides) -> dict[str, int]:
    """Counted forward MACs of the modules of ``arch`` whose qualified names end with each of ``parts``
    (e.g. ``"blocks.0.attn"``), attributed by the counter's module tracker during one forward."""
    model, inputs, mode = fake_model(arch, n, **overrides)
    with mode, reference_path(unrolled):
        counted = count_model(model, inputs, module_depth=None)
    out = {}
    for part in parts:
        hits = [v for k, v in counted.by_module.items() if k.endswith("." + part)]
        if len(hits) != 1:
            raise KeyError(f"{arch}: {len(hits)} modules named *.{part} in {sorted(counted.by_module)}")
        out[part] = hits[0] // 2
    return out


def lstm_counts(lstm: nn.Module, x: torch.Tensor) -> tuple[FlopCount, FlopCount]:
    """(fused, unrolled) counts of one forward of ``lstm`` on ``x``: the fused kernel is counted by the
    project's formula for ``aten.mkldnn_rnn_layer``; the unrolled one by the stock matmul formulas on
    the addmm/mm torch's reference path really dispatches, step by step."""
    fused = count_model(lstm, (x,))
    if "aten.mkldnn_rnn_layer" not in fused.by_op:
        raise RuntimeError(f"the fused LSTM kernel did not run (ops: {sorted(fused.by_op)})")
    with reference_path(True):
        unrolled = count_model(lstm, (x,))
    return fused, unrolled


def crossing(xs: Sequence[float], ratio: Sequence[float]) -> tuple[float, float, float] | None:
    """The first x (sorted) where ``ratio`` (a/b) reaches 1, interpolated log-linearly (log ratio over
    log x) from the point before it; returns (x*, x_before, x_at), or None when the ratio never reaches 1
    or is above 1 already at the first point (the crossing lies outside the grid). A point sitting on 1
    exactly is the crossing itself: (x, x, x)."""
    pts = sorted(zip(xs, ratio))
    for i, (x1, r1) in enumerate(pts):
        if r1 == 1.0:
            return x1, x1, x1
        if r1 > 1.0:
            if i == 0:
                return None
            x0, r0 = pts[i - 1]
            t = -math.log(r0) / (math.log(r1) - math.log(r0))
            return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0))), x0, x1
    return None


def crossing_figure(xs: Sequence[float], ratio: Sequence[float], what: str) -> Figure:
    """:func:`crossing` as a figure: its value, the bracketing grid points as the interval (exact counts:
    the crossing is known to lie between two measured points), or NaN naming why there is none."""
    hit = crossing(xs, ratio)
    if hit is None:
        where = ("above 1 already at the first point" if sorted(zip(xs, ratio))[0][1] > 1 else "below 1 throughout")
        return Figure(float("nan"), unit="× d", note=f"{what}: no crossing in {min(xs):g}…{max(xs):g} × d "
                                                      f"(the ratio is {where})")
    x, lo, hi = hit
    how = (f"a grid point ({x:.3g} × d) sits on the crossing exactly" if lo == hi else
           f"log-linear interpolation between the bracketing grid points {lo:.3g} and {hi:.3g} × d (the interval)")
    return Figure(x, lo, hi, "× d", f"{what}: {how}; {len(xs)} points, {min(xs):.3g}…{max(xs):.3g} × d", len(xs))


def octave_grid(d: int, lo: float, hi: float, per_octave: int = 4) -> list[int]:
    """Sequence lengths from lo·d to hi·d, ``per_octave`` per doubling (integers, distinct)."""
    k = round(math.log2(hi / lo) * per_octave)
    return sorted({max(1, round(d * lo * 2 ** (i / per_octave))) for i in range(k + 1)})


def sdpa_backend(record: CaseRecord) -> str:
    """The SDPA kernel a case ran, when its run recorded it ("" otherwise)."""
    found = record.metrics.get("sdpa_backend") or record.value("sdpa_backend")
    return str(found) if found else ""


def flash_memory_ratio(rows: Sequence[CaseRecord]) -> Figure:
    """Eager attention's peak memory over the fused kernel's (forward) at the largest n both ran on the GPU,
    naming the SDPA backend that ran when the run recorded it."""
    eager = {r.value("seq_len"): r for r in select(rows, attn_impl="eager", mode="fwd") if r.metric("peak_bytes")}
    fused = {r.value("seq_len"): r for r in select(rows, attn_impl="sdpa", mode="fwd") if r.metric("peak_bytes")}
    both = sorted(set(eager) & set(fused))
    if not both:
        return Figure(float("nan"), unit="×", note="no n at which both eager and SDPA forward ran ok")
    n = both[-1]
    e, f = eager[n], fused[n]
    backend = sdpa_backend(f)
    return ratio_figure(e.metric("peak_bytes"), f.metric("peak_bytes"),
                        note=f"peak memory, eager / SDPA forward at n={n}, {f.value('dtype')}, {f.value('device')}"
                             + (f", SDPA ran the {backend} kernel" if backend else ", SDPA backend not recorded"))


@probe("attention_core", figures=(
    "macs_exp_eager", "latency_exp_eager", "memory_exp_eager", "latency_exp_eager_bwd", "memory_exp_eager_bwd",
    "latency_exp_sdpa", "memory_exp_sdpa", "latency_exp_sdpa_bwd", "memory_exp_sdpa_bwd",
    "memory_ratio_eager_sdpa", "cuda_flash_memory_ratio"), reads=("suite attention_core",))
def attention_core(ctx: Context) -> Evidence:
    cuda = ctx.device.split(":")[0] == "cuda"
    run, rows = ctx.suite("attention_core", {"dtype": "bf16"} if cuda else None)   # bf16: the flash kernel's
    ev = Evidence(sources=[run.id])
    for impl in ("eager", "sdpa"):
        for mode, tag in (("fwd", ""), ("fwd_bwd", "_bwd")):
            line = select(rows, attn_impl=impl, mode=mode)
            if impl == "eager" and mode == "fwd":
                ev.figures["macs_exp_eager"] = exponent(line, "seq_len", "macs")
            # the asymptotic exponent: the top two octaves of n (small n carry fixed per-call overheads)
            ev.figures[f"latency_exp_{impl}{tag}"] = exponent(line, "seq_len", "median_ms")
            ev.figures[f"memory_exp_{impl}{tag}"] = exponent(line, "seq_len", "activation_peak_bytes")
    n_max = max((r.value("seq_len") for r in rows if r.ok), default=None)
    ev.figures["memory_ratio_eager_sdpa"] = ratio_figure(
        at(rows, "peak_bytes", attn_impl="eager", mode="fwd", seq_len=n_max),
        at(rows, "peak_bytes", attn_impl="sdpa", mode="fwd", seq_len=n_max), note=f"peak memory at n={n_max}")
    if cuda:
        ev.figures["cuda_flash_memory_ratio"] = flash_memory_ratio(rows)
    else:
        ev.unavailable["cuda_flash_memory_ratio"] = "needs a GPU (the flash kernel of FlashAttention is CUDA-only)"
    ev.chart = Chart("attention alone: latency vs n", "sequence length n", "median latency (ms)",
                     series(rows, "seq_len", "median_ms"), x_log=True, y_log=True)
    ev.notes.append(f"softmax(q·kᵀ/√d)·v alone (attention-core, h=8, d_head=64, batch 1, {'bf16' if cuda else 'fp32'}, "
                    f"{ctx.device}); exponents of "
                    "latency and activation memory fitted over the top two octaves of n (n ≥ n_max/4).")
    return ev


def first_contraction_macs(fn: Callable[[], object]) -> tuple[int, tuple[int, ...], int]:
    """(MACs of the first op ``fn()`` dispatches that does matmul work, its output shape, MACs of every op together),
    counted op by op by the project's counter (:func:`harness.instruments.flops.count_flops`, ``calls=True``: the
    totals' own formulas, fused attention included) — in an eager attention the first is q·kᵀ."""
    counted = count_flops(fn, calls=True)
    if not counted.calls:
        raise RuntimeError("no op doing matmul work was dispatched: nothing to count")
    first = counted.calls[0]
    return first.macs, first.out_shape, counted.macs


@probe("qk_macs", figures=("qk_macs_model_n1000", "qk_macs_n1000", "core_macs_n1000", "layer_macs_n1000"))
def qk_macs(ctx: Context) -> Evidence:
    """C02: the q·kᵀ MACs of the real eager attention (AttentionCore, d = 512, 8 heads, n = 1000, batch 1, fake
    tensors) as the FLOP counter counts the op the model dispatches — the headline; beside it q·kᵀ of two bare
    (1000, 512) tensors (the document's arithmetic, counted), the whole core and a whole decoder layer."""
    n, d = 1000, 512
    w = Workload(batch_size=1, seq_len=n)
    cfg = AttentionCoreConfig(d_model=d, n_heads=8, attn_impl="eager")
    model = AttentionCore(cfg).eval()
    with new_fake_mode():
        inputs = core_inputs(cfg, w, CPU)
        with torch.no_grad():
            qk, shape, every = first_contraction_macs(lambda: model(*inputs))
    ev = Evidence()
    ev.figures["qk_macs_model_n1000"] = Figure(
        float(qk), unit="MACs", note=f"the first matmul the eager attention core dispatches (q·kᵀ, scores {shape}: "
                                     f"8 heads × 1000² × 64), counted by FlopCounterMode's formula for that op; all "
                                     f"its matmuls together {every:,} MACs")
    q, k = torch.empty(1, n, d, device="meta"), torch.empty(1, n, d, device="meta")
    ev.figures["qk_macs_n1000"] = Figure(float(count_flops(lambda: q @ k.transpose(1, 2)).macs), unit="MACs",
                                         note="q·kᵀ of two bare (1000, 512) tensors, counted: the document's "
                                              "arithmetic, a side check")
    ev.figures["core_macs_n1000"] = Figure(fake_metrics("attention-core", w, d_model=d, n_heads=8)["macs"],
                                           unit="MACs", note="q·kᵀ + p·v, 8 heads")
    ev.figures["layer_macs_n1000"] = Figure(fake_metrics("decoder-small", w, n_layers=1, vocab_size=1)["macs"],
                                            unit="MACs", note="one decoder layer (QKV/O projections, "
                                            "attention, 4·d FFN), vocab 1 so the LM head is negligible")
    return ev


def score_tensor_bytes(fn: Callable[[], object]) -> tuple[int, tuple[int, ...]]:
    """(bytes, shape) of the tensor the first matmul of ``fn()`` writes — in an eager attention, the
    q·kᵀ score tensor — caught as it is dispatched (real or fake tensors)."""
    for op in dependency_trace(fn).ops:
        if op.name in CONTRACTIONS:
            return op.out_bytes, op.out_shapes[0]
    raise RuntimeError("no matmul was dispatched: there is no score tensor to measure")


def eager_score_bytes(n: int, d_head: int = 64) -> tuple[int, tuple[int, ...]]:
    """The score tensor of the eager AttentionCore (one head, fp32, batch 1) at n tokens, on fake tensors."""
    cfg = AttentionCoreConfig(d_model=d_head, n_heads=1, attn_impl="eager")
    model = AttentionCore(cfg).eval()
    with new_fake_mode():
        inputs = core_inputs(cfg, Workload(batch_size=1, seq_len=n), CPU)
        with torch.no_grad():
            return score_tensor_bytes(lambda: model(*inputs))


def score_rss_bytes(n: int, d_head: int = 64, repeats: int = 3) -> list[int] | None:
    """What the operating system measures for one head's q·kᵀ over n tokens (real tensors, fp32, batch 1): per
    repeat, the process's resident-set high-water mark during the matmul minus its resident set before it
    (/proc: VmHWM after a reset, VmRSS), after one warm-up. None where /proc refuses the reset."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, n, d_head, generator=g), torch.randn(1, n, d_head, generator=g)
    memory.measure_peak_cpu(lambda: q[:, :256] @ k[:, :256].transpose(1, 2))     # warm-up: kernels, thread pool
    out = []
    for _ in range(repeats):
        got = memory.measure_peak_cpu(lambda: q @ k.transpose(1, 2))
        if got["rss_hwm_bytes"] is None or got["rss_before_bytes"] is None:
            return None
        out.append(got["rss_hwm_bytes"] - got["rss_before_bytes"])
    return out


def rss_figure(samples: list[int] | None, unit: str = "bytes", note: str = "") -> Figure:
    """The median of the repeats with [min, max] as its interval; NaN with the reason when /proc was refused."""
    if not samples:
        return Figure(float("nan"), unit=unit, note="the resident-set high-water mark cannot be reset here (/proc)")
    xs = sorted(samples)
    return Figure(float(xs[len(xs) // 2]), float(xs[0]), float(xs[-1]), unit, note, len(xs))


@probe("score_memory", figures=("score_rss_bytes_n10k", "score_bytes_n10k", "eager_peak_over_scores",
                                "sdpa_peak_over_scores", "eager_est_equals_measured"))
def score_memory(ctx: Context) -> Evidence:
    """One head, n=10,000, d_head=64, fp32: the bytes of the score tensor the eager forward writes
    (caught at its q·kᵀ matmul), and the peak the eager and fused kernels really reach."""
    n = 10_000
    w = Workload(batch_size=1, seq_len=n)
    ev = Evidence()
    peaks = {}
    for impl in ("eager", "sdpa"):
        cfg = AttentionCoreConfig(d_model=64, n_heads=1, attn_impl=impl)
        model = AttentionCore(cfg).eval()
        inputs = core_inputs(cfg, w, CPU)
        torch.set_num_threads(ctx.threads)
        with torch.no_grad():
            peaks[impl] = memory.measure_peak_cpu(lambda: model(*inputs))["tensor_peak_bytes"]
    scores, shape = eager_score_bytes(n)
    rss = score_rss_bytes(n)
    ev.figures["score_rss_bytes_n10k"] = rss_figure(
        rss, note="what the OS measured: resident-set high-water mark during one head's q·kᵀ of 10⁴ tokens (real "
                  "fp32 tensors) minus the resident set before it, median of 3 repeats [min, max]"
                  + (f"; repeats {', '.join(f'{b:,}' for b in rss)} B" if rss else ""))
    eager_est = fake_metrics("attention-core", w, d_model=64, n_heads=1, attn_impl="eager")
    q_bytes = n * 64 * 4
    ev.figures["score_bytes_n10k"] = Figure(float(scores), unit="bytes",
                                            note=f"output of the eager forward's q·kᵀ matmul, {shape}, as "
                                                 "dispatched (the document's 10⁴²×4 bytes = 4e8)")
    ev.figures["eager_peak_over_scores"] = Figure(peaks["eager"] / scores, unit="×",
                                                  note=f"measured tensor peak {peaks['eager'] / 1e6:,.0f} MB")
    ev.figures["sdpa_peak_over_scores"] = Figure(peaks["sdpa"] / scores, unit="×",
                                                 note=f"measured tensor peak {peaks['sdpa'] / 1e6:,.1f} MB")
    est = eager_est["est_peak_bytes"] - 3 * q_bytes      # minus the q, k, v inputs (static)
    ev.figures["eager_est_equals_measured"] = Figure(est / peaks["eager"], unit="×",
                                                     note="fake-tensor estimate / measured peak")
    ev.chart = Chart("n = 10,000, one head: bytes", "", "MB", {
        "score tensor, measured (document: 400 MB)": [("scores", scores / 1e6, None, None)],
        "eager peak": [("eager", peaks["eager"] / 1e6, None, None)],
        "SDPA peak": [("sdpa", peaks["sdpa"] / 1e6, None, None)]}, kind="bar")
    return ev


def layer_macs(arch: str, d_model: int, n: int) -> float:
    """Counted MACs of one layer of ``arch``: the model at 2 layers minus at 1 (fake tensors)."""
    w = Workload(seq_len=n)
    return (fake_metrics(arch, w, n_layers=2, d_model=d_model)["macs"]
            - fake_metrics(arch, w, n_layers=1, d_model=d_model)["macs"])


def sequential_depth(arch: str, n: int, **overrides) -> int:
    """The dependency depth of one forward of ``arch`` over n tokens (fake tensors, torch's reference
    kernels: the fused LSTM kernel is one op whatever n, so it would hide its steps): the longest chain
    of compute ops each waiting on the one before — the sequential steps, measured."""
    model, inputs, mode = fake_model(arch, n, **overrides)
    with mode, reference_path(True), torch.no_grad():
        return dependency_trace(lambda: model(*inputs)).depth


def lstm_formula_over_unrolled(d: int = 64, n: int = 32, layers: int = 2) -> Figure:
    """The project's fused-LSTM formula (``aten.mkldnn_rnn_layer``) over the matmuls torch's reference
    path really dispatches for the same nn.LSTM and input (real tensors: the fused kernel must run)."""
    torch.manual_seed(0)
    lstm = nn.LSTM(d, d, num_layers=layers, batch_first=True).eval()
    fused, unrolled = lstm_counts(lstm, torch.randn(2, n, d))                          # (B, n, d)
    return Figure(fused.macs / unrolled.macs, unit="×",
                  note=f"nn.LSTM d={d}, {layers} layers, batch 2, n={n}: formula {fused.macs:,} MACs / unrolled "
                       f"{unrolled.macs:,} MACs ({', '.join(sorted(unrolled.by_op))}, step by step)")


def depth_exponent(arch: str, ns: Sequence[int], **overrides) -> tuple[Figure, list[int]]:
    """The log-log exponent of :func:`sequential_depth` over ``ns`` (exact counts: no interval)."""
    depths = [sequential_depth(arch, n, **overrides) for n in ns]
    f = fit_loglog(ns, depths)
    return Figure(f.exponent, unit="", n=len(ns), note=f"{arch} (1 layer, d=16): dependency depth of a forward "
                  f"{depths[0]}…{depths[-1]} ops for n={ns[0]}…{ns[-1]}, measured on the dispatched ops"), depths


@probe("complexity", figures=("macs_exp_lstm", "macs_exp_conv1d", "macs_exp_window", "macs_exp_core",
                              "macs_d_ratio_lstm", "macs_d_ratio_conv1d", "path_exp_lstm", "path_exp_attention",
                              "lstm_formula_over_unrolled"), reads=("suite rnn_vs_attention",))
def complexity(ctx: Context) -> Evidence:
    run, rows = ctx.suite("rnn_vs_attention")
    ev = Evidence(sources=[run.id])
    for kind, arch in (("lstm", "lstm-small"), ("conv1d", "conv1d-small")):
        ev.figures[f"macs_exp_{kind}"] = exponent(select(rows, arch=arch, d_model=256), "seq_len", "macs")
        n = max(r.value("seq_len") for r in select(rows, arch=arch))
        per_layer = {d: layer_macs(arch, d, n) for d in (256, 512)}
        whole = ratio_figure(*(at(rows, "macs", arch=arch, d_model=d, seq_len=n) for d in (512, 256)))
        ev.figures[f"macs_d_ratio_{kind}"] = Figure(
            per_layer[512] / per_layer[256], unit="×",
            note=f"one layer's counted MACs at d=512 / d=256, n={n} (MACs at 2 layers − at 1 layer, so the "
                 f"embedding and head, linear in d, cancel; the whole model's ratio is {whole.value:.2f})")
    ev.figures["lstm_formula_over_unrolled"] = lstm_formula_over_unrolled()
    ns = [1024, 2048, 4096, 8192]
    window = [fake_metrics("lra-window", Workload(seq_len=n), n_layers=1, max_seq_len=8192)["macs"] for n in ns]
    core = [fake_metrics("attention-core", Workload(seq_len=n))["macs"] for n in ns]
    for key, ys, what in (("macs_exp_window", window, "windowed (±128) encoder layer"),
                          ("macs_exp_core", core, "attention core")):
        f = fit_loglog(ns, ys)
        ev.figures[key] = Figure(f.exponent, unit="", note=f"{what}, counted MACs, n=1k…8k")
    path_ns = [128, 256, 512, 1024]
    small = {"n_layers": 1, "d_model": 16, "vocab_size": 16}
    ev.figures["path_exp_lstm"], lstm_depths = depth_exponent("lstm-small", path_ns, **small)
    ev.figures["path_exp_attention"], attn_depths = depth_exponent("lra-exact", path_ns, n_heads=2, **small)
    ev.notes.append("Sequential steps are measured as the dependency depth of a forward's dispatched ops (each "
                    "op waits on the deepest of its inputs; views compute nothing). nn.LSTM on torch's "
                    f"reference CPU path: depth {lstm_depths} for n={path_ns} (its fused oneDNN kernel is one op "
                    f"per layer, hiding the steps); the SDPA encoder layer: {attn_depths}.")
    ev.chart = Chart("counted MACs vs n (d=256)", "sequence length n", "GMACs",
                     {k: v for k, v in series(rows, "seq_len", "macs", 1e-9).items() if "256" in k},
                     x_log=True, y_log=True)
    return ev


def attention_layer_macs(n: int, d: int) -> dict[str, int]:
    """Counted MACs of lra-exact's self-attention sublayer (one layer, h=4) at n tokens and width d: the
    whole sublayer (QKV + out projections, q·kᵀ, p·v) and its core alone (q·kᵀ + p·v)."""
    got = module_macs("lra-exact", n, ("blocks.0.attn", "blocks.0.attn.core"), n_layers=1, d_model=d,
                      n_heads=4, vocab_size=16, max_seq_len=max(n, 16))
    return {"layer": got["blocks.0.attn"], "core": got["blocks.0.attn.core"]}


def recurrent_layer_macs(n: int, d: int, arch: str = "lstm-small") -> int:
    """Counted MACs of one recurrent layer of ``arch`` at n tokens and width d, step by step on torch's
    reference path (x·W_ihᵀ and h·W_hhᵀ for every token, as dispatched)."""
    return module_macs(arch, n, ("stack",), unrolled=True, n_layers=1, d_model=d, vocab_size=16)["stack"]


def mac_crossovers(d: int = 32, lo: float = 0.25, hi: float = 8.0, recurrent: str = "lstm-small"
                   ) -> dict[str, Figure]:
    """n/d where the counted attention MACs overtake one counted recurrent layer's, for the attention
    sublayer (with projections) and for its core alone, on a quarter-octave grid of n/d in [lo, hi]."""
    ns = octave_grid(d, lo, hi)
    attn = [attention_layer_macs(n, d) for n in ns]
    rnn = [recurrent_layer_macs(n, d, recurrent) for n in ns]
    xs = [n / d for n in ns]
    return {kind: crossing_figure(xs, [a[kind] / r for a, r in zip(attn, rnn)],
                                  f"counted MACs, attention {what} vs one {recurrent} layer (d={d})")
            for kind, what in (("layer", "sublayer (QKV/O projections + q·kᵀ + p·v)"),
                               ("core", "core (q·kᵀ + p·v)"))}


def latency_crossover(att: Sequence[CaseRecord], rnn: Sequence[CaseRecord], d: int, n_boot: int = 400,
                      seed: int = 0) -> tuple[float, list[float], list[float]]:
    """The smallest n/d where the attention cases' latency reaches the recurrent ones', interpolated
    (log-linear) from the n before it — 0 when attention is slower already at the smallest n, inf when it
    is faster at every n — and the same on ``n_boot`` bootstrap resamples. Timed side by side
    (:func:`claims.probes.interleaved`), the ratio at each n is the paired per-round ratio and the bootstrap
    resamples rounds, so the interval covers drift; otherwise medians and each case's samples are resampled.
    Returns (crossing, bootstrap crossings, the n/d grid)."""
    by_n = {r.value("seq_len"): [r] for r in att if r.samples_s}
    for r in rnn:
        if r.samples_s and r.value("seq_len") in by_n:
            by_n[r.value("seq_len")].append(r)
    ns = sorted(n for n, pair in by_n.items() if len(pair) == 2)
    xs = [n / d for n in ns]
    if len(ns) < 2:
        return float("nan"), [], xs
    def cross(ratio: list[float]) -> float:
        hit = crossing(xs, ratio)
        if hit is not None:
            return hit[0]
        return 0.0 if ratio[0] > 1 else math.inf

    rng = np.random.default_rng(seed)
    if all(interleaved(*by_n[n]) for n in ns):
        per = [np.log(paired_ratio(a.samples_s, a.rounds, b.samples_s, b.rounds).per_round)
               for a, b in (by_n[n] for n in ns)]
        point = cross([float(np.exp(p.mean())) for p in per])
        boot = [cross([float(np.exp(rng.choice(p, p.size).mean())) for p in per]) for _ in range(n_boot)]
        return point, boot, xs
    samples = [[np.asarray(by_n[n][i].samples_s) for i in (0, 1)] for n in ns]
    point = cross([float(np.median(a)) / float(np.median(b)) for a, b in samples])
    boot = [cross([float(np.median(rng.choice(a, a.size))) / float(np.median(rng.choice(b, b.size)))
                   for a, b in samples]) for _ in range(n_boot)]
    return point, boot, xs


def smaller_crossing(results: dict[int, tuple[float, list[float], list[float]]], busy: str = "") -> Figure:
    """The smaller of the per-d latency crossings. Interpolated: the 2.5/97.5 percentiles of the bootstrap
    replicates' smaller crossing are its interval (over rounds when timed side by side). Below
    the grid (attention slower at the smallest n): the smallest n/d, with [0, that] as its interval.
    Beyond the grid: no value (the crossing was not reached)."""
    if not results or any(math.isnan(r[0]) for r in results.values()):
        return Figure(float("nan"), unit="× d", note="fewer than two sequence lengths with both timings")
    d, (point, _, xs) = min(results.items(), key=lambda kv: kv[1][0])
    if point == 0.0:
        return Figure(xs[0], 0.0, xs[0], "× d", f"d={d}: the attention layer is slower than the LSTM layer "
                      f"already at the smallest n measured (n/d = {xs[0]:.3g}): the crossing lies at or below it",
                      busy=busy)
    if math.isinf(point):
        return Figure(xs[-1], xs[-1], math.inf, "× d", f"d={d}: the attention layer is faster than the LSTM layer "
                      f"at every n measured: the crossing lies beyond the largest n/d of the sweep ({xs[-1]:.3g}), "
                      "its interval [that, ∞)", busy=busy)
    boot = np.min(np.array([r[1] for r in results.values()]), axis=0)
    # no interpolation: a replicate that never crosses (inf) makes that side unbounded, never NaN
    lo, hi = (float(np.quantile(boot, q, method="inverted_cdf")) for q in (0.025, 0.975))
    return Figure(point, lo, hi, "× d", f"smallest over d ∈ {sorted(results)} of the n/d where the attention "
                  "layer's median latency first reaches the LSTM layer's, interpolated log-linearly from the n "
                  f"before it (d={d}); interval: bootstrap ({len(boot)} resamples) of the paired rounds when "
                  "timed side by side, else of one run's samples", len(boot), busy=busy)


CROSSOVER_SUITE = "attention_vs_lstm"     # one attention sublayer vs one LSTM layer, timed side by side
CROSSOVER_DS = (256, 512)


def below_d_pairs(rows: Sequence[CaseRecord], d: int) -> list[tuple[int, CaseRecord, CaseRecord]]:
    """(n, attention sublayer, LSTM layer) at every n < d where both ran ok at width d."""
    att = {r.value("seq_len"): r for r in select(rows, arch="attention-layer", d_model=d)}
    rnn = {r.value("seq_len"): r for r in select(rows, arch="lstm-small", d_model=d)}
    return [(n, att[n], rnn[n]) for n in sorted(set(att) & set(rnn)) if n < d]


def worst_below_d(rows: Sequence[CaseRecord], ds: Sequence[int] = CROSSOVER_DS) -> tuple[Figure, Figure]:
    """For every n < d measured (each d of ``ds``): attention's cost over the LSTM layer's, and the worst (largest)
    — (counted MACs: exact, no interval; latency: each point's paired ratio, the worst point's value with the
    largest lower and upper ends over the points, so the figure is ≤ 1 over its whole interval exactly when every
    point's interval is, and above 1 when any point's is)."""
    macs, times = [], []
    for d in ds:
        for n, a, r in below_d_pairs(rows, d):
            if a.metric("macs") and r.metric("macs"):
                macs.append((a.metric("macs") / r.metric("macs"), n, d))
            times.append((median_ratio(a, r, f"attention sublayer / LSTM layer latency, d={d}, n={n}"), n, d))
    if not macs:
        mac_fig = Figure(float("nan"), unit="×", note=f"no n < d with both layers counted (d ∈ {list(ds)})")
    else:
        worst, n, d = max(macs)
        mac_fig = Figure(worst, unit="×", n=len(macs), note=(
            f"largest counted-MAC ratio attention sublayer / LSTM layer over every n < d measured ({len(macs)} "
            f"points, d ∈ {list(ds)}): at d={d}, n={n} (4·n·d² + 2·n²·d against 8·n·d² reads 0.5 + n/(4d))"))
    ok = [(f, n, d) for f, n, d in times if not math.isnan(f.value)]
    if not ok:
        return mac_fig, Figure(float("nan"), unit="×", note=f"no n < d with both layers timed (d ∈ {list(ds)})")
    worst_f, n, d = max(ok, key=lambda t: t[0].value)
    los = [f.lo if f.has_interval else f.value for f, _, _ in ok]
    his = [f.hi if f.has_interval else f.value for f, _, _ in ok]
    busy = next((f.busy for f, _, _ in ok if f.busy), "")
    per = "; ".join(f"d={d_}, n={n_}: {f.text()}" for f, n_, d_ in ok)
    lat_fig = Figure(worst_f.value, max(los), max(his), "×", (
        f"largest latency ratio attention sublayer / LSTM layer over every n < d measured ({len(ok)} points, "
        f"each a paired ratio with its 95% interval; the figure's ends are the largest ends): worst at d={d}, "
        f"n={n}. {per}"), len(ok), busy=busy, processes=min(f.processes for f, _, _ in ok))
    return mac_fig, lat_fig


@probe("crossover", figures=("mac_crossover_layer", "mac_crossover_core", "measured_crossover",
                             "mac_ratio_max_below_d", "latency_ratio_max_below_d", "power_latency_ratio_max_below_d"),
       reads=("suite attention_vs_lstm",))
def crossover(ctx: Context) -> Evidence:
    """C05, like for like: one self-attention sublayer (projections + core) against one LSTM layer
    (suite attention_vs_lstm), counted and timed side by side at every n < d; where the latency and the
    counted MACs cross (n/d), the latter also on a fine grid of counted MACs (d = 32)."""
    run, rows = ctx.suite(CROSSOVER_SUITE)
    ev = Evidence(sources=[run.id])
    macs = mac_crossovers()
    ev.figures["mac_crossover_layer"], ev.figures["mac_crossover_core"] = macs["layer"], macs["core"]
    mac_fig, lat_fig = worst_below_d(rows)
    ev.figures["mac_ratio_max_below_d"] = mac_fig
    ev.figures["latency_ratio_max_below_d"] = lat_fig
    ev.figures["power_latency_ratio_max_below_d"] = ratio_resolution(lat_fig, "the central latency rule")
    results = {}
    for dm in CROSSOVER_DS:
        att, rnn = select(rows, arch="attention-layer", d_model=dm), select(rows, arch="lstm-small", d_model=dm)
        results[dm] = latency_crossover(att, rnn, dm)
        ev.notes.append(f"latency, d={dm}: crossing at n/d = {results[dm][0]:.3g} (0: attention slower already at "
                        f"the smallest n; inf: faster at every n) over n/d = {[round(x, 3) for x in results[dm][2]]}")
    timed = [r for r in rows if r.arch in ("attention-layer", "lstm-small")]
    ev.figures["measured_crossover"] = smaller_crossing(results, busy_reason(timed))
    ev.chart = Chart("latency: one self-attention sublayer vs one LSTM layer", "sequence length n", "ms",
                     series(rows, "seq_len", "median_ms"), x_log=True, y_log=True)
    return ev


def attention_ffn_macs(n: int, d: int = 512, **overrides) -> tuple[int, int]:
    """(attention, FFN) counted forward MACs of decoder-small's one layer at n tokens, attributed per module
    during one forward: the ``attn`` sublayer (QKV/O projections, q·kᵀ, p·v; dense: the causal mask
    counted as the full square, as computed) and the ``mlp`` (up and down projections)."""
    sizes = {"n_layers": 1, "d_model": d, "vocab_size": 16, "max_seq_len": max(n, 2048), **overrides}
    got = module_macs("decoder-small", n, ("blocks.0.attn", "blocks.0.mlp"), **sizes)
    return got["blocks.0.attn"], got["blocks.0.mlp"]


def ffn_split(d: int = 512, lo: float = 0.25, hi: float = 8.0, **overrides) -> tuple[list[int], list[int], list[int]]:
    """(ns, attention MACs, FFN MACs) over a quarter-octave grid of n/d in [lo, hi]."""
    ns = octave_grid(d, lo, hi)
    pairs = [attention_ffn_macs(n, d, **overrides) for n in ns]
    return ns, [a for a, _ in pairs], [f for _, f in pairs]


# C30's norm is read over the released Transformers' FFN shapes (published data, one table per model).
FFN_SHAPES = Path(__file__).resolve().parents[1] / "ffn_shapes.toml"


def released_ffn_shapes(path: Path = FFN_SHAPES) -> dict[str, dict]:
    """The released models' (d_model, d_ff, ffn kind, source), as published."""
    return tomllib.loads(path.read_text(encoding="utf-8"))


def ffn_width(preset: str) -> tuple[int, int, int]:
    """(d_model, FFN hidden width, FFN MACs per token) of ``preset``'s first block, measured on the built module:
    its ``mlp`` run over one token on fake tensors, counted op by op (:func:`harness.instruments.flops.count_flops`);
    the hidden width is the length its last matmul (the down projection) contracts — its MACs over its output's
    elements — and the MACs are the whole mlp's for that token."""
    mode = new_fake_mode()
    model = materialize(resolve(preset), Workload(), CPU, mode).eval()
    with mode:
        mlp = next(m for name, m in model.named_modules() if name.endswith("blocks.0.mlp"))
        d = next(p for p in mlp.parameters() if p.dim() == 2).shape[1]      # the up projection reads d
        x = torch.zeros(1, 1, d)
        with torch.no_grad():
            counted = count_flops(lambda: mlp(x), calls=True)
    down = counted.calls[-1]
    return d, down.macs // math.prod(down.out_shape), counted.macs


@probe("ffn_share", figures=("attn_overtakes_ffn_at", "ffn_share_n512", "d_ff_is_4d_share", "d_ff_all_4d",
                             "swiglu_ffn_macs_over_4d"))
def ffn_share(ctx: Context) -> Evidence:
    """Counted MACs of one decoder layer (d=512) split into attention and FFN as n grows (per module); the FFN
    hidden width of each reference preset measured on its built module (the counter-example LLaMA included)."""
    d = 512
    ns, pts_attn, pts_ffn = ffn_split(d)
    ev = Evidence()
    ev.figures["attn_overtakes_ffn_at"] = crossing_figure(
        [n / d for n in ns], [a / f for a, f in zip(pts_attn, pts_ffn)],
        "counted MACs of the attention sublayer (QKV/O + q·kᵀ + p·v) vs the FFN (d_ff = 4d) of one decoder "
        "layer, attributed per module (the LM head in neither)")
    at_d = ns.index(d)
    ev.figures["attn_overtakes_ffn_at"] = replace(ev.figures["attn_overtakes_ffn_at"], provenance="counted")
    ev.figures["ffn_share_n512"] = Figure(pts_ffn[at_d] / (pts_attn[at_d] + pts_ffn[at_d]), unit="share",
                                          provenance="counted",
                                          note="FFN share of the layer's attention + FFN MACs at n = d = 512")
    shapes = released_ffn_shapes()
    four = [k for k, r in shapes.items() if r["d_ff"] == 4 * r["d_model"]]
    other = [f"{k} d_ff = {r['d_ff'] / r['d_model']:.3g}·d ({r['ffn']})" for k, r in shapes.items()
             if r["d_ff"] != 4 * r["d_model"]]
    src = "the released models' papers and configurations (claims/ffn_shapes.toml)"
    ev.figures["d_ff_is_4d_share"] = Figure(len(four) / len(shapes), unit="share", quoted=src,
                                            note=f"released Transformers whose FFN is 4·d wide: {len(four)} of "
                                                 f"{len(shapes)} ({', '.join(four)}); not 4·d: {'; '.join(other)}")
    ev.figures["d_ff_all_4d"] = Figure(not other, quoted=src, note=("every released shape's FFN is 4·d" if not other
                                                                    else "not 4·d: " + "; ".join(other)))
    widths = {p: ffn_width(p) for p in ("decoder-small", "decoder-llama-small")}
    dm, h, macs = widths["decoder-llama-small"]
    ev.figures["swiglu_ffn_macs_over_4d"] = Figure(
        macs / (8 * dm * dm), unit="×", provenance="counted", note=f"decoder-llama-small's SwiGLU FFN (d_ff {h}, three d×d_ff matrices) "
                                             f"counted {macs:,} MACs per token / a 4·d two-matrix FFN's 8·d² = "
                                             f"{8 * dm * dm:,} (decoder-small's, counted: {widths['decoder-small'][2]:,})")
    ev.notes.append("Algebra: attention 4·n·d² (projections) + 2·n²·d (q·kᵀ, p·v) vs FFN 8·n·d² are equal at n = 2d; "
                    "the counts agree when the crossing reads 2. LLaMA's SwiGLU uses d_ff = 8/3·d (rounded up to a "
                    "multiple of 256) so that its three matrices cost what two 4·d ones do.")
    ev.chart = Chart("one decoder layer (d=512): MACs by part", "sequence length n", "GMACs", {
        "attention (QKV/O + scores)": [(n, a / 1e9, None, None) for n, a in zip(ns, pts_attn)],
        "FFN (4·d)": [(n, f / 1e9, None, None) for n, f in zip(ns, pts_ffn)]}, x_log=True, y_log=True)
    return ev


TRAIN_PAIR_LEN = 32        # tokens per sentence of a training pair (WMT'14 en-de sentences average ~25-30)


@probe("training_flops", figures=("params_base", "params_big", "flops_ratio_base", "flops_ratio_big",
                                  "six_nd_over_counted_base", "six_nd_over_counted_big"))
def training_flops(ctx: Context) -> Evidence:
    """Vaswani et al.: base 100k steps, big 300k, batches of ~25,000 target tokens; the paper's 3.3e18 / 2.3e19
    came from GPU-days × an assumed sustained rate. Measured: the training step's FLOPs (mode "train_step":
    forward, next-token cross-entropy, backward, AdamW step — the loss and the update are elementwise, counted 0 —
    counted on fake tensors) of one source/target pair of TRAIN_PAIR_LEN tokens each, per target token, times
    the tokens trained on; 6·N·D (N counted on the built module) is checked against that count."""
    ev = Evidence()
    claimed = {"base": 3.3e18, "big": 2.3e19}
    steps = {"base": 100_000, "big": 300_000}
    for size in ("base", "big"):
        arch = f"aiayn-{size}"
        n = built_params(arch)
        tokens = steps[size] * 25_000
        step = fake_metrics(arch, Workload(batch_size=1, seq_len=TRAIN_PAIR_LEN, mode="train_step"))
        counted = step["flops"] / TRAIN_PAIR_LEN * tokens          # FLOPs per target token × tokens
        ev.figures[f"params_{size}"] = Figure(float(n), unit="params", note=f"{arch} built on meta, tied embeddings")
        ev.figures[f"flops_ratio_{size}"] = Figure(
            claimed[size] / counted, unit="×",
            note=f"paper {claimed[size]:.2g} / counted {counted:.3g} FLOPs ({step['flops'] / TRAIN_PAIR_LEN:.3g} "
                 f"per target token, a training step (forward, loss, backward, AdamW), pairs of {TRAIN_PAIR_LEN}+{TRAIN_PAIR_LEN} tokens)")
        ev.figures[f"six_nd_over_counted_{size}"] = Figure(6 * n * tokens / counted, unit="×",
                                                           note="the 6·N·D rule of thumb / the counted FLOPs")
    return ev
