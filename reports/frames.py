"""Stored case rows → pandas frames, the one source every view is built from."""
from __future__ import annotations

from typing import Any

import pandas as pd

from harness.stats import Fit, fit_loglog

ID_COLUMNS = ["case_key", "suite", "line", "arch", "status", "message"]


def wide_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per case: identity, workload fields, config fields (``cfg.``) and metrics."""
    flat = []
    for r in rows:
        row = {k: r[k] for k in ID_COLUMNS}
        row.update(r["workload"])
        row.update({f"cfg.{k}": v for k, v in r["config"].items()})
        row.update(r["metrics"])
        row["duration_s"] = r["duration_s"]
        flat.append(row)
    return pd.DataFrame(flat)


def tidy_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per case × metric: ``case_key, line, arch, <workload…>, metric, value``."""
    wide = wide_frame(rows)
    metric_cols = sorted({m for r in rows for m in r["metrics"]})
    id_cols = [c for c in wide.columns if c not in metric_cols]
    return wide.melt(id_vars=id_cols, value_vars=metric_cols, var_name="metric", value_name="value").dropna(
        subset=["value"])


def value(row: dict[str, Any], key: str) -> Any:
    """A case's value of ``key``: a workload field, else a config field (None if neither)."""
    if key in row["workload"]:
        return row["workload"][key]
    return row["config"].get(key)


def sweep_axis(rows: list[dict[str, Any]], preferred: str | None = None) -> str | None:
    """The workload or config field that varies within a line (``preferred`` first)."""
    if not rows:
        return None
    fields = list(rows[0]["workload"]) + list(rows[0]["config"])
    if preferred in fields:
        return preferred
    for line in dict.fromkeys(r["line"] for r in rows):
        same_line = [r for r in rows if r["line"] == line]
        for f in fields:
            values = {repr(value(r, f)) for r in same_line}
            if len(values) > 1:
                return f
    return None


EXPONENT_METRICS = {"macs": "MACs", "median_ms": "latency", "peak_bytes": "memory"}


def exponents(rows: list[dict[str, Any]], x: str) -> dict[str, dict[str, Fit | None]]:
    """Per line, the fitted log-log exponent of MACs, latency and peak memory vs ``x`` (ok cases only)."""
    out: dict[str, dict[str, Fit | None]] = {}
    for line in dict.fromkeys(r["line"] for r in rows):
        ok = [r for r in rows if r["line"] == line and r["status"] == "ok"
              and isinstance(value(r, x), (int, float)) and not isinstance(value(r, x), bool)]
        out[line] = {}
        for metric in EXPONENT_METRICS:
            pts = [(value(r, x), r["metrics"][metric]) for r in ok if metric in r["metrics"]]
            out[line][metric] = fit_loglog([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 2 else None
    return out
