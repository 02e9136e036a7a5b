"""Claims about building blocks and named model sizes that the documents state in passing:
computed directly from the code's own modules and shapes, each in seconds on a CPU."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from architectures.layers.attention import Attention, eager_attention
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import CPU, PROCESSES, built_params, in_processes, probe, timed_ratio
from claims.probes.cost import eager_score_bytes, score_rss_bytes
from harness.instruments.flops import count_params
from harness.instruments.fake import new_fake_mode
from harness.contract.errors import BenchInputError
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.engine.models import materialize
from harness.analysis.fits import fit_loglog
from harness.instruments.load import LoadMonitor
from harness.engine.replicate import per_process_timing
from harness.instruments.timing import TimingConfig, TimingResult, measure_interleaved


# The configurations 000 Part 2 lists, completed with the layer counts, vocabularies and FFN widths of
# their papers (the document gives only d_model and heads): preset + overrides, and the size in the name.
NAMED = {
    "bert_base": ("encoder-base", {}, 110e6, "BERT-base (Devlin et al.: 110M)"),
    "gpt2": ("gpt2-small", {}, 124e6, "GPT-2 small (as released: 124M)"),
    "gpt3": ("gpt2-small", dict(d_model=12288, n_layers=96, n_heads=96, max_seq_len=2048), 175e9,
             "GPT-3 175B: 96 layers, d_ff = 4d, GPT-2 vocabulary, tied"),
    "llama2_70b": ("decoder-llama-small", dict(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64,
                                               n_kv_heads=8, d_ff=28672, max_seq_len=4096), 70e9,
                   "LLaMA-2 70B: 80 layers, 8 K/V heads, SwiGLU d_ff 28,672, 32k vocabulary, untied"),
}


# The shapes 000 Part 2 states: (d_model, heads, d_k).
STATED = {"bert_base": (768, 12, 64), "gpt2": (768, 12, 64), "gpt3": (12288, 96, 128), "llama2_70b": (8192, 64, 128)}


def built_shapes(preset: str, **overrides: object) -> set[tuple[int, int, int]]:
    """The (d_model, heads, head width) of every attention layer of the preset built on fake tensors."""
    model = materialize(resolve(preset, **overrides), Workload(), CPU, new_fake_mode())
    return {(m.out.in_features, m.n_heads, m.head_dim) for m in model.modules() if isinstance(m, Attention)}



# Side figures: the same shapes as transformers' own models (the `hf` extra), built from their config classes.
TRANSFORMERS_SAME = {
    "bert_base": ("hf:bert-base-uncased", {}),
    "gpt2": ("hf:gpt2", {}),
    "llama2_70b": ("hf:llama", dict(vocab_size=32000, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                                    num_key_value_heads=8, intermediate_size=28672, max_position_embeddings=4096)),
}


def transformers_side(ev: Evidence, figure: str, arch: str, over: dict, count: Callable[[str, dict], float],
                      unit: str, note: str) -> None:
    """``count(arch, over)`` as the side figure ``figure`` (a count on transformers' model of the same config), or
    the figure marked unavailable, with the reason, where transformers is not installed."""
    try:
        value = count(arch, over)
        ev.figures[figure] = Figure(float(value), unit=unit, provenance="counted", note=f"{note}: {value:,}")
    except BenchInputError as exc:
        ev.unavailable[figure] = str(exc)


@probe("named_sizes", figures=tuple(f"params_{k}" for k in NAMED)
       + ("params_gpt2_released", "mha_over_gqa_params_70b", "shapes_as_stated")
       + tuple(f"params_{k}_transformers" for k in TRANSFORMERS_SAME))
def named_sizes(ctx: Context | None) -> Evidence:
    """Parameter counts of the configurations 000 names, counted on the modules built on the meta device
    (the analytic cost formula is tested equal to these, not used in their place), and their attention
    layers' shapes against the document's d_model, heads and d_k."""
    ev = Evidence()
    for key, (preset, over, named, what) in NAMED.items():
        n = built_params(preset, **over)
        ev.figures[f"params_{key}"] = Figure(float(n), unit="params", note=f"{what}; preset {preset}",
                                             provenance="counted")
    shapes = {key: built_shapes(preset, **over) for key, (preset, over, _, _) in NAMED.items()}
    odd = {k: sorted(v) for k, v in shapes.items() if v != {STATED[k]}}
    ev.figures["shapes_as_stated"] = Figure(
        not odd, provenance="structural",
        note="every attention layer built has the document's (d_model, heads, d_k): "
             + ", ".join(f"{k} {STATED[k]}" for k in STATED) + (f"; differ: {odd}" if odd else ""))
    gpt2 = ev.figures["params_gpt2"]
    ev.figures["params_gpt2_released"] = Figure(
        gpt2.value, unit="params", provenance="counted", note=f"gpt2-small built: {gpt2.value:,.0f} (tied token embedding counted once); "
                                        "OpenAI's released 'small' is 124M — its README: 'our original parameter "
                                        "counts were wrong due to an error … small referred to as 117M'")
    for key, (_, _, named, what) in NAMED.items():                  # per size: how far from its name
        f = ev.figures[f"params_{key}"]
        ev.figures[f"params_{key}"] = replace(f, note=f"{f.note}; {f.value / named - 1:+.1%} from {named:.3g}")
    preset, over, _, _ = NAMED["llama2_70b"]
    mha = built_params(preset, **{**over, "n_kv_heads": 64})
    ev.figures["mha_over_gqa_params_70b"] = Figure(mha / built_params(preset, **over), unit="×", provenance="counted",
                                                   note=f"the 70B shape with 64 K/V heads: {mha:,} parameters")
    for key, (arch, over) in TRANSFORMERS_SAME.items():
        ours = ev.figures[f"params_{key}"].value
        transformers_side(ev, f"params_{key}_transformers", arch, over, lambda a, o: built_params(a, **o), "params",
                          f"side figure: transformers' {arch} of the same shape, built from its config class on the "
                          f"meta device (ours {ours:,.0f})")
    ev.notes.append("encoder-base has no token-type embeddings, embedding LayerNorm or pooler (BertModel "
                    "has 109,482,240); gpt2-small is GPT-2 as released (124,439,808: the paper's 117M was "
                    "an undercount)")
    return ev


@probe("dot_magnitude", figures=("std_qk_dk64", "softmax_unscaled_error", "softmax_scaled_error"))
def dot_magnitude(ctx: Context | None) -> Evidence:
    """q·k for q, k ~ N(0, I) at d_k = 64: its typical size (std = √d_k = 8, the variance is 64), and the
    document's two softmax examples computed."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(100_000, 64, generator=g, dtype=torch.float64), torch.randn(100_000, 64, generator=g,
                                                                                    dtype=torch.float64)
    dots = (q * k).sum(-1)                                                   # (100k,)
    ev = Evidence()
    ev.figures["std_qk_dk64"] = Figure(float(dots.std()), unit="std of q·k",
                                       note=f"100,000 pairs; variance {float(dots.var()):.1f}; "
                                            f"|q·k| ≥ 64 in {int((dots.abs() >= 64).sum())} of them")
    for key, logits, said in (("softmax_unscaled_error", [30.0, 25.0, 20.0], [0.99, 0.01, 0.00]),
                              ("softmax_scaled_error", [3.0, 2.5, 2.0], [0.50, 0.30, 0.20])):
        p = torch.tensor(logits, dtype=torch.float64).softmax(-1)
        ev.figures[key] = Figure(float((p - torch.tensor(said, dtype=torch.float64)).abs().max()), unit="max |Δp|",
                                 note=f"softmax({logits}) = [{', '.join(f'{x:.4f}' for x in p.tolist())}]")
    return ev


