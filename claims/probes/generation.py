"""Generation figures for the KV-cache, GQA/MQA, sequential-decoding and SSM claims.

The probes of those claims (``mqa``, ``gqa`` in :mod:`claims.probes.variants`, ``sequential`` there too,
``ssm_long`` in :mod:`claims.probes.ssm`) add these figures, read from :data:`SUITE`: real greedy generations
(``mode = "generate"``, :mod:`harness.engine.generation`) with a static KV cache or Mamba's constant state, every case
timed side by side in the same rounds.

* Bytes are the generation state's real bytes (``kv_cache_bytes``: the preallocated k/v buffers, or Mamba's state),
  exact, no interval.
* Decode times: a case's record has ``tpot_ms`` as a median only, and its samples are whole generations (prefill +
  decode). Each compared generation therefore has a "prefill" twin, the same model and prompt with
  ``new_tokens = 1``; round by round, the generation's median minus its twin's is the time of its decode steps
  (:func:`decode_per_step`). A ratio of two such per-round decode times has an interval over rounds
  (:func:`decode_ratio`) in which the prefill and the machine's drift cancel.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from claims.evidence import Context
from claims.model import Evidence, Figure, mean_ci
from claims.probes import busy_reason, interleaved, select
from harness.contract.records import CaseRecord
from harness.analysis.stats import round_medians

SUITE = str(Path(__file__).resolve().parent.parent / "generation.toml")
"""The claims' generation suite: MHA, GQA-2, MQA (parameter-matched) and Mamba, prompts 32 and 256, b = 1 and 8."""
ATTN, SSM = "decoder-small", "mamba-lm-small"
LONG, SHORT = 256, 32                      # the suite's prompt lengths
BATCH = 8                                  # the batched MHA line (prompt SHORT)
THREADS = 1
"""The suite's cases run on one thread, whatever ``bench claims --threads`` says (as the generation suite's [quick]):
a decode step is many small ops, and two threads on a machine other jobs load make each op wait for a descheduled
thread (measured here on 2 loaded cores: a 2-layer decode step took ~45 ms on 2 threads, ~7 ms on 1)."""

MQA_FIGURES = ("gen_kv_bytes_ratio", "gen_tpot_ratio")
GQA_FIGURES = ("gen_kv_bytes_ratio",)
SEQ_FIGURES = ("gen_batch_decode_gain",)
SSM_FIGURES = ("gen_state_bytes_ratio", "gen_tpot_ratio_ssm")


def case(rows: Sequence[CaseRecord], arch: str, prompt_len: int, prefill: bool = False, batch: int = 1,
         **conds: Any) -> CaseRecord | None:
    """The ok generation case of ``arch`` at this prompt and batch (its prefill twin, ``new_tokens = 1``, when
    ``prefill``; else one with decode steps), or None."""
    hits = [r for r in select(rows, arch=arch, mode="generate", prompt_len=prompt_len, batch_size=batch, **conds)
            if (r.value("new_tokens") == 1) == prefill]
    return hits[0] if hits else None


def decode_per_step(gen: CaseRecord, pre: CaseRecord) -> list[float | None]:
    """Per round, the seconds of one decode step of ``gen``: (its round median − its prefill twin's) /
    (new_tokens − 1); None for a round where the difference is not positive (noise larger than the decode)."""
    steps = int(gen.value("new_tokens")) - int(pre.value("new_tokens"))
    if steps < 1:
        raise ValueError("the generation must have more new tokens than its prefill twin")
    out: list[float | None] = []
    for g, p in zip(round_medians(gen.samples_s, gen.rounds), round_medians(pre.samples_s, pre.rounds)):
        out.append((g - p) / steps if g > p else None)
    return out


def decode_ratio(a: tuple[CaseRecord | None, CaseRecord | None], b: tuple[CaseRecord | None, CaseRecord | None],
                 what: str, scale: float = 1.0) -> Figure:
    """``scale`` × a's decode time per step / b's, each a (generation, prefill twin) pair, round by round: the
    geometric mean of the per-round ratios with a Student-t interval on their logs. All four cases must have been
    timed side by side in the same rounds; NaN (with the reason) otherwise or with fewer than 2 usable rounds."""
    cases = [*a, *b]
    if any(c is None or not c.samples_s for c in cases):
        return Figure(float("nan"), unit="×", note=f"{what}: missing a generation case or its prefill twin")
    if not all(interleaved(cases[0], c) for c in cases[1:]):     # type: ignore[arg-type]
        return Figure(float("nan"), unit="×", note=f"{what}: the four cases were not timed side by side in the "
                                                   "same rounds")
    da, db = decode_per_step(*a), decode_per_step(*b)          # type: ignore[arg-type]
    per = [scale * x / y for x, y in zip(da, db) if x is not None and y is not None]
    dropped = len(da) - len(per)
    if len(per) < 2:
        return Figure(float("nan"), unit="×", note=f"{what}: fewer than 2 rounds with a positive decode time "
                                                   f"on both sides ({dropped} of {len(da)} dropped)")
    logs = mean_ci([math.log(x) for x in per])
    lo = None if logs.lo is None else math.exp(logs.lo)
    hi = None if logs.hi is None else math.exp(logs.hi)
    tpot = lambda c: c.metric("tpot_ms")  # noqa: E731
    medians = f"record TPOT medians {tpot(a[0]) or float('nan'):.3g} vs {tpot(b[0]) or float('nan'):.3g} ms"
    drop = f"; {dropped} round(s) dropped (decode time not positive)" if dropped else ""
    return Figure(math.exp(logs.value), lo, hi, "×",
                  f"{what}: decode time per step = (generation − its prefill twin) / (new_tokens − 1), round by "
                  f"round, geometric mean over {len(per)} rounds with a t-interval ({medians}){drop}",
                  len(per), busy=busy_reason(cases))


