"""State-space models: what SSMs buy on long sequences (the ssm_vs_attention suite's exponents, the
decode step's cost against a KV cache) and what they pay in in-context recall (the recall and ssm_lm
experiments)."""
from __future__ import annotations

from collections.abc import Sequence


from claims.evidence import Context
from claims.model import Chart, Evidence, Figure, mean_ci
from claims.probes import generation as gen
from claims.probes import exponent, local_slope, mean_chart, median_ratio, probe, select, series
from claims.power import exact_interval, ratio_resolution
from harness.contract.records import CaseRecord

SUITE = "ssm_vs_attention"
DECODE_SUITE = "kv_cache"                  # where the attention decode lines are when the SSM suite has none
EXACT = {"exact_eager": "eager", "exact_sdpa": "sdpa"}
SSM_ARCHS = {"s4d": ("s4d-small", "s4d-lm-small"), "mamba": ("mamba-small", "mamba-lm-small")}   # either preset
ATTN_DECODE, SSM_DECODE = "decode-step-small", "ssm-decode-step-small"
SSM_VARIANTS = ("s4d", "mamba")

LONG_FIGURES = (tuple(f"{m}_exp_{k}" for k in (*EXACT, *SSM_ARCHS) for m in ("latency", "memory"))
                + tuple(f"macs_exp_{k}" for k in ("exact", *SSM_ARCHS))
                + ("latency_saving_vs_sdpa", "memory_saving_vs_sdpa")
                + tuple(f"{m}_saving_vs_sdpa_{k}" for k in SSM_ARCHS for m in ("latency", "memory"))
                + tuple(f"power_latency_saving_vs_sdpa_{k}" for k in SSM_ARCHS)
                + ("decode_exp_ssm", "decode_exp_attention",
                   "decode_speedup", "state_bytes_exp", "kv_bytes_exp", *gen.SSM_FIGURES))
RECALL_FIGURES = (("recall_acc_attention",) + tuple(f"recall_acc_{k}" for k in SSM_VARIANTS)
                  + tuple(f"recall_gap_{k}" for k in SSM_VARIANTS)
                  + tuple(f"recall_gap_growth_{k}" for k in SSM_VARIANTS)
                  + tuple(f"lm_rel_loss_{k}" for k in SSM_VARIANTS))


# -- C40: long sequences --------------------------------------------------------------------------
def long_lines(rows: Sequence[CaseRecord]) -> dict[str, list[CaseRecord]]:
    """The full-sequence forward lines: exact attention eager/SDPA and each SSM."""
    lines = {k: select(rows, arch="lra-exact", attn_impl=impl) for k, impl in EXACT.items()}
    lines.update({k: [r for a in archs for r in select(rows, arch=a)] for k, archs in SSM_ARCHS.items()})
    return lines


def long_figures(lines: dict[str, Sequence[CaseRecord]]) -> dict[str, Figure]:
    """Latency and memory exponents vs n of every line, MAC exponents (slope between the two largest n of exact
    counts), and at the longest n that exact SDPA and an SSM both reached, SDPA's latency and activation memory
    over the faster / leaner SSM's."""
    out: dict[str, Figure] = {}
    for k, line in lines.items():
        out[f"latency_exp_{k}"] = exponent(line, "seq_len", "median_ms")
        out[f"memory_exp_{k}"] = exponent(line, "seq_len", "activation_peak_bytes")
    out["macs_exp_exact"] = local_slope(lines["exact_sdpa"] or lines["exact_eager"], "seq_len", "macs")
    for k in SSM_ARCHS:
        out[f"macs_exp_{k}"] = local_slope(lines[k], "seq_len", "macs")
    sdpa = {r.value("seq_len"): r for r in lines["exact_sdpa"]}
    ssm = {(k, r.value("seq_len")): r for k in SSM_ARCHS for r in lines[k]}
    common = sorted({n for (_, n) in ssm} & set(sdpa))
    if not common:
        why = "no sequence length measured for both exact SDPA and an SSM"
        for key in ("latency_saving_vs_sdpa", "memory_saving_vs_sdpa",
                    *(f"{m}_saving_vs_sdpa_{k}" for k in SSM_ARCHS for m in ("latency", "memory"))):
            out[key] = Figure(float("nan"), unit="×", note=why)
        return out
    n = common[-1]
    here = {k: ssm[(k, n)] for k in SSM_ARCHS if (k, n) in ssm}
    out.update(per_ssm_savings(sdpa[n], here, n))
    fast = min(here, key=lambda k: here[k].metric("median_ms") or float("inf"))
    out["latency_saving_vs_sdpa"] = median_ratio(sdpa[n], here[fast], f"exact SDPA / {fast} forward latency, n={n}")
    lean = min(here, key=lambda k: here[k].metric("activation_peak_bytes") or float("inf"))
    a, b = sdpa[n].metric("activation_peak_bytes"), here[lean].metric("activation_peak_bytes")
    out["memory_saving_vs_sdpa"] = (Figure(a / b, unit="×", note=f"exact SDPA / {lean} activation peak, n={n}: "
                                                                   f"{a / 2**20:,.1f} vs {b / 2**20:,.1f} MiB")
                                    if a and b else Figure(float("nan"), unit="×", note=f"no memory at n={n}"))
    return out


