"""The attention-variant and long-sequence probes (C09, C10, C11, C19): each figure moves when the quantity
it measures moves — a cache bigger than the formula, a speed-up that starts at another context, exact SDPA
that needs less memory, an approximation that becomes exact, generation that stops being sequential."""
from __future__ import annotations

import math

import pytest
import torch

from architectures.layers.kv_cache import StaticKVCache, StaticKVState
from architectures.transformer import Decoder, DecoderConfig
from architectures.transformer_cost import decoder_params
from claims.catalog import load_catalog
from claims.model import Figure
from claims.probes import load_all
from claims.probes import long_sequence as ls
from claims.probes import variants
from harness.instruments.timing import TimingResult
from harness.contract.records import CaseRecord
from harness.contract.registry import resolve
from harness.contract.suite import load_suite


def _rec(line: str, n: int, ms: float, *, spread: float = 0.02, **values) -> CaseRecord:
    """An ok record at context/sequence length ``n`` whose samples sit around ``ms`` (± ``spread``·ms)."""
    config = {k: v for k, v in values.items() if k not in ("batch_size", "params", "peak", "arch")}
    metrics = {"median_ms": ms, "params": values.get("params", 1000),
               "activation_peak_bytes": values.get("peak", 1.0), "throughput_per_s": 1e3 / ms}
    samples = tuple(ms / 1e3 * (1 + spread * (i % 5 - 2) / 2) for i in range(20))
    return CaseRecord(f"{line}-{n}", "s", line, values.get("arch", "decode-step-small"), "ok", config=config,
                      workload={"seq_len": n, "batch_size": values.get("batch_size", 8)}, metrics=metrics,
                      samples_s=samples)


# -- C10/C11: the cache ratio is a real allocation -----------------------------------------------------
def test_kv_ratio_is_the_real_caches_ratio():
    figs = variants.kv_figures(8, 1)
    assert figs["kv_ratio"].value == 0.125 and figs["kv_formula_matches_cache"].value is True
    assert variants.kv_figures(32, 8)["kv_ratio"].value == 0.25


def test_kv_ratio_moves_when_the_cache_is_bigger_than_the_formula(monkeypatch):
    """A decoder that stores K/V expanded to every query head (as a GQA implementation that repeats K/V
    before caching would): the formula still says 1/8, the real ratio is 1 and the check fails."""
    mix = StaticKVCache.mix

    def expanded(self: StaticKVCache, core, q, k, v, *rest):
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))   # (B, H, T, hd)
        return mix(self, core, q, k, v, *rest)

    def wide_state(self: Decoder, batch: int, max_len: int) -> StaticKVState:
        cfg = self.cfg
        return StaticKVState(StaticKVCache(batch, cfg.n_heads, cfg.head_dim, max_len, like=self.tok.weight)
                             for _ in self.stack.blocks)
    monkeypatch.setattr(StaticKVCache, "mix", expanded)
    monkeypatch.setattr(Decoder, "generation_state", wide_state)
    figs = variants.kv_figures(8, 1)
    assert figs["kv_ratio"].value == 1.0                                       # the formula says 0.125
    assert figs["kv_formula_matches_cache"].value is False


# -- C10/C11: decode speed-up at equal parameters, swept over context ---------------------------------
def _sweep(mqa_ms: dict[int, float], mha_ms: float = 10.0, params: int = 1000) -> list[CaseRecord]:
    rows = []
    for n, ms in mqa_ms.items():
        rows.append(_rec("MHA cache b=8", n, mha_ms, n_kv_heads=8, use_cache=True, params=1000))
        rows.append(_rec("MQA cache b=8 params = MHA", n, ms, n_kv_heads=1, use_cache=True, params=params))
    return rows


