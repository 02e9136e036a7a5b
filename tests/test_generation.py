"""Generation (issue 27): the static KV cache, the generation loop and its figures, the generation suite."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from architectures.layers.kv_cache import StaticKVCache, static_kv_bytes
from architectures.ssm import PRESETS as SSM_PRESETS, SSMLM
from architectures.transformer import Decoder, DecoderConfig

TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4)
CONFIGS = {
    "mha": {}, "gqa2": dict(n_kv_heads=2), "mqa": dict(n_kv_heads=1),
    "window3": dict(window=3), "window3-mqa-rope": dict(window=3, n_kv_heads=1, positions="rope"),
    "window5-eager": dict(window=5, attn_impl="eager"), "alibi": dict(positions="alibi"),
    "learned": dict(positions="learned", max_seq_len=32), "llama-like": dict(n_kv_heads=2, positions="rope",
                                                                            norm="rmsnorm", activation="swiglu"),
}


def _decode_vs_full(model: torch.nn.Module, prompt: int = 6, total: int = 12, batch: int = 2) -> float:
    """Largest |logit difference| between prefill + one-token decode steps on the model's generation state and
    the full sequence run again from scratch, at every position after the prompt."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (batch, total))
    with torch.no_grad():
        full = model(tokens)                                              # (B, T, vocab)
        state = model.generation_state(batch, total)
        errs = [(model.prefill(tokens[:, :prompt], state) - full[:, prompt - 1]).abs().max()]
        for i in range(prompt, total):
            errs.append((model.decode(tokens[:, i:i + 1], state) - full[:, i]).abs().max())
    return float(max(errs))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_static_cache_decoding_equals_full_recomputation(name: str) -> None:
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(**TINY, **CONFIGS[name])).eval()
    assert _decode_vs_full(model) < 1e-5


def test_static_cache_is_reusable_after_reset() -> None:
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(**TINY, n_kv_heads=2)).eval()
    assert _decode_vs_full(model) < 1e-5
    assert _decode_vs_full(model, prompt=3) < 1e-5      # a second prompt after a first (prefill resets)


def test_mamba_prefill_and_steps_equal_full_recomputation() -> None:
    torch.manual_seed(1)
    cfg = replace(SSM_PRESETS["mamba-lm-tiny"], vocab_size=64, d_model=32, n_layers=2, d_state=8)
    model = SSMLM(cfg).eval()
    assert _decode_vs_full(model) < 1e-5
    before = model.generation_state(2, 12).nbytes()
    assert model.generation_state(2, 4096).nbytes() == before          # constant state: max_len changes nothing


@pytest.mark.parametrize("kv,window,max_len,slots", [(4, None, 12, 12), (2, None, 7, 7), (1, 3, 12, 4),
                                                     (2, 30, 12, 12)])
def test_static_cache_bytes_are_exact(kv: int, window: int | None, max_len: int, slots: int) -> None:
    like = torch.zeros((), dtype=torch.bfloat16)
    cache = StaticKVCache(3, kv, 8, max_len, window, like=like)
    assert cache.size == slots and cache.ring == (slots < max_len)
    assert cache.nbytes() == static_kv_bytes(3, kv, 8, max_len, window, 2) == 2 * 3 * kv * slots * 8 * 2


def test_ring_buffer_memory_is_bounded_by_the_window() -> None:
    model = Decoder(DecoderConfig(**TINY, window=3)).eval()
    short, long = model.generation_state(1, 16), model.generation_state(1, 4096)
    assert sum(c.nbytes() for c in short) == sum(c.nbytes() for c in long)


def test_static_cache_writes_in_place_without_reallocation() -> None:
    model = Decoder(DecoderConfig(**TINY, n_kv_heads=1)).eval()
    state = model.generation_state(1, 10)
    ptrs = [(c.k.data_ptr(), c.v.data_ptr()) for c in state]
    with torch.no_grad():
        model.prefill(torch.randint(0, 64, (1, 4)), state)
        for _ in range(5):
            model.decode(torch.randint(0, 64, (1, 1)), state)
    assert [(c.k.data_ptr(), c.v.data_ptr()) for c in state] == ptrs
    assert all(int(c.pos) == 9 for c in state)


