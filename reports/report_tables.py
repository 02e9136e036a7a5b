"""The tables of the HTML report, as plain rows for the template: the findings (the terminal's own
sentences and fits), the cases by their readable parameters, the raw statistics per case, the environment
fingerprints of runs side by side, and the cases that several runs of a suite share (torch-free)."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.records import LABEL_KEYS, LATER_HARD_KEYS, CaseRecord, RunRecord
from harness.analysis.fits import ScalingFit
from harness.analysis.stats import summarize
from reports.findings import FIT_METRICS, Findings
from reports.labels import case_labels, param_columns
from reports.side_by_side import SideBySide
from reports.frames import sdpa_backend
from reports.sentences import contrast_text, fit_text, headline_contrasts, headline_lines, over_peak, pct_peak, symbol

MiB = 1024 * 1024
GiB = 1024 * MiB
RAW_KEYS = ("n_samples", "min_ms", "q1_ms", "median_ms", "q3_ms", "max_ms", "p90_ms", "p99_ms", "mean_ms",
            "stdev_ms", "iqr_ms", "rel_iqr", "ci_low_ms", "ci_high_ms")

MESSAGE_CHARS = 120
"""A message longer than this is cut in the cases table (an OOM's is a paragraph)."""

Run = tuple[RunRecord, Sequence[CaseRecord]]


def num(v: Any, scale: float = 1.0, fmt: str = "{:,.3f}") -> str:
    """A number for a table cell; ``–`` for none."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return "–"
    return fmt.format(v / scale)


def headline(f: Findings, sbs: SideBySide | None = None) -> dict[str, list[str]]:
    """The sentences ``bench run`` prints (:func:`reports.sentences.headline_lines`, given the run's side-by-side
    view ``sbs``), split into how each line scales (``lines``) and the one-parameter contrasts (``contrasts``)."""
    chosen = headline_contrasts(f, sbs.reference, True) if sbs else headline_contrasts(f)
    contrasts = {contrast_text(c, f.axis) for c in chosen}
    body = [s.strip() for s in headline_lines(f, sbs)[1:]]
    return {"lines": [s for s in body if s not in contrasts], "contrasts": [s for s in body if s in contrasts]}


def floor_text(f: Findings, line: str) -> str:
    """``4.38 ms for n ≤ 1024``: the time floor below the scaling regime (as the terminal's findings table)."""
    t = f.fit(line, "median_ms")
    return (f"{t.floor_y:,.2f} ms for {symbol(f.axis)} ≤ {t.floor[-1][0]:g}"
            if isinstance(t, ScalingFit) and t.floor else "")


def findings_rows(f: Findings) -> list[dict[str, Any]]:
    """Per line: the fit (exponent, 95% CI, regime start) of time, memory and MACs, the time floor, failures."""
    return [{"line": lf.line, "fits": [fit_text(lf.fits.get(m), f.axis, metric=m) for m in FIT_METRICS],
             "floor": floor_text(f, lf.line),
             "failed": ", ".join(f"{n} {s}" for s, n in lf.statuses.items() if s != "ok")} for lf in f.lines]


def case_table(records: Sequence[CaseRecord], axis: str | None, peak: Mapping[str, Any]) -> dict[str, Any]:
    """One row per case: line, arch (when several), the parameters that vary in the run (and ``sdpa_backend``,
    the SDPA kernel that ran, where some case recorded one), status, median with its 95% CI, GMACs, % of the
    measured peak (``over_peak`` above 100: the template marks the cell), params, peak and estimated memory,
    the message."""
    keys = param_columns(records, axis)
    backend = any(sdpa_backend(r) for r in records)
    show_arch = len({r.arch for r in records}) > 1
    rows = []
    for r in records:
        lo, hi = r.metric("ci_low_ms"), r.metric("ci_high_ms")
        rows.append({
            "line": r.line, "arch": r.arch, "status": r.status,
            "params": [_cell(r.value(k)) for k in keys] + ([sdpa_backend(r) or "–"] if backend else []),
            "median": num(r.metric("median_ms")),
            "ci": f"{lo:,.3f} – {hi:,.3f}" if lo is not None and hi is not None else "–",
            "macs": num(r.metric("macs"), 1e9), "pct_peak": pct_peak(r, dict(peak), flag=False) or "–",
            "over_peak": over_peak(r, dict(peak)),
            "n_params": num(r.metric("params"), 1e6, "{:,.2f}"), "peak": num(r.metric("peak_bytes"), MiB, "{:,.1f}"),
            "est_peak": num(r.metric("est_peak_bytes"), MiB, "{:,.1f}"),
            "message": short_message(r.message) or ("noisy (IQR/median ≥ 0.10)" if r.metric("noisy") else "")})
    archs = sorted({r.arch for r in records})
    return {"param_keys": keys + (["sdpa_backend"] if backend else []), "show_arch": show_arch,
            "arch": archs[0] if len(archs) == 1 else "", "rows": rows}


def short_message(message: str, limit: int = MESSAGE_CHARS) -> str:
    """The first line of a case's message, cut at ``limit`` characters (the whole one is in the raw statistics)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= limit else first[:limit].rstrip() + " …"


def _cell(v: Any) -> str:
    return "–" if v is None else str(v)


def raw_stats(records: Sequence[CaseRecord], axis: str | None) -> list[dict[str, Any]]:
    """Per case: its readable label, the summary of its raw samples, every other metric, workload, config."""
    out = []
    for r, label in zip(records, case_labels(records, axis)):
        samples = [float(s) for s in r.samples_s]
        stats = summarize(samples) if samples else {}
        table = [(k, f"{int(stats[k])}" if k == "n_samples" else f"{stats[k]:.6g}") for k in RAW_KEYS if k in stats]
        other = sorted([(k, num(v, 1.0, "{:.6g}")) for k, v in r.metrics.items() if k not in stats]
                       + ([("sdpa_backend", sdpa_backend(r))] if sdpa_backend(r) else []))
        median = r.metric("median_ms")
        out.append({"summary": f"{label} · {r.status}" + (f" · {median:,.3f} ms" if median is not None else ""),
                    "message": r.message, "stats": table, "metrics": other, "n": len(samples),
                    "samples_ms": ", ".join(f"{s * 1e3:.6g}" for s in samples),
                    "config": json.dumps(dict(r.config), sort_keys=True, default=str),
                    "workload": json.dumps(dict(r.workload), sort_keys=True, default=str)})
    return out


def env_value(key: str, v: Any) -> str:
    """A fingerprint value for a table cell: sizes in GiB, a list of GPUs by name, JSON for the rest."""
    if v is None:
        return "–"
    if key.endswith("_bytes") and is_count(v):
        return f"{v / GiB:,.1f} GiB"
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return "; ".join(_named(d) for d in v)
    if key == "cpu_id" and isinstance(v, dict):      # vendor family/model/stepping, then the vector ISA
        ident = " ".join(f"{k} {v[k]}" for k in ("family", "model", "stepping", "implementer", "part") if k in v)
        return f"{v.get('vendor', '')} {ident}; {' '.join(v.get('isa') or []) or 'no vector ISA flags'}".strip()
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str) if v else "none"
    return str(v)


def _named(d: Mapping[str, Any]) -> str:
    """``NVIDIA H100 80GB HBM3 (memory 79.2 GiB, capability 9.0, multiprocessors 132)``."""
    rest = ", ".join(f"{k.removesuffix('_bytes')} {env_value(k, x)}" for k, x in d.items() if k != "name")
    return f"{d.get('name', '?')} ({rest})" if rest else str(d.get("name", "?"))


def is_count(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def env_table(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """The fingerprints of ``runs`` as columns: hard keys (they decide comparability) and soft fields,
    each row marked ``differs`` when the runs do not agree on it."""
    def rows(part: str) -> list[dict[str, Any]]:
        envs = [dict(run.env.get(part) or {}) for run in runs]
        keys = list(dict.fromkeys(k for e in envs for k in e))
        return [{"key": k, "values": [env_value(k, e.get(k)) for e in envs],
                 "differs": len({json.dumps(e.get(k), sort_keys=True, default=str) for e in envs}) > 1}
                for k in keys]
    return {"runs": [run.id for run in runs], "hard": rows("hard"), "soft": rows("soft")}


def hard_differences(runs: Sequence[RunRecord]) -> list[str]:
    """The hard fingerprint keys on which the runs do not all agree (sorted)."""
    keys = {k for run in runs for k in run.hard_env}
    return sorted(k for k in keys if len({json.dumps(run.hard_env.get(k), sort_keys=True, default=str)
                                          for run in runs if k in run.hard_env or k not in LATER_HARD_KEYS}) > 1)


def run_device(run: RunRecord, records: Sequence[CaseRecord]) -> str:
    """Where a run measured, for a column header: its cases' device(s), with the GPU model on CUDA
    ("cuda · NVIDIA H100 80GB HBM3"), else the CPU model."""
    devices = sorted({str(r.workload.get("device") or "cpu") for r in records}) or ["cpu"]
    gpus = sorted({g.get("name", "") for g in (run.hard_env.get("gpus") or []) if isinstance(g, Mapping)} - {""})
    what = ", ".join(gpus) if any(d.startswith("cuda") for d in devices) and gpus else run.hard_env.get("cpu") or ""
    return " · ".join(x for x in ("+".join(devices), str(what)) if x)


def portable_key(r: CaseRecord) -> str:
    """A case's identity without its device: arch, resolved config and the label workload fields but ``device``
    (and the line's name, which a [cuda] table suffixes with the dtype) — how runs of one suite on different
    devices or GPU types are aligned."""
    work = {k: r.workload.get(k) for k in LABEL_KEYS if k != "device"}
    return json.dumps([r.arch, dict(r.config), work], sort_keys=True, default=str)


def side_by_side(runs: Sequence[Run], axis: str | None) -> dict[str, Any]:
    """The cases every run of one suite holds (aligned on their case keys, in the first run's order), each
    labelled by its readable parameters, with each run's median and its ratio to the first run's; the
    cases not in every run are counted per run, not listed. Runs on different devices (a CPU and a GPU, two GPU
    types) are aligned on :func:`portable_key` instead — the same case on each device — and every column is
    headed by its run's device (:func:`run_device`)."""
    devices = [run_device(run, records) for run, records in runs]
    by_device = len({d.split(" · ")[0] for d in devices}) > 1
    key_of = portable_key if by_device else (lambda r: r.case_key)
    index = [{key_of(r): r for r in records} for _, records in runs]
    shared_keys = [k for k in index[0] if all(k in other for other in index[1:])]
    shared = [index[0][k] for k in shared_keys]
    keys = param_columns(shared, axis)
    show_arch = len({r.arch for r in shared}) > 1
    rows, ratios = [], [[] for _ in runs[1:]]
    for key, first in zip(shared_keys, shared):
        base = first.metric("median_ms") if first.ok else None
        cells = []
        for i, by_key in enumerate(index):
            r = by_key[key]
            median = r.metric("median_ms") if r.ok else None
            cell = {"median": num(median) if median is not None else r.status, "status": r.status, "ratio": "",
                    "verdict": ""}
            if i and median is not None and base:
                ratio = median / base
                ratios[i - 1].append(ratio)
                cell.update(ratio=f"{ratio:.3f}×", verdict="same" if abs(ratio - 1) < 0.02 else
                            "faster" if ratio < 1 else "slower")
            elif i:
                cell["ratio"] = "–"
            cells.append(cell)
        rows.append({"line": first.line, "arch": first.arch, "params": [_cell(first.value(k)) for k in keys],
                     "cells": cells})
    geomeans = [f"{math.exp(sum(map(math.log, rs)) / len(rs)):.3f}×" if rs else "–" for rs in ratios]
    not_shared = [{"run": run.id, "n": len(by_key) - len(shared_keys)} for (run, _), by_key in zip(runs, index)]
    return {"runs": [run.id for run, _ in runs], "devices": devices, "by_device": by_device,
            "param_keys": keys, "show_arch": show_arch, "rows": rows,
            "shared": len(shared_keys), "not_shared": [n for n in not_shared if n["n"]], "geomeans": geomeans,
            "hard_differences": hard_differences([run for run, _ in runs])}
