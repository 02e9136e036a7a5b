"""Cost and complexity claims (C01–C06, C08, C09, C29, C30): suites plus exact counts on fake tensors."""
from __future__ import annotations

import torch

from architectures.attention_core import AttentionCore, AttentionCoreConfig, core_inputs
from architectures.rnn import critical_path_length
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import analytic_params, at, exponent, median_ratio, probe, ratio_figure, select, series
from harness import memory, registry
from harness.flops import count_flops
from harness.registry import resolve
from harness.runner import fake_pass
from harness.spec import Workload
from harness.stats import fit_loglog


CPU = torch.device("cpu")


def fake_metrics(arch: str, w: Workload, **overrides) -> dict[str, float]:
    """Params, counted MACs and estimated peak bytes of one case, on fake tensors (no memory used)."""
    return fake_pass(resolve(arch, **overrides), w, CPU, True)


@probe("attention_core", figures=(
    "macs_exp_eager", "latency_exp_eager", "memory_exp_eager", "latency_exp_eager_bwd", "memory_exp_eager_bwd",
    "latency_exp_sdpa", "memory_exp_sdpa", "latency_exp_sdpa_bwd", "memory_exp_sdpa_bwd",
    "memory_ratio_eager_sdpa", "cuda_flash_memory_ratio"))
def attention_core(ctx: Context) -> Evidence:
    run, rows = ctx.suite("attention_core")
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
    ev.unavailable["cuda_flash_memory_ratio"] = "needs a GPU (the flash kernel of FlashAttention is CUDA-only)"
    ev.chart = Chart("attention alone: latency vs n", "sequence length n", "median latency (ms)",
                     series(rows, "seq_len", "median_ms"), x_log=True, y_log=True)
    ev.notes.append("softmax(q·kᵀ/√d)·v alone (attention-core, h=8, d_head=64, batch 1, fp32); exponents of "
                    "latency and activation memory fitted over the top two octaves of n (n ≥ n_max/4).")
    return ev


@probe("qk_macs", figures=("qk_macs_n1000", "core_macs_n1000", "layer_macs_n1000"))
def qk_macs(ctx: Context) -> Evidence:
    n, d = 1000, 512
    q, k = torch.empty(1, n, d, device="meta"), torch.empty(1, n, d, device="meta")
    ev = Evidence()
    ev.figures["qk_macs_n1000"] = Figure(float(count_flops(lambda: q @ k.transpose(1, 2)).macs), unit="MACs",
                                         note="q·kᵀ for n=1000, d=512, counted (all heads together)")
    w = Workload(batch_size=1, seq_len=n)
    ev.figures["core_macs_n1000"] = Figure(fake_metrics("attention-core", w, d_model=d, n_heads=8)["macs"],
                                           unit="MACs", note="q·kᵀ + p·v, 8 heads")
    ev.figures["layer_macs_n1000"] = Figure(fake_metrics("decoder-small", w, n_layers=1, vocab_size=1)["macs"],
                                            unit="MACs", note="one decoder layer (QKV/O projections, "
                                            "attention, 4·d FFN), vocab 1 so the LM head is negligible")
    return ev


@probe("score_memory", figures=("score_bytes_n10k", "eager_peak_over_scores", "sdpa_peak_over_scores",
                                "eager_est_equals_measured"))
def score_memory(ctx: Context) -> Evidence:
    """One head, n=10,000, d_head=64, fp32: the score tensor's bytes from the code's own shapes, and the
    peak the eager and fused kernels really reach."""
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
    eager_est = fake_metrics("attention-core", w, d_model=64, n_heads=1, attn_impl="eager")
    scores = 4 * n * n
    q_bytes = n * 64 * 4
    ev.figures["score_bytes_n10k"] = Figure(float(scores), unit="bytes",
                                            note="(1, 1, 10⁴, 10⁴) fp32 score tensor")
    ev.figures["eager_peak_over_scores"] = Figure(peaks["eager"] / scores, unit="×",
                                                  note=f"measured tensor peak {peaks['eager'] / 1e6:,.0f} MB")
    ev.figures["sdpa_peak_over_scores"] = Figure(peaks["sdpa"] / scores, unit="×",
                                                 note=f"measured tensor peak {peaks['sdpa'] / 1e6:,.1f} MB")
    est = eager_est["est_peak_bytes"] - 3 * q_bytes      # minus the q, k, v inputs (static)
    ev.figures["eager_est_equals_measured"] = Figure(est / peaks["eager"], unit="×",
                                                     note="fake-tensor estimate / measured peak")
    ev.chart = Chart("n = 10,000, one head: bytes", "", "MB", {
        "score tensor (document: 400 MB)": [("scores", scores / 1e6, None, None)],
        "eager peak": [("eager", peaks["eager"] / 1e6, None, None)],
        "SDPA peak": [("sdpa", peaks["sdpa"] / 1e6, None, None)]}, kind="bar")
    return ev


