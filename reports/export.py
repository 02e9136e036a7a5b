"""Exports of one run: JSON (a list, one object per case), CSV (the same, flattened), Parquet (the wide
frame) and tidy CSV (one row per case × metric).

The tabular formats carry ``achieved_flops_per_s`` and, for runs that stored a measured peak
(``options["peak"]``), ``peak_share``; both are derived from stored data at export time.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from reports.frames import tidy_frame, wide_frame

CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
               "samples_s", "duration_s")


def run_peak(run: dict[str, Any]) -> dict[str, Any]:
    """The run's measured peak (``{}`` for runs stored without one, or with ``--no-calibrate``)."""
    return (run.get("options") or {}).get("peak") or {}


def to_json(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cases = [{"run_id": run["id"], **{k: r[k] for k in CASE_FIELDS}} for r in rows]
    return json.dumps(cases, indent=2, default=str) + "\n"


def _frame_csv(frame: pd.DataFrame, run: dict[str, Any]) -> str:
    frame.insert(0, "run_id", run["id"])
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def to_csv(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    return _frame_csv(wide_frame(rows, run_peak(run)), run)


def to_tidy_csv(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One row per case × metric (``metric``, ``value``), identity/workload/config columns repeated."""
    return _frame_csv(tidy_frame(rows, run_peak(run)), run)


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


def to_parquet(run: dict[str, Any], rows: list[dict[str, Any]], path: str | Path) -> None:
    """The wide frame (one row per case) as a Parquet file, via pandas + pyarrow."""
    frame = wide_frame(rows, run_peak(run))
    frame.insert(0, "run_id", run["id"])
    _arrow_safe(frame).to_parquet(path, index=False, engine="pyarrow")
