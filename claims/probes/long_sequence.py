"""Long sequences (C09): the long_sequence suite's exponents and memory, and the efficient attentions'
approximation error against exact attention."""
from __future__ import annotations

import torch

from architectures.layers.attention import Attention
from architectures.layers.efficient import SlidingWindowCore, approximation_error
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import at, exponent, probe, ratio_figure, select, series


EFFICIENT = {"window": "lra-window", "linformer": "lra-linformer", "performer": "lra-performer",
             "bigbird": "lra-bigbird"}


@probe("long_sequence", figures=tuple(f"{m}_exp_{k}" for k in ("exact_eager", *EFFICIENT)
                                      for m in ("latency", "memory")) + ("memory_saving_best", "approx_error_window"))
def long_sequence(ctx: Context) -> Evidence:
    run, rows = ctx.suite("long_sequence")
    ev = Evidence(sources=[run.id])
    lines = {"exact_eager": select(rows, arch="lra-exact", attn_impl="eager")}
    lines.update({k: select(rows, arch=a) for k, a in EFFICIENT.items()})
    for k, line in lines.items():
        ev.figures[f"latency_exp_{k}"] = exponent(line, "seq_len", "median_ms")
        ev.figures[f"memory_exp_{k}"] = exponent(line, "seq_len", "activation_peak_bytes")
    n = max((r.value("seq_len") for r in lines["exact_eager"]), default=None)
    exact = at(rows, "activation_peak_bytes", arch="lra-exact", attn_impl="eager", seq_len=n)
    best = min((at(line, "activation_peak_bytes", seq_len=n) or float("inf")) for k, line in lines.items()
               if k != "exact_eager")
    ev.figures["memory_saving_best"] = ratio_figure(exact, best, note=f"exact eager / best efficient, n={n}")
    ev.figures["approx_error_window"] = _approx_error()
    ev.chart = Chart("long sequences: activation memory vs n", "sequence length n", "MiB",
                     series(rows, "seq_len", "activation_peak_bytes", 1 / 2 ** 20), x_log=True, y_log=True)
    return ev


def _approx_error() -> Figure:
    """Relative error of a ±128 sliding window against exact attention with the same weights
    (d=256, 4 heads, n=1024, random weights and inputs)."""
    torch.manual_seed(0)
    exact = Attention(256, 4, core="sdpa")
    err = approximation_error(Attention(256, 4, core=SlidingWindowCore(128)), exact, torch.randn(1, 1024, 256))
    return Figure(float(err), unit="rel. error",
                  note="‖window − exact‖/‖exact‖, ±128, n=1024, random weights")
