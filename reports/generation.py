"""What a run of generation cases shows (mode "generate", :mod:`harness.engine.generation`), from stored records only:

* per line, the **linear** slope of TTFT against the prompt length (µs per prompt token) and of TPOT against the
  context a step reads (prompt_len + new_tokens / 2, the mean over the steps; µs per context token), by least
  squares with an intercept (the fixed cost: weights, launches);
* **tokens/s against batch**: cases that differ only in ``batch_size`` (same architecture, overrides, dtype,
  compile, prompt and new tokens) side by side, with the knee — the first batch whose TPOT is more than
  :data:`KNEE_TPOT_RATIO` × that of the smallest batch: below it a step costs about the same whatever the batch
  (it is bound by reading the weights), from it on the step grows with the batch (compute- or cache-bound);
* the bandwidth bound and the prefill's % of compute peak per case (:func:`reports.frames.generation_rates`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.analysis.fits import fit_line
from harness.contract.records import CaseRecord
from reports.frames import generation_rates

KNEE_TPOT_RATIO = 1.5


@dataclass(frozen=True)
class LineSlopes:
    line: str
    n: int
    ttft_us_per_token: float | None
    ttft_intercept_ms: float | None
    tpot_us_per_token: float | None
    tpot_intercept_ms: float | None


@dataclass(frozen=True)
class BatchSeries:
    """Cases differing only in batch size: (batch, decode tokens/s, TPOT ms) by batch, and the knee (or None)."""

    label: str
    points: tuple[tuple[int, float, float], ...]
    knee: int | None
    case_keys: tuple[str, ...] = ()


def is_generation(r: CaseRecord) -> bool:
    return r.workload.get("mode") == "generate"


def _linear(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) (:func:`harness.analysis.fits.fit_line`); None with fewer than 2 distinct x."""
    fit = fit_line(xs, ys)
    return (fit.slope, fit.intercept) if fit is not None else None


def line_slopes(records: Sequence[CaseRecord]) -> list[LineSlopes]:
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        if r.ok and is_generation(r) and r.metric("ttft_ms") is not None:
            by_line.setdefault(r.line, []).append(r)
    out = []
    for line, recs in by_line.items():
        prompts = [float(r.workload["prompt_len"]) for r in recs]
        ttft = _linear(prompts, [r.metric("ttft_ms") for r in recs])
        with_tpot = [r for r in recs if r.metric("tpot_ms") is not None]
        ctx = [r.workload["prompt_len"] + r.workload["new_tokens"] / 2 for r in with_tpot]
        tpot = _linear(ctx, [r.metric("tpot_ms") for r in with_tpot])
        out.append(LineSlopes(line, len(recs), ttft[0] * 1e3 if ttft else None, ttft[1] if ttft else None,
                              tpot[0] * 1e3 if tpot else None, tpot[1] if tpot else None))
    return out


def _batch_key(r: CaseRecord) -> tuple:
    w = {k: v for k, v in r.workload.items() if k != "batch_size"}
    return r.arch, tuple(sorted((k, repr(v)) for k, v in r.config.items())), tuple(sorted(w.items()))


def batch_series(records: Sequence[CaseRecord]) -> list[BatchSeries]:
    groups: dict[tuple, list[CaseRecord]] = {}
    for r in records:
        if r.ok and is_generation(r) and r.metric("tpot_ms") is not None:
            groups.setdefault(_batch_key(r), []).append(r)
    out = []
    for recs in groups.values():
        if len({r.workload["batch_size"] for r in recs}) < 2:
            continue
        recs = sorted(recs, key=lambda r: r.workload["batch_size"])
        pts = tuple((int(r.workload["batch_size"]), float(r.metric("decode_tokens_per_s")), float(r.metric("tpot_ms")))
                    for r in recs)
        base = pts[0][2]
        knee = next((b for b, _, tpot in pts[1:] if tpot > KNEE_TPOT_RATIO * base), None)
        first = recs[0]
        label = (f"{first.arch} {first.workload.get('dtype')} compile={first.workload.get('compile', 'none')} "
                 f"prompt {first.workload['prompt_len']} + {first.workload['new_tokens']} new")
        out.append(BatchSeries(label, pts, knee, tuple(r.case_key for r in recs)))
    return out


def batch_records(records: Sequence[CaseRecord], series: BatchSeries) -> list[CaseRecord]:
    """The records of ``series`` relabelled with its label as their line (to draw tokens/s against batch)."""
    keys = set(series.case_keys)
    return [replace(r, line=series.label) for r in records if r.case_key in keys]


def case_rows(records: Sequence[CaseRecord], peak: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per generation case: its figures and its distance from the bounds (None where not known)."""
    rows = []
    for r in records:
        if not (r.ok and is_generation(r)):
            continue
        rates = generation_rates(r, peak)
        rows.append({"line": r.line, "batch": r.workload.get("batch_size"), "prompt": r.workload.get("prompt_len"),
                     "new": r.workload.get("new_tokens"), "ttft_ms": r.metric("ttft_ms"), "tpot_ms": r.metric("tpot_ms"),
                     "itl_p99_ms": r.metric("itl_p99_ms"), "out_tps": r.metric("output_tokens_per_s"),
                     "kv_mib": (r.metric("kv_cache_bytes") or 0) / 2 ** 20,
                     "bound_ms": rates.get("decode_bound_ms"), "bw_share": rates.get("bandwidth_bound_share"),
                     "prefill_peak": rates.get("prefill_peak_share")})
    return rows