@probe("layer_params", figures=("attn_over_lstm", "attn_over_gru", "attn_over_conv3"))
def layer_params(ctx: Context | None) -> Evidence:
    """Parameters of one layer at d = 512: our self-attention (Q/K/V/O with biases) against nn.LSTM,
    nn.GRU and nn.Conv1d(k=3), each mapping d → d."""
    d = 512
    attn = count_params(Attention(d, 8))
    others = {"lstm": count_params(nn.LSTM(d, d)), "gru": count_params(nn.GRU(d, d)),
              "conv3": count_params(nn.Conv1d(d, d, 3))}
    ev = Evidence()
    for k, n in others.items():
        ev.figures[f"attn_over_{k}"] = Figure(attn / n, unit="×", note=f"self-attention {attn:,} / {k} {n:,}")
    ev.chart = Chart("parameters of one d=512 layer", "", "parameters (M)", {
        name: [(name, n / 1e6, None, None)] for name, n in
        {"self-attention": attn, "LSTM": others["lstm"], "GRU": others["gru"], "Conv1d k=3": others["conv3"]}.items()},
        kind="bar")
    ev.notes.append("a Conv1d of kernel k has k·d² + d parameters: self-attention's 4d² + 4d is fewer only "
                    "for k ≥ 5")
    return ev