def layer_macs(arch: str, d_model: int, n: int) -> float:
    """Counted MACs of one layer of ``arch``: the model at 2 layers minus at 1 (fake tensors)."""
    w = Workload(seq_len=n)
    return (fake_metrics(arch, w, n_layers=2, d_model=d_model)["macs"]
            - fake_metrics(arch, w, n_layers=1, d_model=d_model)["macs"])


@probe("complexity", figures=("macs_exp_lstm", "macs_exp_conv1d", "macs_exp_window", "macs_exp_core",
                              "macs_d_ratio_lstm", "macs_d_ratio_conv1d", "path_exp_lstm", "path_exp_attention"))
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
    ns = [1024, 2048, 4096, 8192]
    window = [fake_metrics("lra-window", Workload(seq_len=n), n_layers=1, max_seq_len=8192)["macs"] for n in ns]
    core = [fake_metrics("attention-core", Workload(seq_len=n))["macs"] for n in ns]
    for key, ys, what in (("macs_exp_window", window, "windowed (±128) encoder layer"),
                          ("macs_exp_core", core, "attention core")):
        f = fit_loglog(ns, ys)
        ev.figures[key] = Figure(f.exponent, unit="", note=f"{what}, counted MACs, n=1k…8k")
    lstm, attn = resolve("lstm-small").config, resolve("lra-exact").config
    for key, cfg in (("path_exp_lstm", lstm), ("path_exp_attention", attn)):
        f = fit_loglog(ns, [critical_path_length(cfg, n) for n in ns])
        ev.figures[key] = Figure(f.exponent, note="sequential steps vs n (critical_path_length)")
    ev.chart = Chart("counted MACs vs n (d=256)", "sequence length n", "GMACs",
                     {k: v for k, v in series(rows, "seq_len", "macs", 1e-9).items() if "256" in k},
                     x_log=True, y_log=True)
    return ev


@probe("crossover", figures=("analytic_crossover_core", "measured_crossover"))
def crossover(ctx: Context) -> Evidence:
    """n/d where self-attention stops being cheaper than an LSTM layer: from counted MACs (core n²·d vs
    n·d²) and on this machine's latency (rnn_vs_attention)."""
    run, rows = ctx.suite("rnn_vs_attention")
    ev = Evidence(sources=[run.id])
    d, n = 512, 512
    core = fake_metrics("attention-core", Workload(seq_len=n), d_model=d, n_heads=8)["macs"]   # 2·n²·d
    lstm = fake_metrics("lstm-small", Workload(seq_len=n), d_model=d, n_layers=1)["macs"]     # ≈ 8·n·d² + head
    per_n2 = core / (2 * n * n)                        # q·kᵀ MACs per n² (= d): Vaswani's n²·d term
    per_n = lstm / n / 8                               # one recurrent matrix per token (≈ d²): the n·d² term
    ev.figures["analytic_crossover_core"] = Figure(per_n / per_n2 / d, unit="× d",
                                                   note="n where n²·d (q·kᵀ) = n·d² (one recurrent matrix)")
    crossings, bounded = [], True
    for dm in (256, 512):
        att, rnn = select(rows, arch="lra-exact", d_model=dm), select(rows, arch="lstm-small", d_model=dm)
        ns = sorted({r.value("seq_len") for r in att} & {r.value("seq_len") for r in rnn})
        slower = [n for n in ns if at(att, "median_ms", seq_len=n) > at(rnn, "median_ms", seq_len=n)]
        if slower:
            crossings.append(min(slower) / dm)
        elif ns:
            bounded = False
            crossings.append(max(ns) / dm)
            ev.notes.append(f"d={dm}: attention is faster than the LSTM at every n up to {max(ns)} "
                            "(the LSTM's n sequential steps dominate on this machine)")
    x = min(crossings) if crossings else float("nan")
    ev.figures["measured_crossover"] = Figure(
        x, x if not bounded else None, float("inf") if not bounded else None, "× d",
        "smallest n/d where attention's latency exceeds the LSTM's" if bounded else
        "attention never slower in the sweep: the crossover lies beyond the largest n/d measured")
    ev.chart = Chart("latency: self-attention vs LSTM", "sequence length n", "ms",
                     {k: v for k, v in series(rows, "seq_len", "median_ms").items()
                      if k.startswith(("lstm", "attention"))}, x_log=True, y_log=True)
    return ev


