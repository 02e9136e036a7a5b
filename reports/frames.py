"""Stored case rows → pandas frames, the one source every view is built from."""
from __future__ import annotations

from typing import Any

import pandas as pd

from harness.stats import Fit, fit_loglog

ID_COLUMNS = ["case_key", "suite", "line", "arch", "status", "message"]


RATE_COLUMNS = ("achieved_flops_per_s", "peak_share")


def peak_flops(peak: dict[str, Any] | None, device: str, dtype: str) -> float | None:
    """The measured matmul FLOP/s of ``dtype`` on ``device`` from a run's ``options["peak"]`` (None if absent).

    ``peak`` maps a device string (as the cases name it: ``cpu``, ``cuda``, ``cuda:1``) to
    :func:`harness.calibrate.calibrate`'s result.
    """
    value_ = _device_peak(peak, device).get("matmul_flops_per_s", {}).get(dtype)
    return float(value_) if value_ else None


def peak_bandwidth(peak: dict[str, Any] | None, device: str) -> float | None:
    """The measured copy bandwidth (bytes/s, read + written) on ``device`` from ``options["peak"]`` (None if absent)."""
    value_ = _device_peak(peak, device).get("copy_bytes_per_s")
    return float(value_) if value_ else None


def _device_peak(peak: dict[str, Any] | None, device: str) -> dict[str, Any]:
    """``device``'s entry of a run's peak (``cuda:1`` falls back to ``cuda``); {} if absent."""
    return (peak or {}).get(device) or (peak or {}).get(device.split(":")[0]) or {}


def roofline_point(row: dict[str, Any]) -> tuple[float, float] | None:
    """A case's ``(arithmetic intensity FLOP/byte, achieved FLOP/s)``: ``flops / bytes_moved`` and
    ``flops / median time``; None unless the case is ok with positive ``flops``, ``bytes_moved`` and ``median_ms``."""
    m = row.get("metrics") or {}
    flops, moved, median_ms = m.get("flops"), m.get("bytes_moved"), m.get("median_ms")
    if row.get("status") != "ok" or not all(isinstance(v, (int, float)) and v > 0 for v in (flops, moved, median_ms)):
        return None
    return float(flops) / float(moved), float(flops) / (float(median_ms) / 1e3)


def rates(row: dict[str, Any], peak: dict[str, Any] | None = None) -> dict[str, float]:
    """A case's achieved FLOP/s (counted ``flops`` / median time) and its share of the measured peak.

    Computed from stored data only; a key is absent when its inputs are (no flops or timing, no peak).
    """
    m = row["metrics"]
    flops, median_ms = m.get("flops"), m.get("median_ms")
    if row.get("status") != "ok" or not flops or not median_ms or median_ms <= 0:
        return {}
    out = {"achieved_flops_per_s": float(flops) / (float(median_ms) / 1e3)}
    top = peak_flops(peak, str(row["workload"].get("device", "cpu")), str(row["workload"].get("dtype", "fp32")))
    if top:
        out["peak_share"] = out["achieved_flops_per_s"] / top
    return out


def wide_frame(rows: list[dict[str, Any]], peak: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per case: identity, workload fields, config fields (``cfg.``) and metrics.

    With ``peak`` (a run's ``options["peak"]``), also ``achieved_flops_per_s`` and ``peak_share``
    where the case has counted FLOPs and a median time.
    """
    flat = []
    for r in rows:
        row = {k: r[k] for k in ID_COLUMNS}
        row.update(r["workload"])
        row.update({f"cfg.{k}": v for k, v in r["config"].items()})
        row.update(r["metrics"])
        if peak is not None:
            row.update(rates(r, peak))
        row["duration_s"] = r["duration_s"]
        flat.append(row)
    return pd.DataFrame(flat)


def tidy_frame(rows: list[dict[str, Any]], peak: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per case × metric: ``case_key, line, arch, <workload…>, <cfg.…>, metric, value``.

    Rows follow the stored case order, metrics sorted by name within a case; missing metrics are
    dropped. With ``peak``, ``achieved_flops_per_s`` and ``peak_share`` are metrics too.
    """
    wide = wide_frame(rows, peak)
    metric_names = {m for r in rows for m in r["metrics"]}
    if peak is not None:
        metric_names |= {k for r in rows for k in rates(r, peak)}
    metric_cols = sorted(metric_names)
    id_cols = [c for c in wide.columns if c not in metric_cols]
    if wide.empty or not metric_cols:
        return pd.DataFrame(columns=[*id_cols, "metric", "value"])
    wide = wide.assign(_order=range(len(wide)))
    tidy = wide.melt(id_vars=[*id_cols, "_order"], value_vars=metric_cols, var_name="metric", value_name="value")
    tidy = tidy.dropna(subset=["value"]).sort_values(["_order", "metric"], kind="stable")
    return tidy.drop(columns="_order").reset_index(drop=True)


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
