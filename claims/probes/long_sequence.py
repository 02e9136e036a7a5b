"""Long sequences: the long_sequence suite's exponents and memory — against exact attention run eagerly
AND as the fused kernel (SDPA) a user would pick — and the efficient attentions' approximation error against
exact attention at the same n, weights and inputs."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from architectures.efficient_attention import make_attention
from architectures.layers.attention import Attention, Core, Heads
from architectures.layers.efficient import approximation_error
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure, mean_ci
from claims.probes import at, exponent, median_ratio, probe, ratio_figure, select, series
from claims.power import diff_resolution
from harness.contract.records import CaseRecord
from harness.contract.registry import resolve

EFFICIENT = {"window": "lra-window", "linformer": "lra-linformer", "performer": "lra-performer",
             "bigbird": "lra-bigbird", "longformer": "lra-longformer"}
EXACT = {"exact_eager": "eager", "exact_sdpa": "sdpa"}
ERROR_N = 1024                             # the length the approximation errors are measured at
ERROR_SEEDS = (0, 1, 2, 3, 4)
ERRORS = (*EFFICIENT, "uniform")

FIGURES = (tuple(f"{m}_exp_{k}" for k in (*EXACT, *EFFICIENT) for m in ("latency", "memory"))
           + ("memory_saving_best", "memory_saving_vs_sdpa", "latency_saving_vs_sdpa")
           + tuple(f"approx_error_{k}" for k in ERRORS)
           + tuple(f"{p}approx_vs_uniform_{k}" for k in EFFICIENT for p in ("", "power_")))
CLEARLY_BETTER = 0.5                       # "good": at most half the error of uniform attention (the rule's bar)


@probe("long_sequence", figures=FIGURES, reads=("suite long_sequence",))
def long_sequence(ctx: Context) -> Evidence:
    run, rows = ctx.suite("long_sequence")
    ev = Evidence(sources=[run.id])
    lines = {k: select(rows, arch="lra-exact", attn_impl=impl) for k, impl in EXACT.items()}
    lines.update({k: select(rows, arch=a) for k, a in EFFICIENT.items()})
    for k, line in lines.items():
        ev.figures[f"latency_exp_{k}"] = exponent(line, "seq_len", "median_ms")
        ev.figures[f"memory_exp_{k}"] = exponent(line, "seq_len", "activation_peak_bytes")
    ev.figures.update(savings(lines))
    ev.figures.update(approximation_errors())
    ev.chart = Chart("long sequences: activation memory vs n", "sequence length n", "MiB",
                     series(rows, "seq_len", "activation_peak_bytes", 1 / 2 ** 20), x_log=True, y_log=True)
    return ev


def savings(lines: dict[str, Sequence[CaseRecord]]) -> dict[str, Figure]:
    """At the longest n exact attention reached (eagerly), the best efficient variant's activation memory
    against exact attention eager and SDPA, and SDPA's latency against the fastest efficient variant there.

    ``lines``: "exact_eager", "exact_sdpa" and each efficient variant's ok records of the suite. A variant
    with no record at that n does not compete; with none at all the figure is NaN with the reason.
    """
    n = max((r.value("seq_len") for r in lines["exact_eager"]), default=None)
    mem = {k: at(line, "activation_peak_bytes", seq_len=n) for k, line in lines.items()}
    eff = {k: v for k, v in mem.items() if k not in EXACT and v is not None}
    out: dict[str, Figure] = {}
    if not eff:
        why = f"no efficient variant measured at n={n}"
        return {k: Figure(float("nan"), unit="×", note=why)
                for k in ("memory_saving_best", "memory_saving_vs_sdpa", "latency_saving_vs_sdpa")}
    best = min(eff, key=eff.__getitem__)
    out["memory_saving_best"] = ratio_figure(mem["exact_eager"], eff[best],
                                             note=f"exact eager / best efficient ({best}), n={n}")
    out["memory_saving_vs_sdpa"] = ratio_figure(
        mem["exact_sdpa"], eff[best],
        note=f"exact SDPA / best efficient ({best}) activation peak, n={n}: "
             + ", ".join(f"{k} {v / 2 ** 20:,.1f} MiB" for k, v in mem.items() if v is not None))
    one = lambda k: next(iter(select(lines[k], seq_len=n)), None)  # noqa: E731
    fastest = min((k for k in eff if one(k) and one(k).metrics.get("median_ms")),
                  key=lambda k: one(k).metrics["median_ms"], default=None)
    out["latency_saving_vs_sdpa"] = (
        median_ratio(one("exact_sdpa"), one(fastest), f"exact SDPA / fastest efficient ({fastest}) latency, n={n}")
        if fastest else Figure(float("nan"), unit="×", note=f"no efficient latency at n={n}"))
    return out


class UniformCore(Core):
    """Every query attends to every key with weight 1/S: the structure-free approximation (the mean of v),
    the reference level for the errors of the others."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        b, h, t, hd = q.shape
        mean = v.mean(dim=2, keepdim=True)                               # (B, Hkv, 1, hd)
        return mean.repeat_interleave(h // v.shape[1], dim=1).expand(b, h, t, hd)   # (B, H, T, hd)

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        return 0


def approximation_errors(n: int = ERROR_N, seeds: Sequence[int] = ERROR_SEEDS) -> dict[str, Figure]:
    """‖variant − exact‖/‖exact‖ of one attention layer of each LRA preset (d=256, 4 heads, the suite's core
    knobs) against exact attention with the same q/k/v/out weights, at ``n`` tokens; per seed fresh random
    weights (nn.Linear's init; Linformer's E, F and Performer's ω as their cores draw them) and inputs
    x ~ N(0, 1) of shape (1, n, 256). Mean over seeds with a t-interval. ``uniform``: the same for
    :class:`UniformCore` (every weight 1/n), the level a structure-free approximation reaches."""
    errors: dict[str, list[float]] = {k: [] for k in ERRORS}
    for seed in seeds:
        torch.manual_seed(seed)
        exact = make_attention(resolve("lra-exact", max_seq_len=n).config)
        x = torch.randn(1, n, exact.heads.n_heads * exact.heads.head_dim)   # (1, n, d)
        for k in ERRORS:
            torch.manual_seed(seed)
            variant = (Attention(x.shape[-1], exact.heads.n_heads, core=UniformCore()) if k == "uniform"
                       else make_attention(resolve(EFFICIENT[k], max_seq_len=n).config))
            errors[k].append(approximation_error(variant, exact, x))
    what = {"uniform": "uniform attention (mean of v)"} | {k: f"{k} ({resolve(a).description.split(', ')[-1]})"
                                                           for k, a in EFFICIENT.items()}
    out = {f"approx_error_{k}": mean_ci(v, "rel. error", f"‖{what[k]} − exact‖/‖exact‖, n={n}, d=256, h=4, "
                                                        f"random weights and inputs, {len(v)} seeds")
           for k, v in errors.items()}
    out.update(against_uniform(errors, n))
    return out


def against_uniform(errors: dict[str, list[float]], n: int = ERROR_N) -> dict[str, Figure]:
    """Each approximation's error over uniform attention's, per seed (the same weights and inputs: paired), mean
    with a t-interval: uniform attention knows nothing about the input (every key weighted 1/n), so an
    approximation is worth its name only when this ratio is clearly below 1 (the rule: ≤ CLEARLY_BETTER over
    the whole interval). ``power_…``: the interval's half-width, the smallest effect the rule could have seen."""
    base = errors["uniform"]
    out: dict[str, Figure] = {}
    for k in EFFICIENT:
        if k not in errors:
            continue
        ratio = mean_ci([e / u for e, u in zip(errors[k], base)], "× uniform's error",
                        f"‖{k} − exact‖ / ‖uniform − exact‖ per seed (same weights and inputs), n={n}, "
                        f"{len(base)} seeds; uniform's own error {sum(base) / len(base):.3g}")
        out[f"approx_vs_uniform_{k}"] = ratio
        out[f"power_approx_vs_uniform_{k}"] = diff_resolution(ratio, f"the {k} rule")
    return out