def per_ssm_savings(sdpa: CaseRecord, here: dict[str, CaseRecord], n: int) -> dict[str, Figure]:
    """Each SSM against exact SDPA at the same n (the longest both reached): SDPA's median latency over the
    SSM's (paired rounds when timed side by side, else the medians' ratio with a bootstrap interval) and SDPA's
    activation peak over the SSM's (one allocation pass each: no interval; the tracker counts every live byte,
    so a ratio that differs from 1 by more than a tensor's rounding is seen). Above 1: the SSM is cheaper."""
    out: dict[str, Figure] = {}
    for k in SSM_ARCHS:
        rec = here.get(k)
        if rec is None:
            why = f"{k} has no ok record at n={n}, the longest n exact SDPA reached"
            out[f"latency_saving_vs_sdpa_{k}"] = Figure(float("nan"), unit="×", note=why)
            out[f"memory_saving_vs_sdpa_{k}"] = Figure(float("nan"), unit="×", note=why)
            continue
        out[f"latency_saving_vs_sdpa_{k}"] = median_ratio(sdpa, rec, f"exact SDPA / {k} forward latency, n={n}")
        out[f"power_latency_saving_vs_sdpa_{k}"] = ratio_resolution(out[f"latency_saving_vs_sdpa_{k}"],
                                                                    f"{k}'s latency rule")
        a, b = sdpa.metric("activation_peak_bytes"), rec.metric("activation_peak_bytes")
        out[f"memory_saving_vs_sdpa_{k}"] = (
            Figure(a / b, unit="×", note=f"exact SDPA / {k} forward activation peak, n={n}: {a / 2**20:,.1f} vs "
                                         f"{b / 2**20:,.1f} MiB (one measured pass each, no interval)")
            if a and b else Figure(float("nan"), unit="×", note=f"no activation peak for SDPA or {k} at n={n}"))
    return out


def decode_lines(ssm_rows: Sequence[CaseRecord], attn_rows: Sequence[CaseRecord], kind: str = "mamba") -> tuple[
        list[CaseRecord], list[CaseRecord], int | None]:
    """(SSM decode steps of ``kind``, attention decode steps with the cache, the batch): at the largest batch both
    have, attention's MHA line (all K/V heads, the default FFN)."""
    ssm = [r for r in select(ssm_rows, arch=SSM_DECODE) if r.value("kind") in (None, kind)]
    att = [r for r in select(attn_rows, arch=ATTN_DECODE, use_cache=True)
           if r.value("n_kv_heads") in (None, 8) and r.value("d_ff") is None]
    batches = {r.value("batch_size") for r in ssm} & {r.value("batch_size") for r in att}
    if not batches:
        return [], [], None
    b = max(batches)
    return ([r for r in ssm if r.value("batch_size") == b], [r for r in att if r.value("batch_size") == b], b)


