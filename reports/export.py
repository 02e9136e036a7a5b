"""Exports of one run: JSON (a list, one object per case), CSV (the same, flattened), Parquet (the wide
frame), tidy CSV (one row per case × metric), pytest-benchmark's JSON (one benchmark per timed case, for
``pytest-benchmark compare`` and github-action-benchmark's ``tool: pytest``) and github-action-benchmark's own
``customSmallerIsBetter`` JSON.

The tabular formats carry ``achieved_flops_per_s`` and, for runs that stored a measured peak,
``peak_share``; both are derived from stored data at export time. Where the run's lines are different models
(:mod:`reports.side_by_side`), each case of a sweep point two or more lines share carries its ratios to the
reference line there: JSON ``vs_reference`` (``line``; ``median_ms`` with its 95 % interval; ``peak_bytes``,
``macs``, ``params``), CSV and Parquet the same flattened (``vs_ref.line``, ``vs_ref.median_ms``,
``vs_ref.median_ms_ci_low``, ...).
"""
from __future__ import annotations

import io
import json
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract.records import CaseRecord, RunRecord
from reports.labels import case_params
from reports.frames import tidy_frame, wide_frame
from reports.side_by_side import flat_vs_reference, side_by_side, vs_reference

CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
               "samples_s", "duration_s")


