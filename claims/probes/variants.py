"""Attention variants and positions: exact KV-cache arithmetic, the kv_cache suite,
equivariance and position-scheme identities computed on the code's own modules."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from architectures.layers.positions import make_positions
from architectures.transformer import Decoder, DecoderConfig, Encoder, EncoderConfig
from architectures.transformer_cost import kv_cache_bytes
from claims.evidence import Context
from claims.model import Chart, Evidence, Figure, mean_ci
from claims.probes import CPU, in_processes, mean_chart, median_ratio, probe, select, series, timed_ratio
from claims.probes import generation as gen
from claims.probes.blocks import NAMED, TRANSFORMERS_SAME, transformers_side
from harness.engine.generation import Generation
from harness.engine.models import materialize
from harness.instruments.load import LoadMonitor
from harness.instruments.fake import new_fake_mode
from harness.instruments.memory import LiveTensorTracker
from harness.contract.records import CaseRecord
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.analysis.fits import fit_loglog
from harness.analysis.ratios import paired_ratio
from harness.instruments.timing import TimingConfig, TimingResult, measure_interleaved


MATCH_TOL = 0.01                           # "parameter-matched": within 1% of MHA's parameter count


def cache_bytes(n_heads: int, n_kv_heads: int, n_tokens: int = 16) -> tuple[int, int]:
    """(formula bytes, bytes of the real generation state after a real prefill of ``n_tokens``) of a tiny decoder
    (d = 8·n_heads, 2 layers) with this head layout."""
    cfg = DecoderConfig(vocab_size=64, d_model=n_heads * 8, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads)
    torch.manual_seed(0)
    model = Decoder(cfg).eval()
    state = model.generation_state(1, n_tokens)
    with torch.no_grad():
        model.prefill(torch.zeros(1, n_tokens, dtype=torch.long), state)
    return kv_cache_bytes(cfg, 1, n_tokens, 4), state.nbytes()


def held_cache_bytes(n_heads: int, n_kv_heads: int, n_tokens: int = 16, decode: bool = True) -> int:
    """The bytes a tiny decoder (d = 8·n_heads, 2 layers, fp32) keeps allocated for its generation state (a static
    KV cache per layer, sized for the prompt and one more token), as the allocator sees them: the state made, a
    prefill of ``n_tokens`` (and, with ``decode``, one decode step) under the live-tensor tracker (every storage
    allocated, freed ones subtracted), minus the last output's storage — what stays alive is what the state holds,
    whatever tensors (or views of larger ones) it keeps, its int64 position bookkeeping included."""
    cfg = DecoderConfig(vocab_size=64, d_model=n_heads * 8, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads)
    torch.manual_seed(0)
    model = Decoder(cfg).eval()
    with torch.no_grad(), LiveTensorTracker() as tracker:
        state = model.generation_state(1, n_tokens + 1)
        out = model.prefill(torch.zeros(1, n_tokens, dtype=torch.long), state)
        if decode:
            del out
            out = model.decode(torch.zeros(1, 1, dtype=torch.long), state)
        held = tracker.current_bytes - out.untyped_storage().nbytes()
    return held


def kv_figures(n_heads: int, kv: int) -> dict[str, Figure]:
    """``kv_ratio``: the bytes the real caches of ``kv`` KV heads hold after a forward / MHA's real caches
    (a measurement); ``kv_formula_matches_cache``: the formula equals the real bytes, for both layouts."""
    formula, real = cache_bytes(n_heads, kv)
    mha_formula, mha_real = cache_bytes(n_heads, n_heads)
    held, mha_held = held_cache_bytes(n_heads, kv), held_cache_bytes(n_heads, n_heads)
    pre, mha_pre = held_cache_bytes(n_heads, kv, decode=False), held_cache_bytes(n_heads, n_heads, decode=False)
    return {
        "kv_ratio_held": Figure(held / mha_held, unit="×",
                                note=f"{kv} / {n_heads} KV heads: bytes the allocator holds for the static caches "
                                     f"(17 slots, position bookkeeping included) after a 16-token prefill and one "
                                     f"decode step, {held:,} B / MHA's {mha_held:,} B"),
        "kv_ratio_held_prefill": Figure(pre / mha_pre, unit="×",
                                        note=f"the same right after the prefill: {pre:,} B / MHA's {mha_pre:,} B "
                                             "(the static cache copies K/V out of the fused QKV projection's "
                                             "output into its own buffers: it never keeps the queries alive)"),
        "kv_ratio": Figure(real / mha_real, unit="×",
                           note=f"{kv} / {n_heads} KV heads: real cache {real:,} B / MHA's real cache {mha_real:,} B "
                                f"after a 16-token prefill (formula ratio {formula / mha_formula:g})"),
        "kv_formula_matches_cache": Figure(formula == real and mha_formula == mha_real,
                                           note=f"formula {formula:,} B vs real {real:,} B; MHA formula "
                                                f"{mha_formula:,} B vs real {mha_real:,} B"),
    }


def decode_figures(rows: Sequence[CaseRecord], kv: int, mha: int = 8, batch: int = 8) -> dict[str, Figure]:
    """Per-token decode latency (with cache, batch ``batch``) of ``kv`` KV heads vs MHA across the context
    sweep of the kv_cache suite.

    ``decode_latency_ratio``: at the largest context, the variant whose parameter count matches MHA's
    within 1% (its FFN widened, so weights read per step are equal and only the cache differs), with a
    bootstrap interval from the raw samples. ``speedup_starts_at``: the smallest context from which that
    ratio's whole interval stays below 1 at every larger context of the sweep (NaN: never).
    ``decode_latency_ratio_fewer_params``: the same at the largest context for the variant with fewer
    parameters (the confounded comparison), where the suite has that line."""
    def line(h: int) -> dict[int, CaseRecord]:
        return {r.value("seq_len"): r for r in select(rows, n_kv_heads=h, use_cache=True, batch_size=batch)}
    base = line(mha)
    p_mha = {n: r.metric("params") for n, r in base.items()}
    matched: dict[int, CaseRecord] = {}
    fewer: dict[int, CaseRecord] = {}
    for r in select(rows, n_kv_heads=kv, use_cache=True, batch_size=batch):
        n, p = r.value("seq_len"), r.metric("params")
        ref = p_mha.get(n)
        if ref and p is not None:
            (matched if abs(p / ref - 1) <= MATCH_TOL else fewer)[n] = r
    out: dict[str, Figure] = {}
    ratios = {n: median_ratio(matched[n], base[n], f"n={n}") for n in sorted(set(matched) & set(base))}
    if ratios:
        top = max(ratios)
        params = f"params {matched[top].metric('params'):,.0f} vs MHA {p_mha[top]:,.0f}"
        out["decode_latency_ratio"] = replace(
            ratios[top], note=f"per-token decode step, {kv} vs {mha} KV heads, b={batch}, n={top}, {params}")
        out["speedup_starts_at"] = speedup_start(ratios)
    else:
        why = f"no parameter-matched {kv}-KV-head line (within {MATCH_TOL:.0%} of MHA) at b={batch}"
        out["decode_latency_ratio"] = Figure(float("nan"), unit="×", note=why)
        out["speedup_starts_at"] = Figure(float("nan"), unit="tokens", note=why)
    shared = sorted(set(fewer) & set(base))
    if shared:
        top = shared[-1]
        out["decode_latency_ratio_fewer_params"] = median_ratio(
            fewer[top], base[top], f"{kv} vs {mha} KV heads, b={batch}, n={top}, params "
                                   f"{fewer[top].metric('params'):,.0f} vs MHA {p_mha[top]:,.0f} (not matched)")
    return out


def speedup_start(ratios: dict[int, Figure]) -> Figure:
    """The smallest context n of ``ratios`` (variant / MHA per context) from which every ratio's whole
    interval lies below 1; NaN when the largest context's does not. The note lists each ratio."""
    start = None
    for n in sorted(ratios, reverse=True):
        _, hi = ratios[n].bounds()
        if not hi < 1:
            break
        start = n
    listing = "; ".join(f"n={n}: {f.text()}" for n, f in sorted(ratios.items()))
    head = f"decode step faster than MHA (interval below 1) from n={start} on" if start is not None \
        else "no speed-up at the largest context"
    return Figure(float("nan") if start is None else float(start), unit="tokens", note=f"{head}; {listing}")


