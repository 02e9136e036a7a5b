"""Compare two stored runs case by case: ratio of medians B/A with a bootstrap CI and a verdict.

Pure: stored records in, plain dicts out (``harness.stats.compare`` does the statistics on the raw
``samples_s``). Cases are aligned on ``case_key``; only cases ``ok`` with timing samples in both
runs are compared, the rest are counted.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.records import CaseRecord
from harness.stats import compare as compare_samples
from reports.frames import sweep_axis

VERDICTS = ("faster", "slower", "same")


@dataclass
class Comparison:
    """The per-case rows (A's order) and what could not be compared."""

    rows: list[dict[str, Any]]
    axis: str | None
    only_a: int = 0             # case keys stored only in run A
    only_b: int = 0
    not_ok: int = 0             # in both, but not ok (or without samples) in at least one
    counts: dict[str, int] = field(default_factory=dict)
    geomean_ratio: float | None = None

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def _timed(r: CaseRecord) -> bool:
    return r.ok and bool(r.samples_s)


def compare_runs(records_a: list[CaseRecord], records_b: list[CaseRecord], axis: str | None = None) -> Comparison:
    """Align on ``case_key`` and compare B against A per case (see ``harness.stats.compare``)."""
    by_b = {r.case_key: r for r in records_b}
    keys_a = {r.case_key for r in records_a}
    axis = sweep_axis(records_a or records_b, axis)
    out: list[dict[str, Any]] = []
    not_ok = 0
    for a in records_a:
        b = by_b.get(a.case_key)
        if b is None:
            continue
        if not (_timed(a) and _timed(b)):
            not_ok += 1
            continue
        c = compare_samples(a.samples_s, b.samples_s)
        out.append({"case_key": a.case_key, "line": a.line, "arch": a.arch,
                    "axis_value": a.value(axis) if axis else None, **c})
    counts = {v: sum(r["verdict"] == v for r in out) for v in VERDICTS}
    ratios = [r["ratio"] for r in out if r["ratio"] > 0]
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return Comparison(rows=out, axis=axis, only_a=len(keys_a - by_b.keys()), only_b=len(by_b.keys() - keys_a),
                      not_ok=not_ok, counts=counts, geomean_ratio=geomean)


def env_differences(env_a: Mapping[str, Any], env_b: Mapping[str, Any]) -> list[str]:
    """The ``hard`` fingerprint keys whose values differ between two runs (sorted)."""
    ha, hb = (env_a or {}).get("hard", {}), (env_b or {}).get("hard", {})
    return sorted(k for k in ha.keys() | hb.keys() if ha.get(k) != hb.get(k))