def to_json(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    ratios = vs_reference(side_by_side(run, records))
    cases = [{"run_id": run.id, **{k: v for k, v in asdict(r).items() if k in CASE_FIELDS},
              **({"vs_reference": ratios[r.case_key]} if r.case_key in ratios else {})} for r in records]
    return json.dumps(cases, indent=2, default=str) + "\n"


def _wide(run: RunRecord, records: Sequence[CaseRecord]) -> pd.DataFrame:
    """The wide frame (one row per case) with the ``vs_ref.`` columns where the run compares models."""
    frame = wide_frame(records, run.peak)
    ratios = vs_reference(side_by_side(run, records))
    if ratios:
        flat = [flat_vs_reference(ratios[r.case_key]) if r.case_key in ratios else {} for r in records]
        frame = pd.concat([frame, pd.DataFrame(flat, index=frame.index)], axis=1)
    return frame


def _frame_csv(frame: pd.DataFrame, run: RunRecord) -> str:
    frame.insert(0, "run_id", run.id)
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def to_csv(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    return _frame_csv(_wide(run, records), run)


def to_tidy_csv(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    """One row per case × metric (``metric``, ``value``), identity/workload/config columns repeated."""
    return _frame_csv(tidy_frame(records, run.peak), run)


def _as_text(v: Any) -> Any:
    if isinstance(v, str) or (not isinstance(v, (list, tuple, dict)) and pd.isna(v)):
        return v
    return json.dumps(v, default=str)


def _arrow_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding anything but strings (lists, dicts, mixed types) become JSON text."""
    frame = frame.copy()
    for col in frame.columns[frame.dtypes == object]:
        values = frame[col].dropna()
        if not all(isinstance(v, str) for v in values):
            frame[col] = frame[col].map(_as_text)
    return frame


def to_parquet(run: RunRecord, records: Sequence[CaseRecord], path: str | Path) -> None:
    """The wide frame (one row per case) as a Parquet file, via pandas + pyarrow."""
    frame = _wide(run, records)
    frame.insert(0, "run_id", run.id)
    _arrow_safe(frame).to_parquet(path, index=False, engine="pyarrow")


# -- pytest-benchmark ------------------------------------------------------------------------------------
PYTEST_BENCHMARK_VERSION = "5.3.1"
"""The pytest-benchmark release whose saved-JSON layout :func:`to_pytest_benchmark` writes."""


def _quartiles(data: list[float]) -> tuple[float, float]:
    """Q1 and Q3 as pytest-benchmark computes them (``Stats.q1``/``q3``: Wikipedia's methods 2 and 3)."""
    n = len(data)
    if n == 1:
        return data[0], data[0]
    if n % 2:
        k, q = n // 4, n % 4
        if q == 1:
            return 0.25 * data[k - 1] + 0.75 * data[k], 0.75 * data[3 * k] + 0.25 * data[3 * k + 1]
        return 0.75 * data[k] + 0.25 * data[k + 1], 0.25 * data[3 * k + 1] + 0.75 * data[3 * k + 2]
    return statistics.median(data[: n // 2]), statistics.median(data[n // 2:])


def pytest_benchmark_stats(samples_s: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's ``stats`` of per-call times in seconds (its ``Stats.as_dict()`` plus ``data`` and
    ``iterations``), computed as pytest-benchmark computes them; ``rounds`` is the number of samples."""
    data = [float(x) for x in samples_s]
    s = sorted(data)
    n = len(s)
    mean = statistics.mean(s)
    stddev = statistics.stdev(s) if n > 1 else 0.0
    q1, q3 = _quartiles(s)
    iqr = q3 - q1
    ld15iqr = s[0] if n == 1 else s[bisect_left(s, q1 - 1.5 * iqr)]
    hd15iqr = s[0] if n == 1 else s[bisect_right(s, q3 + 1.5 * iqr) - 1]
    iqr_outliers = sum(x < q1 - 1.5 * iqr or x > q3 + 1.5 * iqr for x in s)
    stddev_outliers = sum(x < mean - stddev or x > mean + stddev for x in s)
    total = math.fsum(s)
    return {"min": s[0], "max": s[-1], "mean": mean, "stddev": stddev, "rounds": n, "median": statistics.median(s),
            "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_outliers, "stddev_outliers": stddev_outliers,
            "outliers": f"{stddev_outliers};{iqr_outliers}", "ld15iqr": ld15iqr, "hd15iqr": hd15iqr,
            "ops": n / total if total else 0, "total": total, "data": data, "iterations": 1}


def _machine_info(run: RunRecord) -> dict[str, Any]:
    hard, soft = run.hard_env, dict(run.env.get("soft") or {})
    platform = str(soft.get("platform") or "")
    return {"node": soft.get("host") or "", "processor": hard.get("cpu") or "", "machine": "",
            "python_compiler": "", "python_implementation": "CPython", "python_implementation_version":
            hard.get("python") or "", "python_version": hard.get("python") or "", "python_build": [],
            "release": "", "system": platform.split("-", 1)[0] if platform else "",
            "cpu": {"brand_raw": hard.get("cpu") or "", "count": hard.get("cores")},
            "bench_env": dict(run.env)}


def _commit_info(run: RunRecord) -> dict[str, Any]:
    soft = dict(run.env.get("soft") or {})
    return {"id": run.commit or "unknown", "time": None, "author_time": None, "dirty": bool(soft.get("dirty")),
            "project": "bench", "branch": "(unknown)"}


def to_pytest_benchmark(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    """The run in the JSON layout pytest-benchmark saves (``.benchmarks/<machine>/NNNN_name.json``): one
    benchmark per ok case with timing samples, ``name`` = ``line[param]`` where ``param`` is the case's
    label values joined by ``-`` as pytest writes parameter ids (``params``: the same values by name,
    :func:`reports.labels.case_params`), ``fullname`` = ``suite::name``, ``group`` = the suite, and ``stats``
    in seconds per call (one iteration per sample, so ``rounds`` is the number of samples).

    ``pytest-benchmark compare FILE...`` reads it, and github-action-benchmark (``tool: pytest``) takes
    ``benchmarks[].fullname``, ``stats.ops``, ``stats.stddev``, ``stats.rounds`` and ``stats.mean``."""
    benchmarks = []
    for r, params in zip(records, case_params(records)):
        if not r.ok or not r.samples_s:
            continue
        param = "-".join(str(v) for v in params.values())
        name = f"{r.line}[{param}]"
        extra = {"case_key": r.case_key, "run_id": run.id, "arch": r.arch, "median_ms": r.metric("median_ms"),
                 **{k: r.metric(k) for k in ("macs", "flops", "params", "peak_bytes") if r.metric(k) is not None}}
        benchmarks.append({"group": run.suite, "name": name, "fullname": f"{run.suite}::{name}",
                           "params": dict(params), "param": param, "extra_info": extra,
                           "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": len(r.samples_s),
                                       "max_time": None, "min_time": None, "warmup": None},
                           "stats": pytest_benchmark_stats(r.samples_s)})
    doc = {"machine_info": _machine_info(run), "commit_info": _commit_info(run), "benchmarks": benchmarks,
           "datetime": run.finished_at or run.started_at, "version": PYTEST_BENCHMARK_VERSION}
    return json.dumps(doc, indent=4, default=str) + "\n"


# -- github-action-benchmark -----------------------------------------------------------------------------
def to_github_action_benchmark(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    """The run as github-action-benchmark's ``customSmallerIsBetter`` input: a JSON list, one entry per ok case
    with a median: ``name`` (``suite · line[param]``, as :func:`to_pytest_benchmark` names it), ``unit`` ``ms``,
    ``value`` the median per call, ``range`` ``± h`` with ``h`` the larger half of its 95 % interval, and ``extra``
    (the interval itself, samples, processes, MACs and parameters, commit and run id), one line of text."""
    out = []
    for r, params in zip(records, case_params(records)):
        median, lo, hi = r.metric("median_ms"), r.metric("ci_low_ms"), r.metric("ci_high_ms")
        if not r.ok or median is None:
            continue
        param = "-".join(str(v) for v in params.values())
        entry: dict[str, Any] = {"name": f"{run.suite} · {r.line}[{param}]", "unit": "ms", "value": median}
        extra = []
        if lo is not None and hi is not None:
            entry["range"] = f"± {max(median - lo, hi - median):.4g}"
            extra.append(f"95% interval [{lo:.4g}, {hi:.4g}] ms")
        extra.append(f"{len(r.samples_s)} samples, {max(1, int(r.metric('n_processes') or 1))} process(es)")
        extra += [f"{k} {r.metric(k):.6g}" for k in ("macs", "params") if r.metric(k) is not None]
        extra.append(f"commit {run.commit[:12] or 'unknown'}, run {run.id}")
        entry["extra"] = "; ".join(extra)
        out.append(entry)
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"