def decode_figures(ssm: Sequence[CaseRecord], att: Sequence[CaseRecord], batch: int | None) -> dict[str, Figure]:
    """Per-token decode latency exponent vs context for the SSM step and attention's cached step, attention over
    SSM at the largest common context, and the slopes of the state's and the KV cache's bytes vs context."""
    if batch is None:
        why = "no batch size with both an SSM and an attention decode line"
        return {k: Figure(float("nan"), note=why) for k in ("decode_exp_ssm", "decode_exp_attention",
                                                          "decode_speedup", "state_bytes_exp", "kv_bytes_exp")}
    out = {"decode_exp_ssm": exponent(ssm, "seq_len", "median_ms"),
           "decode_exp_attention": exponent(att, "seq_len", "median_ms"),
           "state_bytes_exp": local_slope(ssm, "seq_len", "analytic_state_bytes"),
           "kv_bytes_exp": local_slope(att, "seq_len", "analytic_kv_cache_bytes")}
    s, a = {r.value("seq_len"): r for r in ssm}, {r.value("seq_len"): r for r in att}
    common = sorted(set(s) & set(a))
    out["decode_speedup"] = (median_ratio(a[common[-1]], s[common[-1]],
                                          f"attention (KV cache) / SSM per-token decode step, b={batch}, "
                                          f"context n={common[-1]}")
                             if common else Figure(float("nan"), unit="×", note="no common context length"))
    return out


@probe("ssm_long", figures=LONG_FIGURES, reads=("suite ssm_vs_attention", "suite kv_cache", "suite claims_generation"))
def ssm_long(ctx: Context) -> Evidence:
    run, rows = ctx.suite(SUITE)
    ev = Evidence(sources=[run.id])
    ev.figures.update(long_figures(long_lines(rows)))
    attn_rows = rows
    if not select(rows, arch=ATTN_DECODE):
        kv_run, attn_rows = ctx.suite(DECODE_SUITE)
        ev.sources.append(kv_run.id)
    ev.figures.update(decode_figures(*decode_lines(rows, attn_rows)))
    ev.figures.update(gen.ssm_figures(gen.rows(ctx, ev)))          # a real generation: state bytes, TPOT vs context
    ev.chart = Chart("SSMs vs exact attention: forward latency vs n", "sequence length n", "ms",
                     series([r for line in long_lines(rows).values() for r in line], "seq_len", "median_ms"),
                     x_log=True, y_log=True)
    return ev


# -- C41: in-context recall, and LM quality beside it ----------------------------------------------
# Accuracies are proportions of held-out items answered right: bounded in [0, 1], decided with an exact binomial
# (Clopper–Pearson) interval over the evaluation items, never a Student-t over a few seeds (which leaves [0, 1]).
def correct_counts(accs: Sequence[float], items: int) -> list[int]:
    """Per seed, the number of held-out items answered right (``acc × items``, an integer up to rounding); a
    ValueError when it is not one (the items per seed are not what the experiment evaluated)."""
    ks = [int(round(a * items)) for a in accs]
    if any(abs(a * items - k) > 0.01 or not 0 <= k <= items for a, k in zip(accs, ks)):
        raise ValueError(f"accuracies {list(accs)} are not counts out of {items} held-out items")
    return ks


def _per_seed(accs: Sequence[float], items: int) -> str:
    """Each seed's accuracy with its own exact 95% interval over its ``items`` items."""
    parts = []
    for k in correct_counts(accs, items):
        lo, hi = exact_interval(k, items)
        parts.append(f"{k / items:.3f} [{lo:.3f}, {hi:.3f}]")
    return ", ".join(parts)


def pooled_accuracy(accs: Sequence[float], items: int, what: str) -> Figure:
    """Accuracy pooled over the seeds' held-out items (``items`` per seed), with its exact binomial 95% interval;
    the note gives each seed's accuracy with its own exact interval (seeds that disagree beyond the items' noise
    show there: the pooled interval covers the items, not the choice of seed)."""
    ks = correct_counts(accs, items)
    k, n = sum(ks), items * len(ks)
    lo, hi = exact_interval(k, n)
    return Figure(k / n, lo, hi, "acc", f"{what}: {k} of {n} held-out items right over {len(ks)} seeds, exact "
                                        f"binomial (Clopper–Pearson) 95% interval; per seed {_per_seed(accs, items)}",
                  n=n)