# -- dot-product vs additive attention (004: "Scaled Dot-Product Attention — Faster — More space-efficient")
def dot_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The project's eager attention, one head: (B, n, d) → (B, n, d); the (B, 1, n, n) scores are the big tensor."""
    return eager_attention(q[:, None], k[:, None], v[:, None], None, None)[:, 0]


class Additive(nn.Module):
    """Bahdanau's additive score wᵀ·tanh(W_q q_i + W_k k_j): a (B, n, n, d_a) tensor before the softmax."""

    def __init__(self, d: int, d_a: int) -> None:
        super().__init__()
        self.wq, self.wk, self.w = nn.Linear(d, d_a, bias=False), nn.Linear(d, d_a, bias=False), nn.Linear(d_a, 1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        e = torch.tanh(self.wq(q)[:, :, None, :] + self.wk(k)[:, None, :, :])   # (B, n, n, d_a)
        return self.w(e).squeeze(-1).softmax(-1) @ v                             # (B, n, d)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op returns: the activation that dominates memory."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def largest_intermediate_bytes(fn: Callable[[], object]) -> int:
    with torch.no_grad(), _LargestTensor() as mode:
        fn()
    return mode.largest


def _additive_setup() -> tuple[dict[str, Callable[[], Tensor]], tuple[int, int, int]]:
    """The two attentions C34 compares, on the same seeded q, k, v (B = 4, n = 256, d = d_a = 64, fp32)."""
    torch.manual_seed(0)
    b, n, d = 4, 256, 64
    q, k, v = (torch.randn(b, n, d) for _ in range(3))
    add = Additive(d, d)
    return {"dot": lambda: dot_attention(q, k, v), "additive": lambda: add(q, k, v)}, (b, n, d)


def additive_times_in_process(threads: int, timing: TimingConfig) -> dict[str, TimingResult]:
    """One fresh process's share of C34's timing (:func:`claims.probes.in_processes`): both forwards side by side."""
    torch.set_num_threads(threads)
    runs, _ = _additive_setup()
    with torch.no_grad():
        results = measure_interleaved(list(runs.values()), timing)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return dict(zip(runs, results))                                     # type: ignore[arg-type]


@probe("additive_vs_dot", figures=("additive_over_dot_latency", "additive_over_dot_bytes"))
def additive_vs_dot(ctx: Context | None) -> Evidence:
    """Forward latency (timed side by side in rounds, in :data:`claims.probes.PROCESSES` fresh processes that share
    one quick timing budget; interval over the processes) and largest intermediate tensor of dot-product vs
    additive attention at n = 256, d = d_a = 64, batch 4, fp32."""
    runs, (b, n, d) = _additive_setup()
    ev = Evidence()
    threads = ctx.threads if ctx is not None else torch.get_num_threads()
    with LoadMonitor() as monitor:
        per = in_processes(additive_times_in_process, threads, per_process_timing(TimingConfig.quick(), PROCESSES))
    busy = monitor.result.reason() if monitor.result else ""
    ev.figures["additive_over_dot_latency"] = timed_ratio([t["additive"] for t in per], [t["dot"] for t in per],
                                                          f"forward latency, B={b}, n={n}, d=d_a={d}, fp32",
                                                          busy=busy)
    sizes = {name: largest_intermediate_bytes(fn) for name, fn in runs.items()}
    ev.figures["additive_over_dot_bytes"] = Figure(sizes["additive"] / sizes["dot"], unit="×",
                                                   note=f"largest intermediate tensor: additive "
                                                        f"{sizes['additive'] / 2**20:.1f} MiB vs dot "
                                                        f"{sizes['dot'] / 2**20:.1f} MiB")
    medians = {name: sorted(s for t in per for s in t[name].samples_s) for name in runs}
    ev.chart = Chart("dot-product vs additive attention", "", "median ms", {
        name: [(name, xs[len(xs) // 2] * 1e3, None, None)] for name, xs in medians.items()}, kind="bar")
    return ev


# -- ViT patch embedding
def _doc_patchify(x: Tensor, p: int) -> Tensor:
    """000 Part 5's code, verbatim: unfold, unfold, view — no permute. (B, 3, S, S) → (B, N, 3p²)."""
    x = x.unfold(2, p, p).unfold(3, p, p)                  # (B, C, S/p, S/p, p, p)
    return x.contiguous().view(x.shape[0], -1, p ** 2 * 3)


def _patchify(x: Tensor, p: int) -> Tensor:
    """Correct: one row per patch, its (C, p, p) pixels. (B, 3, S, S) → (B, N, 3p²)."""
    x = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)   # (B, S/p, S/p, C, p, p)
    return x.reshape(x.shape[0], -1, 3 * p * p)


def _one_patch_share(rows: Tensor) -> float:
    """Share of rows whose values are all one patch id."""
    return float((rows.amin(-1) == rows.amax(-1)).double().mean())


@probe("patch_embedding", figures=("conv_equals_linear", "doc_code_one_patch_share", "permuted_one_patch_share"))
def patch_embedding(ctx: Context | None) -> Evidence:
    """Our ViT's Conv2d(p×p, stride p) patch embedding against a Linear on flattened patches with the
    same weights; and whether 000's unfold/view code gives one patch per row (an image whose pixels hold
    their patch's id)."""
    model = materialize(resolve("vit-b16", n_layers=1), Workload(), CPU, seed=0)   # only the patch embedding is used
    conv = model.patch_embed                                # Conv2d(3, 768, 16, stride 16)
    p = conv.kernel_size[0]
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        via_conv = conv(x).flatten(2).transpose(1, 2)                            # (B, 196, d)
        via_linear = F.linear(_patchify(x, p), conv.weight.flatten(1), conv.bias)   # (B, 196, d)
    ev = Evidence()
    ev.figures["conv_equals_linear"] = Figure(float((via_conv - via_linear).abs().max()), unit="max |Δ|",
                                              note="Conv2d(16×16, stride 16) vs Linear(768 → 768) on patches")
    side = 224 // p
    ids = torch.arange(side * side, dtype=torch.float32).view(side, side)
    img = ids.repeat_interleave(p, 0).repeat_interleave(p, 1).expand(1, 3, 224, 224)   # pixel = its patch id
    ev.figures["doc_code_one_patch_share"] = Figure(_one_patch_share(_doc_patchify(img, p)[0]), unit="of rows",
                                                    note="000's unfold → unfold → view: each row holds 3 "
                                                         "neighbouring patches of one channel")
    ev.figures["permuted_one_patch_share"] = Figure(_one_patch_share(_patchify(img, p)[0]), unit="of rows",
                                                    note="with .permute(0, 2, 3, 1, 4, 5) before the view")
    return ev


@probe("layer_norm", figures=("ln_padding_change", "ln_train_eval_change", "bn_padding_change",
                              "bn_train_eval_change"))
def layer_norm(ctx: Context | None) -> Evidence:
    """The same 4 sequences normalised alone and with 4 zero-padded ones in the batch, and in train vs
    eval mode, by LayerNorm(64) and BatchNorm1d(64) (over tokens), fresh modules, fp32."""
    torch.manual_seed(0)
    real = torch.randn(4, 16, 64) * 3 + 1                                    # (B, T, d)
    padded = torch.cat([real, torch.zeros(4, 16, 64)])
    ev = Evidence()
    norms = {"ln": (nn.LayerNorm, lambda m, x: m(x)),                        # over d, per token
             "bn": (nn.BatchNorm1d, lambda m, x: m(x.transpose(1, 2)).transpose(1, 2))}   # over (B, T)
    with torch.no_grad():
        for tag, (make, apply) in norms.items():
            m = make(64).train()
            alone, with_pad = apply(m, real), apply(make(64).train(), padded)[:4]
            ev.figures[f"{tag}_padding_change"] = Figure(float((alone - with_pad).abs().max()), unit="max |Δ|",
                                                         note="real tokens' outputs, batch alone vs with padding")
            ev.figures[f"{tag}_train_eval_change"] = Figure(float((alone - apply(m.eval(), real)).abs().max()),
                                                            unit="max |Δ|", note="train() vs eval() output")
    return ev


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def masked_weight(scores: Tensor, keep: Tensor, dtype: torch.dtype, fill: float) -> float:
    """The documents' ``scores.masked_fill(mask == 0, -fill).softmax(-1)`` in ``dtype``: the largest
    weight left on a masked key. Raises RuntimeError where ``dtype`` cannot hold ``-fill``."""
    w = scores.to(dtype).masked_fill(keep == 0, -fill).softmax(-1)
    return float(w[keep == 0].float().max())


@probe("mask_fill", figures=("masked_weight_fp32", "fully_masked_row_finite", "works_fp16", "works_bf16"))
def mask_fill(ctx: Context | None) -> Evidence:
    """``scores.masked_fill(mask == 0, -1e9)`` then softmax, as the documents' code does, in fp32, bf16, fp16."""
    torch.manual_seed(0)
    scores = torch.randn(8, 8) * 10
    keep = torch.tril(torch.ones(8, 8))
    ev = Evidence()
    ev.figures["masked_weight_fp32"] = Figure(masked_weight(scores, keep, torch.float32, 1e9), unit="max weight",
                                              note="largest attention weight on a masked key, fp32")
    full = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool), -1e9).softmax(-1)
    ev.figures["fully_masked_row_finite"] = Figure(
        float(torch.isfinite(full).all()), unit="",
        note=f"a row with every key masked → uniform {float(full[0, 0]):.4g} (a -inf mask gives NaN)")
    curves: dict[str, list[tuple[float, float, None, None]]] = {}
    for name, dtype in DTYPES.items():
        error = ""
        for fill in (1e1, 3e1, 1e2, 1e3, 6.5e4, 1e5, 1e9):
            try:
                curves.setdefault(name, []).append((fill, masked_weight(scores, keep, dtype, fill), None, None))
            except RuntimeError as exc:                              # fp16 cannot hold the fill value
                error = str(exc).splitlines()[0]
        if name != "fp32":
            at_1e9 = dict((x, y) for x, y, _, _ in curves[name]).get(1e9)
            ev.figures[f"works_{name}"] = Figure(float(at_1e9 == 0), note="masked weights exactly 0"
                                                 if at_1e9 is not None else f"masked_fill raises: {error}")
    ev.chart = Chart("largest weight left on a masked key vs the fill value", "−fill", "max masked weight",
                     curves, x_log=True)
    ev.notes.append("fp16's curve ends at 65,504 (its largest finite value): beyond it masked_fill raises")
    return ev


PIXEL_RSS_NS = (4096, 6144, 8192, 10_000)      # token counts whose q·kᵀ the OS measures (67–400 MB, one head)


def extrapolated_score_gb(n_target: int, ns: tuple[int, ...] = PIXEL_RSS_NS) -> Figure:
    """One head's fp32 q·kᵀ memory at ``n_target`` tokens, from what the OS measured at ``ns`` (resident-set
    high-water mark over the matmul, :func:`claims.probes.cost.score_rss_bytes`): a log-log fit of bytes against
    n, extrapolated from the largest measured n with the fitted exponent (its 95% interval gives the figure's)."""
    measured = {n: score_rss_bytes(n, repeats=1) for n in ns}
    if any(v is None for v in measured.values()):
        return Figure(float("nan"), unit="GB", note="the resident-set high-water mark cannot be reset here (/proc)")
    got = {n: v[0] for n, v in measured.items()}                     # type: ignore[index]
    fit = fit_loglog(list(got), list(got.values()))
    if fit is None or math.isnan(fit.ci_low):
        return Figure(float("nan"), unit="GB", note=f"no power law through the measured bytes {got}")
    top = max(got)
    at = {k: got[top] * (n_target / top) ** k / 1e9 for k in (fit.exponent, fit.ci_low, fit.ci_high)}
    return Figure(at[fit.exponent], at[fit.ci_low], at[fit.ci_high], "GB",
                  f"measured by the OS (RSS high-water mark over one head's real fp32 q·kᵀ): "
                  + ", ".join(f"n={n}: {b / 1e6:,.1f} MB" for n, b in got.items())
                  + f"; bytes ∝ n^{fit.exponent:.3f} [{fit.ci_low:.3f}, {fit.ci_high:.3f}], extrapolated from "
                    f"n={top} to n={n_target:,}", fit.n)


@probe("pixel_tokens", figures=("score_gb_measured_224", "tokens_224_pixels", "score_gb_per_head"))
def pixel_tokens(ctx: Context | None) -> Evidence:
    """Attention over the pixels of a 224×224 image, one token per pixel: the score tensor the eager
    attention core writes for one head (fp32, batch 1), caught at its q·kᵀ matmul on fake tensors (no memory)."""
    pixels = torch.zeros(1, 3, 224, 224).flatten(2).transpose(1, 2)      # (1, 224·224, 3): a token per pixel
    n = pixels.shape[1]
    nbytes, shape = eager_score_bytes(n)
    ev = Evidence()
    ev.figures["tokens_224_pixels"] = Figure(float(shape[-1]), unit="tokens",
                                             note=f"224 × 224 pixels flattened to {n:,} tokens; scores {shape}")
    ev.figures["score_gb_per_head"] = Figure(nbytes / 1e9, unit="GB",
                                             note=f"the q·kᵀ output of the eager forward: {nbytes / 2**30:.2f} GiB, "
                                                  "one head, one layer, fp32")
    ev.figures["score_gb_measured_224"] = extrapolated_score_gb(n)
    return ev
