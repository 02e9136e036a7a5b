"""Stored case records → the numbers and pandas frames every view is built from (torch-free).

Derived figures are computed here once: a case's achieved FLOP/s and share of the machine's measured
peak, its roofline point, the sweep axis of a run, and the wide/tidy frames of the exports.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any


from harness.contract.records import CaseRecord

if TYPE_CHECKING:
    import pandas as pd    # imported where a frame is built: `bench run` need not load pandas

ID_COLUMNS = ["case_key", "suite", "line", "arch", "status", "message"]
Records = Sequence[CaseRecord]


def peak_flops(peak: dict[str, Any] | None, device: str, dtype: str) -> float | None:
    """The measured matmul FLOP/s of ``dtype`` on ``device`` from a run's peak (None if absent).

    ``peak`` maps a device string (as the cases name it: ``cpu``, ``cuda``, ``cuda:1``) to
    :func:`harness.instruments.calibrate.calibrate`'s result.
    """
    found = _device_peak(peak, device).get("matmul_flops_per_s", {}).get(dtype)
    return float(found) if found else None


def peak_bandwidth(peak: dict[str, Any] | None, device: str) -> float | None:
    """The measured copy bandwidth (bytes/s, read + written) on ``device`` from a run's peak (None if absent)."""
    found = _device_peak(peak, device).get("copy_bytes_per_s")
    return float(found) if found else None


def _device_peak(peak: dict[str, Any] | None, device: str) -> dict[str, Any]:
    """``device``'s entry of a run's peak (``cuda:1`` falls back to ``cuda``); {} if absent."""
    return (peak or {}).get(device) or (peak or {}).get(device.split(":")[0]) or {}


def device_dtype(rec: CaseRecord) -> tuple[str, str]:
    return str(rec.workload.get("device", "cpu")), str(rec.workload.get("dtype", "fp32"))


def executed_flops(rec: CaseRecord) -> float | None:
    """The FLOPs the case's kernels executed: ``2 · executed_macs`` where the record has it (the dense count
    minus what fused causal attention skipped, :mod:`harness.instruments.kernels`), else the counted ``flops``."""
    executed = rec.metric("executed_macs")
    return 2.0 * executed if executed is not None else rec.metric("flops")


def sdpa_backend(rec: CaseRecord) -> str:
    """The SDPA backend(s) the case ran (``flash``, ``efficient+math``, ...), ``""`` when none or not recorded."""
    return str(getattr(rec, "sdpa_backend", "") or "")


def roofline_point(rec: CaseRecord) -> tuple[float, float] | None:
    """A case's ``(arithmetic intensity FLOP/byte, achieved FLOP/s)``: executed FLOPs (:func:`executed_flops`)
    over ``bytes_moved`` and over the median time; None unless the case is ok with positive FLOPs,
    ``bytes_moved`` and ``median_ms``."""
    flops, moved, median_ms = executed_flops(rec), rec.metric("bytes_moved"), rec.metric("median_ms")
    if not rec.ok or not all(v is not None and v > 0 for v in (flops, moved, median_ms)):
        return None
    return flops / moved, flops / (median_ms / 1e3)


def rates(rec: CaseRecord, peak: dict[str, Any] | None = None) -> dict[str, float]:
    """A case's achieved FLOP/s (counted ``flops`` / median time), its executed FLOP/s (where the record has
    ``executed_macs``: what the kernels computed / median time) and the share of the measured peak it reached
    (executed FLOP/s where known, else the achieved, over the matmul peak of its device and dtype).

    Computed from stored data only; a key is absent when its inputs are (no flops or timing, no peak).
    """
    flops, median_ms = rec.metric("flops"), rec.metric("median_ms")
    if not rec.ok or not flops or not median_ms or median_ms <= 0:
        return {}
    out = {"achieved_flops_per_s": flops / (median_ms / 1e3)}
    out.update(generation_rates(rec, peak))
    if rec.metric("executed_macs") is not None:
        out["executed_flops_per_s"] = 2.0 * rec.metric("executed_macs") / (median_ms / 1e3)
    top = peak_flops(peak, *device_dtype(rec))
    if top:
        out["peak_share"] = out.get("executed_flops_per_s", out["achieved_flops_per_s"]) / top
    return out