def pooled_difference(plus: Sequence[Sequence[float]], minus: Sequence[Sequence[float]], items: Sequence[int],
                      what: str) -> Figure:
    """Σ pooled accuracies of ``plus`` − Σ those of ``minus`` (each a list of per-seed accuracies over ``items``
    items per seed, in the same order), with a 95% interval from the proportions' exact intervals at
    1 − 0.05/m each (m proportions, Bonferroni: their joint coverage is at least 95%), taken at their ends."""
    groups = [(a, n, +1) for a, n in zip(plus, items[:len(plus)])] + [(a, n, -1) for a, n in zip(minus, items[len(plus):])]
    level = 1 - 0.05 / len(groups)
    value = lo = hi = 0.0
    for accs, n_items, sign in groups:
        ks = correct_counts(accs, n_items)
        k, n = sum(ks), n_items * len(ks)
        p_lo, p_hi = exact_interval(k, n, level)
        value += sign * k / n
        lo += sign * (p_lo if sign > 0 else p_hi)
        hi += sign * (p_hi if sign > 0 else p_lo)
    return Figure(value, lo, hi, "acc", f"{what}; pooled over the seeds' held-out items, each accuracy's exact "
                                        f"binomial interval at {level:.4g} (Bonferroni over {len(groups)}: joint ≥ 95%)",
                  n=sum(n * len(a) for a, n, _ in groups))


def recall_figures(recall: dict, lm: dict | None) -> dict[str, Figure]:
    """From the recall experiment: attention's and each SSM's held-out accuracy at the largest number of pairs
    (pooled over seeds, exact binomial interval over the items), attention − SSM there (an exact-interval
    difference), and that gap at the largest minus the smallest number of pairs (its growth with P). From
    ssm_lm: the SSM's validation loss relative to the parameter-matched decoder, per seed (Student-t)."""
    pairs = [str(p) for p in recall["task"]["pairs"]]
    top, low = pairs[-1], pairs[0]
    v = recall["variants"]
    chance = recall["task"].get("chance_acc")
    eval_n = int(recall["setup"]["eval_n"])                        # held-out sequences per number of pairs
    items = {p: eval_n * int(p) for p in pairs}                    # one answer per query position: P per sequence
    acc = {name: {p: v[name]["by_pairs"][p]["acc"] for p in pairs} for name in v}
    out = {"recall_acc_attention": pooled_accuracy(acc["attention"][top], items[top],
                                                   f"attention, P={top} pairs (chance {chance:.3g})")}
    for k in SSM_VARIANTS:
        if k not in v:
            continue
        out[f"recall_acc_{k}"] = pooled_accuracy(acc[k][top], items[top], f"{k}, P={top} pairs")
        out[f"recall_gap_{k}"] = pooled_difference([acc["attention"][top]], [acc[k][top]], [items[top]] * 2,
                                                   f"attention − {k} accuracy, P={top} pairs")
        out[f"recall_gap_growth_{k}"] = pooled_difference(
            [acc["attention"][top], acc[k][low]], [acc[k][top], acc["attention"][low]],
            [items[top], items[low], items[top], items[low]],
            f"(attention − {k}) at P={top} minus at P={low}")
    for k in SSM_VARIANTS:
        if lm and k in lm.get("variants", {}):
            lv = lm["variants"][k]
            out[f"lm_rel_loss_{k}"] = mean_ci(lv["rel_loss_vs_attention"], "×",
                                              f"{k} validation loss / decoder's − 1 per seed, params "
                                              f"{lv['params']:,} vs {lm['variants']['attention']['params']:,}")
    return out


@probe("ssm_recall", figures=RECALL_FIGURES, reads=("experiment recall", "experiment ssm_lm"))
def ssm_recall(ctx: Context) -> Evidence:
    ev = Evidence(sources=["experiment recall", "experiment ssm_lm"])
    recall = ctx.experiment("recall")
    lm = ctx.experiment("ssm_lm")
    ev.figures.update(recall_figures(recall, lm))
    for f in RECALL_FIGURES:
        if f not in ev.figures:
            trained = ", ".join(recall["variants"])
            ev.unavailable[f] = (f"this run trained {trained} only (--quick leaves S4D out: the full run trains it)"
                                 if recall["setup"].get("ssms") != ["s4d", "mamba"] else
                                 "the experiment has no such variant")
    ev.notes += [recall.get("data_description", ""), lm.get("data_description", "")]
    acc = {name: {p: m["acc"] for p, m in v["by_pairs"].items()} for name, v in recall["variants"].items()}
    ev.chart = mean_chart(acc, "associative recall: held-out accuracy vs number of pairs", "key-value pairs P",
                          "accuracy")
    return ev