def test_a_second_prompt_without_reset_is_refused() -> None:
    model = Decoder(DecoderConfig(**TINY)).eval()
    state = model.generation_state(1, 10)
    with torch.no_grad():
        model.stack(model.tok(torch.randint(0, 64, (1, 3))), caches=list(state))
        with pytest.raises(ValueError, match="one prompt"):
            model.stack(model.tok(torch.randint(0, 64, (1, 3))), caches=list(state))


# -- the generation loop and its figures --------------------------------------------------------------------
from harness.engine import generation# noqa: E402
from harness.contract.spec import Case, Workload  # noqa: E402
from harness.instruments.timing import TimingConfig, measure  # noqa: E402
from tests.helpers import greedy_without_cache  # noqa: E402


def _tiny_generation(new_tokens: int = 5, **kw: object) -> generation.Generation:
    torch.manual_seed(2)
    model = Decoder(DecoderConfig(**TINY, **kw)).eval()
    return generation.Generation(model, torch.randint(0, 64, (2, 7)), new_tokens)


def test_the_loop_generates_what_greedy_decoding_without_a_cache_generates() -> None:
    gen = _tiny_generation(6, n_kv_heads=2)
    gen()
    assert torch.equal(gen.tokens, greedy_without_cache(gen.model, gen.prompt, 6))   # (B, 6): reruns every step