def _decode(ctx: Context, ev: Evidence, kv: int) -> None:
    run, rows = ctx.suite("kv_cache")
    ev.sources.append(run.id)
    ev.figures.update(decode_figures(rows, kv))
    if "decode_latency_ratio_fewer_params" not in ev.figures:
        ev.unavailable["decode_latency_ratio_fewer_params"] = (
            "the suite run has no unmatched (fewer-parameter) line at b=8 (the quick suite runs only the "
            "parameter-matched ones)")
    ev.chart = Chart("per-token decode latency (with cache)", "context length n", "ms",
                     {k: v for k, v in series(rows, "seq_len", "median_ms").items() if " cache" in k},
                     x_log=True, y_log=True)


def _quality(ctx: Context, ev: Evidence, variant: str) -> None:
    """Relative validation-loss increase and accuracy drop of ``variant`` vs MHA (kv_heads experiment)."""
    res = ctx.experiment("kv_heads")
    vs = res.get("variants", {})
    name = next((k for k in vs if k.upper().startswith(variant.upper())), None)
    mha = vs.get("MHA")
    if name and mha:
        v = vs[name]
        params = (f"params {v['params']:,} vs {mha['params']:,}: "
                  + ("matched within 1% (FFN widened)" if abs(v["params"] / mha["params"] - 1) <= MATCH_TOL
                     else "NOT matched"))
        ev.figures["rel_loss_increase"] = mean_ci([a / b - 1 for a, b in zip(v["val_loss"], mha["val_loss"])],
                                                  "share", f"{name} vs MHA validation loss − 1, per seed ({params})")
        ev.figures["rel_accuracy_drop"] = mean_ci([1 - a / b for a, b in zip(v["val_acc"], mha["val_acc"])],
                                                  "share", f"{name} vs MHA next-token accuracy ({params})")
    else:
        for f in ("rel_loss_increase", "rel_accuracy_drop"):
            ev.unavailable[f] = f"the kv_heads experiment has no {variant.upper()} or MHA result"
    ev.notes.append(res.get("data_description", ""))