def test_speedup_start_moves_with_the_records():
    early = variants.decode_figures(_sweep({64: 9.0, 256: 7.0, 1024: 5.0}), kv=1)
    late = variants.decode_figures(_sweep({64: 10.0, 256: 10.0, 1024: 5.0}), kv=1)
    assert early["speedup_starts_at"].value == 64 and late["speedup_starts_at"].value == 1024
    assert early["decode_latency_ratio"].value == pytest.approx(0.5)
    assert early["decode_latency_ratio"].has_interval
    never = variants.decode_figures(_sweep({64: 9.0, 256: 7.0, 1024: 10.5}), kv=1)
    assert math.isnan(never["speedup_starts_at"].value)                        # slower at the largest n
    dip = variants.decode_figures(_sweep({64: 5.0, 256: 10.0, 1024: 5.0}), kv=1)
    assert dip["speedup_starts_at"].value == 1024                              # must hold from there on


def test_decode_ratio_compares_only_parameter_matched_variants():
    """The fewer-parameter line is the confounded comparison: it never feeds decode_latency_ratio."""
    rows = _sweep({1024: 8.0}) + [_rec("MQA cache b=8", 1024, 2.0, n_kv_heads=1, use_cache=True, params=850)]
    figs = variants.decode_figures(rows, kv=1)
    assert figs["decode_latency_ratio"].value == pytest.approx(0.8)
    assert figs["decode_latency_ratio_fewer_params"].value == pytest.approx(0.2)
    unmatched = variants.decode_figures(_sweep({1024: 8.0}, params=850), kv=1)
    assert math.isnan(unmatched["decode_latency_ratio"].value) and "parameter-matched" in \
        unmatched["decode_latency_ratio"].note


def test_kv_cache_suite_matched_lines_have_mha_parameters():
    suite = load_suite("kv_cache", quick=True)
    params = {c.line: decoder_params(resolve(c.arch, **dict(c.overrides)).config) for c in suite.cases
              if c.arch.startswith("decode-step")}                              # not Mamba's state line
    mha = params["MHA cache b=8"]
    for line in ("MQA cache b=8 params = MHA", "GQA-2 cache b=8 params = MHA"):
        assert abs(params[line] / mha - 1) <= 1e-3, line                      # FFN widened: within 0.1 %


# -- C19: generation is timed for real -------------------------------------------------------------
def _timed(samples: list[float]) -> TimingResult:
    return TimingResult(0.0, tuple(samples), 1, 1, 0.0, "perf_counter", rounds=(1,) * len(samples))


def test_sequential_figures_move_with_the_times():
    jitter = [1 + 0.01 * (i - 3) for i in range(7)]
    seq = {n: (_timed([n * 1e-3 * j for j in jitter]), _timed([1e-3 * j for j in jitter]))
           for n in (4, 16, 64)}                                                      # n steps, flat pass
    par = {n: (_timed([1.1e-3 * j for j in jitter]), _timed([1e-3 * j for j in jitter]))
           for n in (4, 16, 64)}                                                      # as if parallel
    s, p = variants.sequential_figures(seq), variants.sequential_figures(par)
    assert s["decode_over_prefill"].value == pytest.approx(64) and p["decode_over_prefill"].value == pytest.approx(1.1)
    assert s["decode_over_prefill_exp"].value == pytest.approx(1.0) and abs(p["decode_over_prefill_exp"].value) < 1e-9
    assert s["decode_over_prefill"].has_interval


def test_sequential_figures_over_several_processes_say_how_many_processes_their_interval_covers():
    jitter = [1 + 0.01 * (i - 1) for i in range(3)]
    per_process = [{n: (_timed([n * 1e-3 * j * (1 + 0.02 * k) for j in jitter]), _timed([1e-3 * j for j in jitter]))
                    for n in (4, 16, 64)} for k in range(3)]                           # 3 processes, 3 rounds each
    f = variants.sequential_figures(per_process)
    assert f["decode_over_prefill"].processes == 3 and f["decode_over_prefill_exp"].processes == 3
    assert f["decode_over_prefill"].value == pytest.approx(64, rel=0.05)
    assert variants.sequential_figures(per_process[0])["decode_over_prefill"].processes == 1


