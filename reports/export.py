"""Exports of one run: JSON (a list, one object per case), CSV (the same, flattened), Parquet (the wide
frame) and tidy CSV (one row per case × metric).

The tabular formats carry ``achieved_flops_per_s`` and, for runs that stored a measured peak,
``peak_share``; both are derived from stored data at export time.
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from harness.records import CaseRecord, RunRecord
from reports.frames import tidy_frame, wide_frame

CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
               "samples_s", "duration_s")


def to_json(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    cases = [{"run_id": run.id, **{k: v for k, v in asdict(r).items() if k in CASE_FIELDS}} for r in records]
    return json.dumps(cases, indent=2, default=str) + "\n"


def _frame_csv(frame: pd.DataFrame, run: RunRecord) -> str:
    frame.insert(0, "run_id", run.id)
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def to_csv(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    return _frame_csv(wide_frame(records, run.peak), run)


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
    frame = wide_frame(records, run.peak)
    frame.insert(0, "run_id", run.id)
    _arrow_safe(frame).to_parquet(path, index=False, engine="pyarrow")