KV_FIGURES = ("kv_ratio_held", "kv_ratio_held_prefill", "kv_ratio", "kv_formula_matches_cache", "decode_latency_ratio", "speedup_starts_at",
              "decode_latency_ratio_fewer_params", "rel_loss_increase", "rel_accuracy_drop", *gen.MQA_FIGURES)


def _kv_variant(ctx: Context, n_heads: int, kv: int, suite_kv: int, variant: str) -> Evidence:
    """Real cache bytes of ``kv`` of ``n_heads`` KV heads vs MHA (and the formula against them), decode
    latency of ``suite_kv`` KV heads vs MHA in the kv_cache suite, the small-LM quality of ``variant``, and the
    generation figures of ``suite_kv`` KV heads vs MHA (:mod:`claims.probes.generation`: cache bytes and TPOT of
    a real greedy generation)."""
    ev = Evidence()
    ev.figures.update(kv_figures(n_heads, kv))
    _decode(ctx, ev, suite_kv)
    _quality(ctx, ev, variant)
    ev.figures.update(gen.mqa_figures(gen.rows(ctx, ev), suite_kv))
    if "gen_tpot_ratio" not in ev.figures:
        ev.unavailable["gen_tpot_ratio"] = (f"the claims' generation suite has no prefill twin of the {suite_kv}-K/V-"
                                            "head line (its decode time is not separable)")
    return ev


@probe("mqa", figures=KV_FIGURES, reads=("suite kv_cache", "experiment kv_heads", "suite claims_generation"))
def mqa(ctx: Context) -> Evidence:
    return _kv_variant(ctx, 8, 1, 1, "mqa")


@probe("gqa", figures=KV_FIGURES, reads=("suite kv_cache", "experiment kv_heads", "suite claims_generation"))
def gqa(ctx: Context) -> Evidence:
    return _kv_variant(ctx, 32, 8, 2, "gqa")