def bytes_ratio(a: CaseRecord | None, b: CaseRecord | None, what: str) -> Figure:
    """a's generation-state bytes / b's (exact: the state's real buffers)."""
    x, y = (None if c is None else c.metric("kv_cache_bytes") for c in (a, b))
    if not x or not y:
        return Figure(float("nan"), unit="×", note=f"{what}: missing a case or its kv_cache_bytes")
    return Figure(x / y, unit="×", note=f"{what}: {x:,.0f} B / {y:,.0f} B")


def mqa_figures(rows: Sequence[CaseRecord], kv: int, mha: int = 8) -> dict[str, Figure]:
    """``gen_kv_bytes_ratio``: the static KV cache of ``kv`` K/V heads / MHA's after the same real generation
    (b = 1, prompt LONG); ``gen_tpot_ratio``: the decode step of the parameter-matched ``kv`` line / MHA's at
    that context (only where the suite has the variant's prefill twin)."""
    var = case(rows, ATTN, LONG, n_kv_heads=kv)
    base = case(rows, ATTN, LONG, n_kv_heads=mha)
    ctx_len = f"b=1, prompt {LONG}"
    out = {"gen_kv_bytes_ratio": bytes_ratio(var, base, f"{kv} vs {mha} K/V heads, static KV cache of a real "
                                                       f"generation, {ctx_len}")}
    if case(rows, ATTN, LONG, prefill=True, n_kv_heads=kv) is not None:
        out["gen_tpot_ratio"] = decode_ratio(
            (var, case(rows, ATTN, LONG, prefill=True, n_kv_heads=kv)),
            (base, case(rows, ATTN, LONG, prefill=True, n_kv_heads=mha)),
            f"TPOT {kv} / {mha} K/V heads (params matched), {ctx_len}")
    return out


def batch_gain(rows: Sequence[CaseRecord]) -> Figure:
    """``gen_batch_decode_gain``: MHA's decode tokens/s at batch BATCH / batch 1 (prompt SHORT) = BATCH × the
    per-step time at b = 1 / at b = BATCH, round by round."""
    one = (case(rows, ATTN, SHORT, n_kv_heads=8), case(rows, ATTN, SHORT, prefill=True, n_kv_heads=8))
    many = (case(rows, ATTN, SHORT, batch=BATCH, n_kv_heads=8),
            case(rows, ATTN, SHORT, prefill=True, batch=BATCH, n_kv_heads=8))
    return decode_ratio(one, many, f"decode tokens/s of MHA at b={BATCH} / b=1, prompt {SHORT}", scale=BATCH)


def ssm_figures(rows: Sequence[CaseRecord]) -> dict[str, Figure]:
    """``gen_state_bytes_ratio``: Mamba's generation state at prompt LONG / at SHORT (the note gives MHA's KV
    cache's ratio beside it); ``gen_tpot_ratio_ssm``: Mamba's decode step at context LONG / at SHORT."""
    kv = bytes_ratio(case(rows, ATTN, LONG, n_kv_heads=8), case(rows, ATTN, SHORT, n_kv_heads=8), "MHA's KV cache")
    state = bytes_ratio(case(rows, SSM, LONG), case(rows, SSM, SHORT),
                        f"Mamba's state, prompt {LONG} / {SHORT}, b=1")
    return {
        "gen_state_bytes_ratio": Figure(state.value, unit="×", note=f"{state.note}; beside it {kv.note} "
                                                                    f"({kv.value:.3g}×)"),
        "gen_tpot_ratio_ssm": decode_ratio((case(rows, SSM, LONG), case(rows, SSM, LONG, prefill=True)),
                                           (case(rows, SSM, SHORT), case(rows, SSM, SHORT, prefill=True)),
                                           f"Mamba TPOT, prompt {LONG} / {SHORT}, b=1"),
    }


def rows(ctx: Context, ev: Evidence) -> list[CaseRecord]:
    """The records of :data:`SUITE` (measured once per context, or reused from the store); its run becomes one of
    ``ev``'s sources."""
    run, records = ctx.suite(SUITE, {"threads": THREADS})
    ev.sources.append(run.id)
    return records
