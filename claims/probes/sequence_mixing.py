"""Three ways of mixing a sequence: a recurrence, a 1-D convolution and self-attention, by what one layer's
output sees (receptive fields read from gradients on the real modules), the layers a convolution needs to see it all,
their sequential steps, and what a stack of convolutions gains on real data (the ``mnist1d`` experiment)."""
from __future__ import annotations

import torch
from torch import nn

from architectures.layers.attention import Attention
from claims.evidence import Context
from claims.model import Evidence, Figure, mean_ci
from claims.probes import probe
from claims.probes.cost import depth_exponent
from claims.probes.inductive_bias import influence_share
from claims.probes.training import per_seed


def conv1d_layers_to_see_all(n: int, k: int = 3, d: int = 4, seed: int = 0, limit: int = 256) -> tuple[int, float]:
    """Stack real nn.Conv1d(k, 'same' padding) layers (tanh between) until every output sees every input
    (measured: every input's gradient on every output non-zero, checked on the two end outputs, which see
    least). Returns (layers needed, the share one layer's middle output sees)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    one_layer = None
    for depth in range(1, limit + 1):
        layers.append(nn.Conv1d(d, d, k, padding=k // 2))
        net = nn.Sequential(*[m for conv in layers for m in (conv, nn.Tanh())])
        x = torch.randn(1, d, n)                                          # (B, d, n)
        if one_layer is None:
            one_layer = influence_share(net, x, (slice(None), slice(None), n // 2), (0, 1))
        if all(influence_share(net, x, (slice(None), slice(None), i), (0, 1)) == 1.0 for i in (0, n - 1)):
            return depth, one_layer
    return limit + 1, float(one_layer or 0.0)


MNIST1D_FIGURES = ("mnist1d_stack_gain", "mnist1d_one_layer_acc")


def mnist1d_figures(res: dict) -> dict[str, Figure]:
    """From the ``mnist1d`` experiment: per seed, the test accuracy (fraction of the test images) of one Conv1d
    layer, and what a stack of three gains over it — pooled heads throughout."""
    acc = {v: r["acc"] for v, r in res["variants"].items()}
    sees, steps, n = res["sees"], res["setup"]["steps"], res["length"]
    means = ", ".join(f"{v} (sees {sees[v]} of {n}) {mean_ci(a).value:.3f}" for v, a in acc.items())
    return {"mnist1d_stack_gain": mean_ci(per_seed(acc["conv3"], acc["conv1"], lambda a, b: a - b),
                                          "accuracy (fraction)", f"MNIST-1D test accuracy, conv3 − conv1, per seed, "
                                                                 f"{steps} steps; means: {means}"),
            "mnist1d_one_layer_acc": mean_ci(acc["conv1"], "accuracy (fraction)",
                                             f"MNIST-1D test accuracy of one Conv1d layer, pooled head, {steps} "
                                             f"steps (chance {res['chance']})")}


@probe("three_ways", figures=("conv1d_layers_to_see_all", "conv1d_one_layer_share", "attention_one_layer_share",
                              "rnn_last_state_share", "conv1d_depth_exp", "rnn_depth_exp", *MNIST1D_FIGURES),
       reads=("experiment mnist1d",))
def three_ways(ctx: Context | None) -> Evidence:
    """C46: receptive fields measured by gradients on the real modules at n = 64 (one Conv1d k=3 layer, a stack
    of them, one layer of our Attention, nn.LSTM's last state), and the sequential steps (dependency depth of a
    forward, :func:`claims.probes.cost.depth_exponent`, the instrument of C04) of conv1d-small and lstm-small."""
    ev = Evidence()
    n, k, d = 64, 3, 16
    layers, one = conv1d_layers_to_see_all(n, k)
    ev.figures["conv1d_layers_to_see_all"] = Figure(float(layers), unit="layers",
                                                    note=f"Conv1d k={k} stacked until every output sees all {n} "
                                                         f"inputs (the receptive-field formula: (n−1)/((k−1)/2) "
                                                         f"= {(n - 1) * 2 // (k - 1)} for 'same' padding)")
    ev.figures["conv1d_one_layer_share"] = Figure(one, unit="share of inputs", note=f"one Conv1d k={k}, middle output")
    torch.manual_seed(0)
    attn = Attention(d, 2, core="eager").eval()
    ev.figures["attention_one_layer_share"] = Figure(
        influence_share(attn, torch.randn(1, n, d), (slice(None), 0), (0, 2)), unit="share of inputs",
        note=f"one layer of our Attention (no mask), output 0 of {n}")
    lstm = nn.LSTM(d, d, batch_first=True)
    ev.figures["rnn_last_state_share"] = Figure(
        influence_share(lambda x: lstm(x)[0], torch.randn(1, n, d), (slice(None), n - 1), (0, 2)),
        unit="share of inputs", note=f"one nn.LSTM layer: its last output h_T over the {n} inputs")
    small = dict(d_model=16, n_layers=1, vocab_size=64)
    ns = (16, 32, 64)
    ev.figures["conv1d_depth_exp"], cd = depth_exponent("conv1d-small", ns, **small)
    ev.figures["rnn_depth_exp"], rd = depth_exponent("lstm-small", ns, **small)
    ev.notes.append(f"dependency depth for n = {ns}: conv1d-small {cd}, lstm-small {rd} (C04 measures the same for "
                    "attention)")
    if ctx is None:
        ev.unavailable.update(dict.fromkeys(MNIST1D_FIGURES, "no claims run: the mnist1d experiment was not trained"))
        return ev
    try:
        res = ctx.experiment("mnist1d")
    except ModuleNotFoundError as exc:                   # the claims extra (mnist1d) is optional
        ev.unavailable.update(dict.fromkeys(MNIST1D_FIGURES, f"MNIST-1D needs the claims extra: {exc}"))
        return ev
    ev.figures.update(mnist1d_figures(res))
    ev.notes.append(res.get("data_description", ""))
    return ev