def transformers_kv_values(arch: str, over: dict) -> int:
    """Values per token in transformers' own ``StaticCache`` of ``arch`` (an ``hf:`` name): one token prefilled
    into a one-position cache by the model built on fake tensors; the keys' and values' elements counted."""
    mode = new_fake_mode()
    model = materialize(resolve(arch, **over), Workload(), CPU, mode).eval()
    with mode:
        state = model.generation_state(1, 1)
        with torch.no_grad():
            model.prefill(torch.zeros(1, 1, dtype=torch.long), state)
    return sum(layer.keys.numel() + layer.values.numel() for layer in state.cache.layers)


@probe("kv_70b", figures=("doc_over_mha_70b", "doc_over_gqa_70b", "kv_values_gqa_70b_transformers"))
def kv_70b(ctx: Context) -> Evidence:
    """LLaMA-2 70B: 80 layers, d_model 8192, 64 query heads of 128, 8 KV heads (GQA). Values per token."""
    doc = 8192 * 64 * 2
    ev = Evidence()
    values = {}
    preset, over, _, _ = NAMED["llama2_70b"]
    for name, kv in (("MHA", 64), ("GQA-8", 8)):
        cfg = resolve(preset, **{**over, "n_kv_heads": kv}).config
        values[name] = kv_cache_bytes(cfg, 1, 1, 1)            # 1 byte per value → count of values
    ev.figures["doc_over_mha_70b"] = Figure(doc / values["MHA"], unit="×",
                                            note=f"document {doc:,} vs MHA 70B {values['MHA']:,} values/token")
    ev.figures["doc_over_gqa_70b"] = Figure(doc / values["GQA-8"], unit="×",
                                            note=f"document {doc:,} vs the real GQA-8 70B {values['GQA-8']:,} "
                                                 f"values/token ({values['GQA-8'] * 2 / 2**10:,.0f} KiB in fp16)")
    arch, over_hf = TRANSFORMERS_SAME["llama2_70b"]
    transformers_side(ev, "kv_values_gqa_70b_transformers", arch, over_hf, transformers_kv_values, "values/token",
                      f"side figure: transformers' StaticCache of LlamaForCausalLM with the 70B config, after one token "
                      f"(meta device; ours {values['GQA-8']:,})")
    ev.chart = Chart("KV cache per token, LLaMA-2 70B shape", "", "values per token (millions)", {
        "document: 8192×64×2": [("document", doc / 1e6, None, None)],
        "MHA (64 KV heads)": [("MHA", values["MHA"] / 1e6, None, None)],
        "GQA-8 (real 70B)": [("GQA-8", values["GQA-8"] / 1e6, None, None)]}, kind="bar")
    return ev