@probe("heads", figures=("macs_spread_heads", "latency_ratio_h8_h1", "latency_ratio_h64_h1", "memory_ratio_h8_h1"))
def heads(ctx: Context) -> Evidence:
    run, rows = ctx.suite("heads")
    ev = Evidence(sources=[run.id])
    ok = select(rows)
    macs = [r.metrics["macs"] for r in ok if "macs" in r.metrics]
    ev.figures["macs_spread_heads"] = Figure(max(macs) / min(macs), unit="×", note="max/min forward MACs over h")
    by_h = {r.value("n_heads"): r for r in ok}
    for h in (8, 64):
        ev.figures[f"latency_ratio_h{h}_h1"] = median_ratio(by_h.get(h), by_h.get(1), f"latency h={h} / h=1")
    peak = {h: r.metric("peak_bytes") for h, r in by_h.items()}
    ev.figures["memory_ratio_h8_h1"] = ratio_figure(peak.get(8), peak.get(1),
                                                    note="eager peak memory h=8 / h=1 (h score matrices)")
    ev.chart = Chart("heads at fixed d_model=512", "n_heads", "median latency (ms)",
                     series(rows, "n_heads", "median_ms"), x_log=True)
    return ev


@probe("ffn_share", figures=("attn_overtakes_ffn_at", "ffn_share_n512", "d_ff_is_4d_share"))
def ffn_share(ctx: Context) -> Evidence:
    """Counted MACs of one decoder layer (d=512) split into attention and FFN as n grows."""
    d = 512
    ns = [128, 256, 512, 1024, 2048, 4096]
    pts_attn, pts_ffn = [], []
    for n in ns:
        w = Workload(seq_len=n)
        layer = fake_metrics("decoder-small", w, n_layers=1, vocab_size=1)["macs"]
        no_ffn = fake_metrics("decoder-small", w, n_layers=1, vocab_size=1, d_ff=1)["macs"]
        ffn = layer - no_ffn + 2 * n * d          # d_ff=1 leaves 2·n·d MACs of the FFN behind
        pts_attn.append(layer - ffn)
        pts_ffn.append(ffn)
    share = dict(zip(ns, (f / (a + f) for a, f in zip(pts_attn, pts_ffn))))
    over = [n for n, a, f in zip(ns, pts_attn, pts_ffn) if a > f]
    # attention 4nd² + 2n²d vs FFN 8nd²: equal at n = 2d; report the first measured n past it, / d
    ev = Evidence()
    ev.figures["attn_overtakes_ffn_at"] = Figure(min(over) / d if over else float("nan"), unit="× d",
                                                 note=f"first n of {ns} where attention MACs > FFN MACs")
    ev.figures["ffn_share_n512"] = Figure(share[512], unit="share", note="FFN share of a layer's MACs, n=512")
    presets = ["decoder-small", "decoder-base", "gpt2-small", "encoder-base", "aiayn-base", "aiayn-big",
               "vit-b16", "vit-l16"]
    four = [registry.get(p).config for p in presets]
    ev.figures["d_ff_is_4d_share"] = Figure(sum(c.ff_dim == 4 * c.d_model for c in four) / len(four), unit="share",
                                            note="presets with d_ff = 4·d_model: " + ", ".join(presets))
    ev.chart = Chart("one decoder layer (d=512): MACs by part", "sequence length n", "GMACs", {
        "attention (QKV/O + scores)": [(n, a / 1e9, None, None) for n, a in zip(ns, pts_attn)],
        "FFN (4·d)": [(n, f / 1e9, None, None) for n, f in zip(ns, pts_ffn)]}, x_log=True, y_log=True)
    return ev


@probe("training_flops", figures=("params_base", "params_big", "flops_ratio_base", "flops_ratio_big"))
def training_flops(ctx: Context) -> Evidence:
    """Vaswani et al.: base 100k steps, big 300k, batches of ~25,000 target tokens; the paper's 3.3e18 / 2.3e19
    came from GPU-days × an assumed sustained rate. 6·N·D counts forward+backward MACs·2 per token."""
    ev = Evidence()
    claimed = {"base": 3.3e18, "big": 2.3e19}
    steps = {"base": 100_000, "big": 300_000}
    for size in ("base", "big"):
        n = analytic_params(f"aiayn-{size}")
        d = steps[size] * 25_000
        six_nd = 6 * n * d
        ev.figures[f"params_{size}"] = Figure(float(n), unit="params", note=f"aiayn-{size}, tied embeddings")
        ev.figures[f"flops_ratio_{size}"] = Figure(claimed[size] / six_nd, unit="×",
                                                   note=f"paper {claimed[size]:.2g} / 6·N·D = {six_nd:.3g} FLOPs")
    return ev
