"""The cost claims' figures are measurements (claims C03, C04, C05, C30): each moves when the measured
model's behaviour moves, while the formula it is compared with stays put."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from architectures.attention_core import AttentionCore, AttentionCoreConfig, core_inputs
from claims.probes import cost
from harness.instruments import flops
from harness.contract.records import CaseRecord
from harness.contract.spec import Workload

aten = torch.ops.aten


# -- C03: the score tensor's bytes, caught at its matmul ------------------------------------------
def test_score_bytes_are_the_eager_forwards_qk_output():
    assert cost.eager_score_bytes(100) == (4 * 100 * 100, (1, 100, 100))


@pytest.mark.parametrize("heads, dtype, per_score", [(1, torch.float32, 4), (2, torch.float32, 8),
                                                     (1, torch.float64, 8)])
def test_score_bytes_move_with_the_models_score_tensor(heads, dtype, per_score):
    """A core with more heads or wider scores writes a bigger score tensor, and the figure follows it
    (the old figure was 4·n², whatever the model did)."""
    n = 64
    cfg = AttentionCoreConfig(d_model=8 * heads, n_heads=heads, attn_impl="eager")
    model = AttentionCore(cfg).eval()
    q, k, v = (t.to(dtype) for t in core_inputs(cfg, Workload(batch_size=1, seq_len=n), torch.device("cpu")))
    with torch.no_grad():
        nbytes, _ = cost.score_tensor_bytes(lambda: model(q, k, v))
    assert nbytes == per_score * n * n


# -- C04: sequential steps measured as dependency depth; the LSTM formula against the unrolled cell ---
def test_sequential_depth_grows_with_n_for_the_lstm_only():
    small = {"n_layers": 1, "d_model": 8, "vocab_size": 8}
    lstm = [cost.sequential_depth("lstm-small", n, **small) for n in (16, 32, 64)]
    attn = [cost.sequential_depth("lra-exact", n, n_heads=2, **small) for n in (16, 32, 64)]
    conv = [cost.sequential_depth("conv1d-small", n, **small) for n in (16, 32, 64)]
    assert lstm[2] - lstm[1] == 2 * (lstm[1] - lstm[0]) > 0
    assert attn[0] == attn[1] == attn[2] and conv[0] == conv[1] == conv[2]
    fig, _ = cost.depth_exponent("lstm-small", [64, 128], **small)
    assert 0.95 < fig.value <= 1.0


def test_lstm_formula_over_unrolled_is_one_and_moves_with_a_wrong_formula(monkeypatch):
    assert cost.lstm_formula_over_unrolled(d=8, n=5).value == 1.0

    def input_matmul_only(input, weight0, weight1, *args, **kwargs):      # forgets h·W_hhᵀ
        return 2 * (input.numel() // input.shape[-1]) * weight0.numel()
    monkeypatch.setitem(flops.EXTRA_FORMULAS, aten.mkldnn_rnn_layer,
                        flops._registered(input_matmul_only, [aten.mkldnn_rnn_layer], True))
    assert cost.lstm_formula_over_unrolled(d=8, n=5).value == pytest.approx(0.5)


# -- C05: crossings, interpolated ----------------------------------------------------------------------
def test_crossing_interpolates_log_linearly_between_the_bracketing_points():
    assert cost.crossing([1, 2, 4], [0.5, 0.8, 1.6]) == pytest.approx((2 * 2 ** (math.log(1.25) / math.log(2)), 2, 4))
    assert cost.crossing([1, 2, 4], [0.5, 1.0, 2.0]) == (2, 2, 2)
    assert cost.crossing([1, 2], [1.5, 2.0]) is None and cost.crossing([1, 2], [0.5, 0.9]) is None
    assert cost.crossing([1, 2, 4], [1.1, 0.9, 1.2]) is None          # above 1 at the first point: outside the grid
    fig = cost.crossing_figure([1, 2, 4], [0.5, 0.8, 1.6], "test")
    assert (fig.lo, fig.hi) == (2, 4) and fig.lo < fig.value < fig.hi
    assert math.isnan(cost.crossing_figure([1, 2], [0.5, 0.9], "test").value)


def test_mac_crossover_moves_with_the_recurrent_layer_counted():
    """An LSTM layer (8·n·d² counted step by step) against the attention sublayer (4·n·d² + 2·n²·d): n = 2d;
    a GRU layer (6·n·d²) moves it to n = d; the old figure was built to equal 1·d."""
    lstm = cost.mac_crossovers(d=16, lo=0.5, hi=4.0)
    gru = cost.mac_crossovers(d=16, lo=0.5, hi=4.0, recurrent="gru-small")
    assert lstm["layer"].value == pytest.approx(2.0) and lstm["core"].value == pytest.approx(4.0)
    assert gru["layer"].value == pytest.approx(1.0)


def _timed(arch: str, n: int, ms: float) -> CaseRecord:
    samples = tuple(ms / 1e3 * (1 + 0.01 * np.sin(i)) for i in range(15))
    return CaseRecord("k", "s", arch, arch, "ok", workload={"seq_len": n}, samples_s=samples)


def test_latency_crossover_is_interpolated_with_a_bootstrap_interval_or_bounded_by_the_grid():
    ns = (128, 256, 512)
    att = [_timed("lra-exact", n, ms) for n, ms in zip(ns, (1.0, 2.0, 8.0))]
    rnn = [_timed("lstm-small", n, ms) for n, ms in zip(ns, (2.0, 4.0, 8.0 / 1.5))]
    point, boot, xs = cost.latency_crossover(att, rnn, 256)
    assert xs == [0.5, 1.0, 2.0] and 1.0 < point < 2.0
    fig = cost.smaller_crossing({256: (point, boot, xs)})
    assert fig.lo <= point <= fig.hi and fig.has_interval
    slower = [_timed("lra-exact", n, 9.0) for n in ns]
    below = cost.smaller_crossing({512: cost.latency_crossover(slower, rnn, 512), 256: (point, boot, xs)})
    assert (below.value, below.lo, below.hi) == (0.25, 0.0, 0.25)
    faster = [_timed("lra-exact", n, 0.1) for n in ns]
    beyond = cost.smaller_crossing({256: cost.latency_crossover(faster, rnn, 256)})     # bounded below by the grid
    assert (beyond.value, beyond.lo, beyond.hi) == (2.0, 2.0, math.inf)


# -- C30: attention and FFN counted per module ---------------------------------------------------------
def test_attention_overtakes_the_ffn_at_2d_and_moves_with_the_ffn_width():
    """4·n·d² + 2·n²·d against 8·n·d²: n = 2d. A wider FFN (d_ff = 8d: 16·n·d²) moves it to n = 6d; the LM
    head, which the old figure counted as attention, is in neither part."""
    d = 64
    ns, attn, ffn = cost.ffn_split(d, lo=1.0, hi=8.0)
    assert cost.crossing([n / d for n in ns], [a / f for a, f in zip(attn, ffn)])[0] == pytest.approx(2.0)
    assert attn[0] == 4 * d * d * d + 2 * d * d * d and ffn[0] == 8 * d * d * d      # n = d
    ns, attn, ffn = cost.ffn_split(d, lo=1.0, hi=8.0, d_ff=8 * d)
    x, lo, hi = cost.crossing([n / d for n in ns], [a / f for a, f in zip(attn, ffn)])
    assert lo < 6.0 < hi and x == pytest.approx(6.0, rel=0.01)          # interpolated between grid points
    assert cost.attention_ffn_macs(128, d, vocab_size=1000) == cost.attention_ffn_macs(128, d)


def test_ffn_share_probe_reads_the_interpolated_crossing():
    ev = cost.ffn_share(None)
    fig = ev.figures["attn_overtakes_ffn_at"]
    assert fig.value == pytest.approx(2.0) and fig.lo <= 2.0 <= fig.hi
    assert ev.figures["ffn_share_n512"].value == pytest.approx(8 / 14)


def test_training_flops_come_from_the_counted_step_not_from_6nd(monkeypatch):
    """C29: the paper's figure is held against the counted forward+backward FLOPs; a model whose step
    counts twice the FLOPs halves the ratio, and 6·N·D is checked against the count, not used for it."""
    counted: dict = {}
    fake_metrics = cost.fake_metrics

    def real(arch, w, **over):                  # each case counted once: the doubled run reads the same counts
        key = (arch, w, tuple(sorted(over.items())))
        if key not in counted:
            counted[key] = fake_metrics(arch, w, **over)
        return counted[key]

    monkeypatch.setattr(cost, "fake_metrics", real)
    ev = cost.training_flops(None)  # type: ignore[arg-type]
    base = ev.figures["flops_ratio_base"].value
    assert 0.8 < ev.figures["six_nd_over_counted_base"].value < 1.25
    assert counted                              # the counts came through fake_metrics

    def doubled(arch, w, **over):
        out = dict(real(arch, w, **over))
        out["flops"] *= 2
        return out

    monkeypatch.setattr(cost, "fake_metrics", doubled)
    moved = cost.training_flops(None)  # type: ignore[arg-type]
    assert moved.figures["flops_ratio_base"].value == pytest.approx(base / 2)
    assert moved.figures["six_nd_over_counted_base"].value == pytest.approx(
        ev.figures["six_nd_over_counted_base"].value / 2)


def test_a_crossing_some_replicates_never_reach_has_an_unbounded_side_and_decides_nothing():
    """Bootstrap replicates that never cross (inf) make the interval's upper side unbounded — not NaN, which
    once let the point alone pass the rule."""
    from claims.model import Rule
    from claims.rules import check
    boot = [0.9] * 380 + [math.inf] * 20
    fig = cost.smaller_crossing({256: (0.9, boot, [0.5, 1.0, 2.0])})
    assert fig.lo == pytest.approx(0.9) and fig.hi == math.inf and fig.has_interval
    assert check(Rule("measured_crossover", "within", "near d", lo=0.5, hi=2.5), fig).status == "unsure"


def _paired(arch: str, n: int, ms: float, drift: tuple[float, ...]) -> CaseRecord:
    samples = tuple(ms / 1e3 * d for d in drift for _ in range(3))
    return CaseRecord("k", "s", arch, arch, "ok", workload={"seq_len": n}, samples_s=samples, run_id="r",
                      rounds=(3,) * len(drift), group=f"g{n}")


def test_latency_crossover_timed_side_by_side_resamples_rounds():
    """Both layers slowed 3x in the last rounds (drift shared by both sides): the paired crossing does not move."""
    ns, drift = (128, 256, 512), (1.0, 1.0, 3.0, 3.0, 3.0)
    att = [_paired("lra-exact", n, ms, drift) for n, ms in zip(ns, (1.0, 2.0, 8.0))]
    rnn = [_paired("lstm-small", n, ms, drift) for n, ms in zip(ns, (2.0, 4.0, 8.0 / 1.5))]
    point, boot, _ = cost.latency_crossover(att, rnn, 256)
    plain, _, _ = cost.latency_crossover([_timed("lra-exact", n, ms) for n, ms in zip(ns, (1.0, 2.0, 8.0))],
                                         [_timed("lstm-small", n, ms) for n, ms in zip(ns, (2.0, 4.0, 8.0 / 1.5))],
                                         256)
    assert point == pytest.approx(plain, rel=0.02) and all(b == pytest.approx(point) for b in boot)