@probe("permutation", figures=("equivariance_error_none", "min_break_error"))
def permutation(ctx: Context) -> Evidence:
    """An encoder without positions is permutation-equivariant (its [CLS]-free mean pooling invariant);
    each position scheme breaks it."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 12))
    perm = torch.randperm(12)
    errors = {}
    for pos in ("none", "learned", "sinusoidal", "rope", "alibi"):
        torch.manual_seed(0)
        cfg = EncoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, positions=pos, pool="mean",
                            max_seq_len=64)
        enc = Encoder(cfg).eval()
        with torch.no_grad():
            h = enc.stack(enc.tok(tokens))                          # (B, T, d) per-token outputs
            hp = enc.stack(enc.tok(tokens[:, perm]))
        errors[pos] = float((h[:, perm] - hp).abs().max())
    ev = Evidence()
    ev.figures["equivariance_error_none"] = Figure(errors["none"], unit="max |Δ|",
                                                   note="f(permuted x) vs permuted f(x), no positions")
    broken = {k: v for k, v in errors.items() if k != "none"}
    ev.figures["min_break_error"] = Figure(min(broken.values()), unit="max |Δ|",
                                           note=", ".join(f"{k} {v:.2g}" for k, v in broken.items()))
    ev.chart = Chart("permutation: max |f(Px) − P f(x)|", "", "max |Δ| (log)",
                     {k: [(k, max(v, 1e-12), None, None)] for k, v in errors.items()}, kind="bar", y_log=True)
    return ev


@probe("sinusoidal", figures=("linear_map_residual", "loss_ratio_4x", "loss_ratio_2x"), reads=("experiment positions",))
def sinusoidal(ctx: Context) -> Evidence:
    ev = Evidence()
    pe = make_positions("sinusoidal", 64, 4096, 4).table(256, 0, torch.device("cpu"), torch.float64)  # (T, d)
    worst = 0.0
    for k in (1, 5, 17):
        a, b = pe[:-k], pe[k:]
        m = torch.linalg.lstsq(a, b).solution                     # PE(pos+k) ≈ PE(pos)·M_k
        worst = max(worst, float((a @ m - b).abs().max()))
    ev.figures["linear_map_residual"] = Figure(worst, unit="max |Δ|", note="least-squares map PE(pos)→PE(pos+k)")
    _extrapolation(ctx, ev, "sinusoidal")
    return ev


def _ratios(res: dict, scheme: str, key: str = "ratio_beyond_L_vs_1x") -> dict[str, list]:
    """Per multiple k (as str), per-seed loss(positions past L at k×L) / loss(1×L); 1× is 1 by definition."""
    by = res.get("schemes", {}).get(scheme, {}).get("by_multiple", {})
    return {k: (m.get(key) if m.get(key) is not None else m.get("ratio_vs_1x", [])) for k, m in by.items()}


def _extrapolation(ctx: Context, ev: Evidence, scheme: str) -> None:
    res = _positions(ctx, ev)
    for k, vals in _ratios(res, scheme).items():
        if k in ("2", "4", "8") and vals and all(v is not None for v in vals):
            ev.figures[f"loss_ratio_{k}x"] = mean_ci(vals, "×", f"{scheme}: loss past L at {k}×L / loss at 1×L")


def _positions(ctx: Context, ev: Evidence) -> dict:
    """The positions experiment's result; puts its chart (every scheme's loss ratio vs length) and its data
    description on ``ev``."""
    res = ctx.experiment("positions")
    ev.chart = mean_chart({s: _ratios(res, s) for s in res.get("schemes", {})},
                          "loss past the training length L / loss at 1×L", "evaluation length / L", "loss ratio",
                          x_log=True, y_log=True)
    ev.notes.append(res.get("data_description", ""))
    return res


@probe("learned", figures=("clear_error_past_max", "loss_past_max_unavailable"), reads=("experiment positions",))
def learned(ctx: Context) -> Evidence:
    model = Decoder(DecoderConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, positions="learned",
                                  max_seq_len=8)).eval()
    message = ""
    try:
        model(torch.zeros(1, 9, dtype=torch.long))
    except Exception as exc:  # noqa: BLE001
        message = f"{type(exc).__name__}: {exc}"
    ev = Evidence()
    ev.figures["clear_error_past_max"] = Figure("max_seq_len" in message or "max" in message.lower(),
                                                note=message or "no error raised")
    res = _positions(ctx, ev)
    by = res.get("schemes", {}).get("learned", {}).get("by_multiple", {})
    beyond = [v for k, m in by.items() if float(k) > 1 for v in (m.get("loss") or [None])]
    ev.figures["loss_past_max_unavailable"] = Figure(all(v is None or v != v for v in beyond),
                                                     note="learned-position LM evaluated past its table: "
                                                          + ("no loss (error recorded)" if all(
                                                              v is None or v != v for v in beyond) else "a loss"))
    return ev


@probe("alibi_rope", figures=("alibi_ratio_4x", "alibi_minus_best_other_4x", "rope_relative_error"),
       reads=("experiment positions",))
def alibi_rope(ctx: Context) -> Evidence:
    ev = Evidence()
    res = _positions(ctx, ev)
    get = lambda s: list(_ratios(res, s).get("4") or [])  # noqa: E731
    alibi = get("alibi")
    ev.figures["alibi_ratio_4x"] = mean_ci(alibi, "×", "ALiBi: loss at 4×L / 1×L")
    others = {s: get(s) for s in ("sinusoidal", "rope", "learned", "none") if get(s) and all(
        v == v and v is not None for v in get(s))}
    if alibi and others:
        best = min(others, key=lambda s: sum(others[s]) / len(others[s]))
        diffs = [a - b for a, b in zip(alibi, others[best])]
        ev.figures["alibi_minus_best_other_4x"] = mean_ci(diffs, "×", f"ALiBi − {best} (best other), per seed")
    # RoPE: q·k depends on the offset only — shift both positions by s and the score must not change
    pos = make_positions("rope", 64, 4096, 4)
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)
    worst = 0.0
    for m, n, s in ((3, 10, 100), (0, 7, 1000), (50, 20, 333)):
        def score(a: int, b: int) -> torch.Tensor:
            qa, _ = pos.rotate(q, q, a)
            _, kb = pos.rotate(k, k, b)
            return (qa * kb).sum(-1)
        worst = max(worst, float((score(m, n) - score(m + s, n + s)).abs().max()))
    ev.figures["rope_relative_error"] = Figure(worst, unit="max |Δ|", note="q·k at (m, n) vs (m+s, n+s)")
    return ev


GEN_LENGTHS = {True: (4, 16, 64), False: (16, 64, 256)}      # quick, full: tokens generated
GEN_REPEATS = 3                                              # rounds per process (claims.probes.PROCESSES of them)


def generation_model(quick: bool) -> Decoder:
    """The model C19 generates with: decoder-small (d = 512, h = 8), 2 layers under --quick; seeded, eval mode."""
    torch.manual_seed(0)
    return Decoder(resolve("decoder-small", **({"n_layers": 2} if quick else {})).config).eval()


def generation_times(model: Decoder, n: int, repeats: int = GEN_REPEATS, batch: int = 1
                     ) -> tuple[TimingResult, TimingResult]:
    """Time generating ``n`` tokens one at a time — the generation loop (:class:`harness.engine.generation.Generation`:
    its static KV cache, a one-token prompt, then n - 1 decode steps, each token the greedy choice of the step
    before) — against ONE parallel forward over ``n`` tokens (a prefill), side by side in ``repeats`` rounds of
    one call each (:func:`harness.instruments.timing.measure_interleaved`: a cold call and a warm-up call of each
    first, a fresh random order per round). Returns (decode, prefill)."""
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, n), generator=torch.Generator().manual_seed(0))
    decode = Generation(model, tokens[:, :1], n)                 # n single-token forwards, each on the last one's output

    def prefill() -> None:
        with torch.no_grad():
            model(tokens)                                                # (B, n, vocab) in one pass

    config = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=repeats, min_time_s=0.0, max_time_s=600.0,
                          min_sample_s=0.0, rounds=repeats)
    dec, pre = measure_interleaved([decode, prefill], config)
    for r in (dec, pre):
        if isinstance(r, BaseException):
            raise r
    return dec, pre                                                      # type: ignore[return-value]


Times = dict[int, tuple[TimingResult, TimingResult]]      # generated length n -> (decode, prefill)


def generation_times_in_process(quick: bool, threads: int, lengths: tuple[int, ...]) -> Times:
    """One fresh process's share of C19's timing (:func:`claims.probes.in_processes`): the model built, each
    length's (decode, prefill) timed at ``threads`` threads."""
    torch.set_num_threads(threads)
    model = generation_model(quick)
    return {n: generation_times(model, n) for n in lengths}