def test_figures_follow_their_definitions_on_a_counting_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that advances 1 s per reading: the prefill takes 1 s (TTFT), each step 1 s (TPOT, ITL)."""
    ticks = iter(range(10_000))
    monkeypatch.setattr(generation.time, "perf_counter", lambda: float(next(ticks)))
    gen = _tiny_generation(5)
    gen()
    gen()
    assert gen.traces == [generation.Trace(1.0, (1.0,) * 4)] * 2
    w = Workload(batch_size=2, mode="generate", prompt_len=7, new_tokens=5)
    fig = generation.summarize(gen.traces, w)
    assert fig["ttft_ms"] == 1000 and fig["tpot_ms"] == 1000 and fig["e2e_ms"] == 5000
    assert fig["itl_p50_ms"] == fig["itl_p99_ms"] == 1000
    assert fig["output_tokens_per_s"] == 2 * 5 / 5 and fig["total_tokens_per_s"] == 2 * 12 / 5
    assert fig["decode_tokens_per_s"] == 2.0


def test_tpot_is_the_mean_step_and_itl_the_spread_of_every_step() -> None:
    traces = [generation.Trace(0.5, (0.1, 0.2, 0.3)), generation.Trace(0.7, (0.1, 0.1, 0.4))]
    fig = generation.summarize(traces, Workload(mode="generate", prompt_len=3, new_tokens=4))
    assert fig["ttft_ms"] == pytest.approx(600)                          # median of 500 and 700
    assert fig["tpot_ms"] == pytest.approx(200)                          # both calls' mean step is 0.2 s
    assert fig["itl_p50_ms"] == pytest.approx(150) and fig["itl_p99_ms"] > 390
    one = generation.summarize([generation.Trace(0.5, ())], Workload(mode="generate", prompt_len=3, new_tokens=1))
    assert "tpot_ms" not in one and "itl_p50_ms" not in one               # no step: left out, never 0


def test_each_timed_sample_is_one_whole_generation_whose_clock_it_contains() -> None:
    """Structure, not absolute times: per call, prefill + the steps (the trace's e2e) lie within the timer's
    sample of that call, and the steps are most of the decode part."""
    gen = _tiny_generation(8)
    timed = measure(gen, TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=5, min_time_s=0.0,
                                      min_sample_s=0.0, max_time_s=5.0))
    assert timed.block_size == 1
    traces = generation.timed_traces(gen, len(timed.samples_s), timed.block_size)
    assert len(traces) == len(timed.samples_s) and len(gen.traces) == 1 + timed.warmup_calls + len(traces)
    for sample, trace in zip(timed.samples_s, traces):
        assert len(trace.step_s) == 7 and trace.ttft_s > 0 and min(trace.step_s) > 0
        assert trace.e2e_s <= sample
        assert sample - trace.e2e_s < 0.5 * sample                       # the clock covers the call


def test_decode_bound_bytes_are_weights_without_the_embedding_table_plus_the_cache_traffic() -> None:
    gen = _tiny_generation(3)
    model = gen.model
    emb = model.tok.weight
    weights = sum(p.nbytes for p in model.parameters()) - emb.nbytes + 2 * emb[0].nbytes
    slot = 2 * 2 * model.cfg.kv_heads * model.cfg.head_dim * 4 * model.cfg.n_layers   # k+v, B=2, fp32, all layers
    # steps after 8 and 9 earlier positions: read them, write one
    assert generation.decode_min_bytes(gen) == weights + slot * ((8 + 1) + (9 + 1)) / 2


@pytest.mark.slow
def test_compiled_decode_step_runs_on_cpu_and_generates_the_eager_tokens() -> None:
    from harness.engine.compiled import compile_model, warm_up_compiled
    gen = _tiny_generation(4)
    gen()
    compiled = gen.with_decode(compile_model(gen.decoding, "default", "fwd"), compiled=True)
    warm_up_compiled(compiled, "cpu", "default")
    compiled()
    assert torch.equal(compiled.tokens, gen.tokens) and len(compiled.traces) >= 3 and len(gen.traces) == 1


@pytest.mark.gpu
def test_cudagraphs_decode_step_replays_on_cuda() -> None:
    from harness.engine.compiled import compile_model, warm_up_compiled
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(2)
    model = Decoder(DecoderConfig(**TINY, n_kv_heads=2)).cuda().eval()
    gen = generation.Generation(model, torch.randint(0, 64, (2, 7), device="cuda"), 6)
    gen()
    graphed = gen.with_decode(compile_model(gen.decoding, "cudagraphs", "fwd"), compiled=True)
    warm_up_compiled(graphed, "cuda", "cudagraphs")
    graphed()
    assert torch.equal(graphed.tokens, gen.tokens)


# -- bad input through the CLI, and the suite ---------------------------------------------------------------
from harness.contract.suite import load_suite  # noqa: E402
from tests.helpers import invoke  # noqa: E402

GEN_SUITE = """\
name = "gen_bad"
metrics = ["latency"]
fixed = {{ arch = "{arch}", mode = "generate", {fields} }}
sweep = {{ batch_size = [1] }}
"""
BAD_GENERATION = {   # name: (arch, workload fields, the field the one line must name)
    "past max_seq_len": ("gpt2-small", "prompt_len = 1000, new_tokens = 100", "new_tokens"),
    "prompt_len < 1": ("decoder-tiny", "prompt_len = 0, new_tokens = 4", "prompt_len"),
    "encoder": ("encoder-small", "prompt_len = 8, new_tokens = 4", "mode"),
    "cnn": ("resnet18", "prompt_len = 8, new_tokens = 4", "mode"),
    "s4d": ("s4d-lm-tiny", "prompt_len = 8, new_tokens = 4", "mode"),
    "no new_tokens": ("decoder-tiny", "prompt_len = 8", "new_tokens"),
    "seq_len with generate": ("decoder-tiny", "prompt_len = 8, new_tokens = 4, seq_len = 8", "seq_len"),
}


@pytest.mark.parametrize("name", sorted(BAD_GENERATION))
def test_bad_generation_input_exits_2_naming_the_field_nothing_stored(tmp_path, name: str) -> None:
    arch, fields, field = BAD_GENERATION[name]
    path = tmp_path / "gen_bad.toml"
    path.write_text(GEN_SUITE.format(arch=arch, fields=fields))
    db = tmp_path / "results.sqlite"
    result = invoke("run", str(path), "--quick", "--executor", "inline", "--store", f"sqlite:///{db}")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert field in lines[0] and str(path) in lines[0]
    assert not db.exists()


def test_generation_fields_without_mode_generate_are_refused(tmp_path) -> None:
    path = tmp_path / "gen_bad.toml"
    path.write_text(GEN_SUITE.format(arch="decoder-tiny", fields="prompt_len = 8").replace('mode = "generate", ', ""))
    result = invoke("run", str(path), "--dry-run")
    assert result.exit_code == 2 and "prompt_len" in result.stderr


def test_generation_fields_at_their_default_leave_case_keys_unchanged() -> None:
    from harness.contract.spec import workload_dict
    assert "prompt_len" not in workload_dict(Workload()) and "new_tokens" not in workload_dict(Workload())
    w = Workload(mode="generate", prompt_len=4, new_tokens=2)
    assert workload_dict(w)["prompt_len"] == 4 and workload_dict(w)["new_tokens"] == 2


@pytest.mark.parametrize("quick,device", [(True, "cpu"), (False, "cpu"), (True, "cuda"), (False, "cuda")])
def test_generation_suite_loads_and_expands(quick: bool, device: str) -> None:
    suite = load_suite("generation", quick=quick, sets={"device": device} if device == "cuda" else None)
    assert suite.cases and all(c.workload.mode == "generate" for c in suite.cases)
    by_line: dict[str, set] = {}
    for c in suite.cases:       # every line varies along the prompt length alone
        w = c.workload
        by_line.setdefault(c.line, set()).add((w.batch_size, w.new_tokens, w.dtype, w.compile, c.overrides))
    assert all(len(v) == 1 for v in by_line.values())
    compiles = {c.workload.compile for c in suite.cases}
    assert compiles == ({"none", "cudagraphs"} if device == "cuda" else {"none", "default"})
    archs = {c.arch for c in suite.cases}
    assert "mamba-lm-small" in archs and "decoder-small" in archs
    kv = {dict(c.overrides).get("n_kv_heads") for c in suite.cases}
    assert {8, 1} <= kv
    assert any("window" in dict(c.overrides) for c in suite.cases)
    if quick and device == "cpu":
        assert len(suite.cases) <= 24


def test_generation_case_runs_end_to_end_and_records_its_figures() -> None:
    from harness.engine.runner import RunOptions, run_case
    w = Workload(batch_size=2, mode="generate", prompt_len=8, new_tokens=4)
    case = Case("t", "l", "decoder-tiny", (("n_kv_heads", 2),), w, ("latency", "memory", "flops"))
    rec = run_case(case, RunOptions(timing=TimingConfig(min_samples=3, min_time_s=0.0, max_time_s=1.0, rounds=1)))
    assert rec.status == "ok", rec.message
    m = rec.metrics
    for key in ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_ms", "output_tokens_per_s",
                "total_tokens_per_s", "kv_cache_bytes", "decode_min_bytes", "peak_bytes", "macs", "prefill_macs"):
        assert m[key] > 0, key
    assert m["itl_p50_ms"] <= m["itl_p90_ms"] <= m["itl_p99_ms"]
    assert m["kv_cache_bytes"] == 2 * 2 * 2 * (8 + 4) * 32 * 4 * 2   # layers·k,v·B·slots·Hkv·hd·fp32
    assert m["prefill_macs"] < m["macs"]
    assert m["generations"] == len(rec.samples_s)                    # block size 1 here: one trace per sample


# -- the report's reading of generation figures -------------------------------------------------------------
from harness.contract.records import CaseRecord  # noqa: E402


def _rec(line: str, batch: int, prompt: int, ttft: float, tpot: float, key: str = "", **metrics: float) -> CaseRecord:
    return CaseRecord(key or f"{line}-{batch}-{prompt}", "generation", line, "decoder-small", "ok",
                      config={"n_kv_heads": 8},
                      workload={"batch_size": batch, "mode": "generate", "prompt_len": prompt, "new_tokens": 8,
                                "dtype": "fp32", "device": "cpu"},
                      metrics={"ttft_ms": ttft, "tpot_ms": tpot, "decode_tokens_per_s": batch / tpot * 1e3,
                               "median_ms": ttft + 7 * tpot, "flops": 1e9, **metrics})


def test_report_slopes_are_the_linear_fits_along_each_line() -> None:
    from reports import generation as rg
    recs = [_rec("MHA b=1", 1, p, ttft=2.0 + 0.01 * p, tpot=1.0 + 0.002 * (p + 4)) for p in (32, 128, 512)]
    (s,) = rg.line_slopes(recs)
    assert s.n == 3 and s.ttft_us_per_token == pytest.approx(10.0) and s.ttft_intercept_ms == pytest.approx(2.0)
    assert s.tpot_us_per_token == pytest.approx(2.0) and s.tpot_intercept_ms == pytest.approx(1.0)


def test_report_finds_the_knee_of_tokens_per_second_against_batch() -> None:
    from reports import generation as rg
    recs = [_rec(f"MHA b={b}", b, 256, 5.0, tpot) for b, tpot in ((1, 10.0), (4, 11.0), (16, 14.0), (64, 40.0))]
    (series,) = rg.batch_series(recs)
    assert [b for b, _, _ in series.points] == [1, 4, 16, 64] and series.knee == 64
    assert len(rg.batch_records(recs, series)) == 4
    flat = [_rec(f"MHA b={b}", b, 256, 5.0, 10.0) for b in (1, 8)]
    assert rg.batch_series(flat)[0].knee is None


def test_bandwidth_bound_and_prefill_share_come_from_the_runs_calibrated_peak() -> None:
    from reports.frames import generation_rates
    rec = _rec("MHA b=1", 1, 256, ttft=4.0, tpot=2.0, decode_min_bytes=1e7, prefill_macs=1e8)
    peak = {"cpu": {"copy_bytes_per_s": 1e10, "matmul_flops_per_s": {"fp32": 1e11}}}
    rates = generation_rates(rec, peak)
    assert rates["decode_bound_ms"] == pytest.approx(1.0)                # 1e7 B / 1e10 B/s
    assert rates["bandwidth_bound_share"] == pytest.approx(0.5)          # 1 ms bound / 2 ms step
    assert rates["prefill_peak_share"] == pytest.approx(2e8 / 4e-3 / 1e11)
    assert generation_rates(rec, None) == {}                             # no peak: nothing, never 0


def test_counted_generation_macs_match_the_analytic_formula_and_ignore_compile() -> None:
    """The fake pass counts the eager model: prefill (P tokens) + N - 1 decode steps over the whole static cache
    (P + N keys, masked), each with the LM head on one position — transformer_cost's formulas, an independent
    instrument; a compiled case counts the same."""
    from architectures import transformer_cost as tc
    from harness.contract import registry
    from harness.engine.runner import fake_pass
    spec = registry.resolve("decoder-tiny", n_kv_heads=2)
    cfg, b, p, n = spec.config, 2, 8, 5
    counted = [fake_pass(spec, Workload(batch_size=b, mode="generate", prompt_len=p, new_tokens=n, compile=c),
                         torch.device("cpu"), True) for c in ("none", "default")]
    head = b * cfg.d_model * cfg.vocab_size
    prefill = tc.stack_macs(cfg, b, p) + head
    step = tc.stack_macs(cfg, b, 1, kv_len=p + n) + head
    assert counted[0]["prefill_macs"] == prefill
    assert counted[0]["macs"] == prefill + (n - 1) * step
    assert counted[1]["macs"] == counted[0]["macs"] and counted[1]["prefill_macs"] == counted[0]["prefill_macs"]
