"""Exports of one run: JSON (a list, one object per case) and CSV (the same, flattened)."""
from __future__ import annotations

import io
import json
from typing import Any

from reports.frames import wide_frame

CASE_FIELDS = ("case_key", "suite", "line", "arch", "status", "message", "config", "workload", "metrics",
               "samples_s", "duration_s")


def to_json(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cases = [{"run_id": run["id"], **{k: r[k] for k in CASE_FIELDS}} for r in rows]
    return json.dumps(cases, indent=2, default=str) + "\n"


def to_csv(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    frame = wide_frame(rows)
    frame.insert(0, "run_id", run["id"])
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()