def sequential_figures(times: Times | Sequence[Times]) -> dict[str, Figure]:
    """From (decode, prefill) timings per generated length n — of one process, or one such table per fresh
    process: ``decode_over_prefill``, time to decode the largest n one token at a time / one parallel forward over
    it (paired; its interval over the processes when there are several), and ``decode_over_prefill_exp``, the
    log-log slope of that ratio vs n with its t-interval, fitted over each process's ratio at each n (over each
    round's, with one process)."""
    per_process = [times] if isinstance(times, dict) else list(times)
    top = max(per_process[0])
    ratios = [{n: paired_ratio(d.samples_s, d.rounds, p.samples_s, p.rounds) for n, (d, p) in t.items()}
              for t in per_process]
    several = len(per_process) > 1
    pts = [(float(n), r) for pr in ratios for n, x in pr.items() for r in ([x.ratio] if several else x.per_round)]
    fit = fit_loglog([x for x, _ in pts], [y for _, y in pts])
    medians = "; ".join(", ".join(f"n={n}: {x.ratio:.3g}×" for n, x in sorted(pr.items())) for pr in ratios)
    over = f"each of {len(per_process)} processes' ratio per n" if several else "each round's ratio"
    return {
        "decode_over_prefill": timed_ratio([t[top][0] for t in per_process], [t[top][1] for t in per_process],
                                           f"{top} cached single-token steps / one forward over {top} tokens"),
        "decode_over_prefill_exp": (Figure(float("nan"), note="fewer than 2 lengths") if fit is None else
                                    Figure(fit.exponent, fit.ci_low, fit.ci_high, "",
                                           f"log-log slope of the ratio vs n, fitted over {over} ({medians})",
                                           fit.n, processes=len(per_process))),
    }