def test_batch_gain_is_read_at_the_shortest_context():
    rows = [_rec("MHA cache b=1", n, 4.0, n_kv_heads=8, use_cache=True, batch_size=1) for n in (64, 2048)]
    rows += [_rec("MHA cache b=8", 64, 8.0, n_kv_heads=8, use_cache=True, batch_size=8),
             _rec("MHA cache b=8", 2048, 64.0, n_kv_heads=8, use_cache=True, batch_size=8)]
    assert variants.batch_gain(rows).value == pytest.approx(0.5)     # b=8 throughput_per_s is per call here
    faster = [r if r.value("seq_len") != 64 or r.value("batch_size") != 8 else
              _rec("MHA cache b=8", 64, 2.0, n_kv_heads=8, use_cache=True, batch_size=8) for r in rows]
    assert variants.batch_gain(faster).value == pytest.approx(2.0)
    assert "n=2048" in variants.batch_gain(rows).note


def test_generation_times_decode_is_sequential():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2)).eval()
    calls = []
    model.stack.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[1]))   # every forward
    dec, pre = variants.generation_times(model, 6, repeats=2)
    assert dec.rounds == pre.rounds == (1, 1) and all(t > 0 for t in dec.samples_s + pre.samples_s)
    assert calls.count(6) == 4 and calls.count(1) == 4 * 6               # cold + warm-up + 2 rounds, each side


# -- C09: against exact SDPA, and the approximation errors ----------------------------------------
def _long_lines(sdpa_peak: float) -> dict[str, list[CaseRecord]]:
    n = 2048
    lines = {"exact_eager": [_rec("exact eager", n, 100.0, arch="lra-exact", peak=1000.0)],
             "exact_sdpa": [_rec("exact sdpa", n, 60.0, arch="lra-exact", peak=sdpa_peak)]}
    for k, peak, ms in (("window", 300.0, 20.0), ("linformer", 250.0, 30.0), ("performer", 400.0, 40.0),
                        ("bigbird", 350.0, 50.0)):
        lines[k] = [_rec(k, n, ms, arch=f"lra-{k}", peak=peak)]
    return lines


def test_memory_saving_vs_sdpa_moves_with_sdpa_memory():
    small, big = ls.savings(_long_lines(200.0)), ls.savings(_long_lines(1000.0))
    assert small["memory_saving_vs_sdpa"].value == pytest.approx(0.8)           # SDPA needs less: < 1
    assert big["memory_saving_vs_sdpa"].value == pytest.approx(4.0)
    assert small["memory_saving_best"].value == pytest.approx(4.0) and "linformer" in small["memory_saving_best"].note
    assert small["latency_saving_vs_sdpa"].value == pytest.approx(3.0)          # 60 ms / window's 20 ms
    assert small["latency_saving_vs_sdpa"].has_interval


def test_approximation_error_moves_with_the_approximation():
    """At n=64 the ±128 window sees every key (exact: error ~0); at n=512 it does not."""
    short, long = ls.approximation_errors(64, seeds=(0, 1)), ls.approximation_errors(512, seeds=(0, 1))
    assert short["approx_error_window"].value < 1e-5 < 0.1 < long["approx_error_window"].value
    for k in ls.ERRORS:
        f = long[f"approx_error_{k}"]
        assert f.has_interval and f.value > 0 and f.n == 2, k


def test_the_four_claims_rules_name_declared_figures_and_one_central_rule():
    probes = load_all()
    for claim in load_catalog():
        if claim.id in ("C09", "C10", "C11", "C19"):
            declared = probes[claim.probe][1]
            assert all(r.figure in declared for r in claim.rules), claim.id
            assert sum(r.central for r in claim.rules) == 1, claim.id


def test_figure_helper_sanity():
    f = variants.speedup_start({64: Figure(0.9, 0.85, 0.95), 128: Figure(0.8, 0.7, 0.9)})
    assert f.value == 64 and "n=64" in f.note