def generation_rates(rec: CaseRecord, peak: dict[str, Any] | None) -> dict[str, float]:
    """A generation case's (harness.engine.generation) distance from the physical limits, from the run's calibrated peak:

    * ``prefill_peak_share``: the prefill's counted FLOPs (2·``prefill_macs``) per ``ttft_ms``, over the matmul peak
      of its device and dtype (the usual % of compute peak, for the prefill alone);
    * ``decode_bound_ms``: ``decode_min_bytes`` (weights + KV read and written per step) / the calibrated copy
      bandwidth — no decode step can be faster; ``bandwidth_bound_share``: decode_bound_ms / ``tpot_ms`` (1.0 = at
      the bandwidth bound; above 1 means the bound's bytes were not all moved, e.g. weights that stayed in cache).
    """
    out: dict[str, float] = {}
    ttft, prefill_macs = rec.metric("ttft_ms"), rec.metric("prefill_macs")
    top = peak_flops(peak, *device_dtype(rec))
    if top and ttft and prefill_macs:
        out["prefill_peak_share"] = 2.0 * prefill_macs / (ttft / 1e3) / top
    bw, min_bytes, tpot = peak_bandwidth(peak, device_dtype(rec)[0]), rec.metric("decode_min_bytes"), rec.metric("tpot_ms")
    if bw and min_bytes:
        out["decode_bound_ms"] = min_bytes / bw * 1e3
        if tpot:
            out["bandwidth_bound_share"] = out["decode_bound_ms"] / tpot
    return out


def wide_frame(records: Records, peak: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per case: identity, workload fields, config fields (``cfg.``) and metrics.

    With ``peak`` (a run's peak), also ``achieved_flops_per_s``, ``executed_flops_per_s`` and ``peak_share``
    (:func:`rates`) where the case has counted FLOPs and a median time. ``sdpa_backend`` where a case has one.
    """
    flat = []
    for r in records:
        row: dict[str, Any] = {k: getattr(r, k) for k in ID_COLUMNS}
        row.update(r.workload)
        row.update({f"cfg.{k}": v for k, v in r.config.items()})
        row.update(r.metrics)
        if sdpa_backend(r):
            row["sdpa_backend"] = sdpa_backend(r)
        if peak is not None:
            row.update(rates(r, peak))
        row["duration_s"] = r.duration_s
        flat.append(row)
    import pandas as pd

    return pd.DataFrame(flat)


def tidy_frame(records: Records, peak: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per case × metric: ``case_key, line, arch, <workload…>, <cfg.…>, metric, value``.

    Rows follow the stored case order, metrics sorted by name within a case; missing metrics are
    dropped. With ``peak``, ``achieved_flops_per_s`` and ``peak_share`` are metrics too.
    """
    import pandas as pd

    wide = wide_frame(records, peak)
    metric_names = {m for r in records for m in r.metrics}
    if peak is not None:
        metric_names |= {k for r in records for k in rates(r, peak)}
    metric_cols = sorted(metric_names)
    id_cols = [c for c in wide.columns if c not in metric_cols]
    if wide.empty or not metric_cols:
        return pd.DataFrame(columns=[*id_cols, "metric", "value"])
    wide = wide.assign(_order=range(len(wide)))
    tidy = wide.melt(id_vars=[*id_cols, "_order"], value_vars=metric_cols, var_name="metric", value_name="value")
    tidy = tidy.dropna(subset=["value"]).sort_values(["_order", "metric"], kind="stable")
    return tidy.drop(columns="_order").reset_index(drop=True)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def sweep_axis(records: Records, preferred: str | None = None) -> str | None:
    """The workload or config field that varies within a line (``preferred`` first, if it is a field)."""
    if not records:
        return None
    fields = list(records[0].workload) + list(records[0].config)
    if preferred in fields:
        return preferred
    for line in dict.fromkeys(r.line for r in records):
        same_line = [r for r in records if r.line == line]
        for f in fields:
            if len({repr(r.value(f)) for r in same_line}) > 1:
                return f
    return None


def varying_keys(records: Records) -> list[str]:
    """The workload and config fields whose value differs between the cases (the run's real parameters)."""
    if not records:
        return []
    keys = dict.fromkeys(k for r in records for k in (*r.workload, *r.config))
    return [k for k in keys if len({repr(r.value(k)) for r in records}) > 1]