def batch_gain(rows: Sequence[CaseRecord]) -> Figure:
    """Tokens/s at batch 8 / batch 1 of MHA with the cache at the shortest context of the kv_cache run
    (where a step reads mostly weights; longer contexts read mostly the cache, which grows with the batch);
    the note lists every context's gain. NaN when no context has both batches."""
    gains = {}
    for m in sorted({r.value("seq_len") for r in select(rows)}):
        b1, b8 = (next(iter(select(rows, seq_len=m, n_kv_heads=8, d_ff=None, use_cache=True, batch_size=b)), None)
                  for b in (1, 8))
        if b1 and b8 and b1.metric("throughput_per_s") and b8.metric("throughput_per_s"):
            gains[m] = b8.metric("throughput_per_s") / b1.metric("throughput_per_s")
    if not gains:
        return Figure(float("nan"), unit="×", note="the kv_cache run lacks MHA cached b=1 and b=8 at one context")
    m = min(gains)
    return Figure(gains[m], unit="×", note=f"tokens/s at batch 8 / batch 1, MHA with cache, at the shortest context "
                                           f"n={m}: " + ", ".join(f"n={k}: {g:.2f}×" for k, g in gains.items()))


@probe("sequential", figures=("decode_over_prefill", "decode_over_prefill_exp", "no_cache_over_cache",
                              "batch_throughput_gain", *gen.SEQ_FIGURES),
       reads=("suite kv_cache", "suite claims_generation"))
def sequential(ctx: Context) -> Evidence:
    """Generation timed for real (the kv_cache suite's model, decoder-small; 2 layers under --quick):
    n tokens one at a time vs one parallel forward over n; and the kv_cache suite's per-token costs."""
    lengths = GEN_LENGTHS[ctx.quick]
    ev = Evidence()
    with LoadMonitor() as monitor:                      # a busy machine's timings decide nothing (--force)
        times = in_processes(generation_times_in_process, ctx.quick, ctx.threads, lengths)
    busy = monitor.result.reason() if monitor.result else ""
    ev.figures.update({k: replace(f, busy=busy) if k.startswith("decode_over_prefill") else f
                       for k, f in sequential_figures(times).items()})
    ev.notes.append(f"generation timed in {len(times)} fresh processes of {ctx.threads} threads, {GEN_REPEATS} "
                    f"rounds each: decoder-small (d=512, h=8, {2 if ctx.quick else 'all its'} layers), batch 1, "
                    f"n = {', '.join(map(str, lengths))}")
    run, rows = ctx.suite("kv_cache")
    ev.sources.append(run.id)
    n = max(r.value("seq_len") for r in select(rows))
    one = lambda **c: next(iter(select(rows, seq_len=n, n_kv_heads=8, d_ff=None, **c)), None)  # noqa: E731
    ev.figures["no_cache_over_cache"] = median_ratio(one(use_cache=False, batch_size=1),
                                                     one(use_cache=True, batch_size=1),
                                                     f"per-token latency without / with cache, n={n}, b=1")
    ev.figures["batch_throughput_gain"] = batch_gain(rows)
    ev.figures["gen_batch_decode_gain"] = gen.batch_gain(gen.rows(ctx, ev))
    ev.chart = Chart("per-token decode latency", "context length n", "ms",
                     series(rows, "seq_len", "median_ms"), x_log=True, y_log=True)
    return ev
