"""Compare two stored runs case by case: ratio of medians B/A with a bootstrap CI and a verdict.

Pure: stored records in, plain dicts out (``harness.analysis.stats.compare`` does the statistics on the raw
``samples_s``). Cases are aligned on ``case_key``; only cases ``ok`` with timing samples in both
runs are compared, the rest are counted.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from harness.contract.records import CaseRecord, RunRecord, hard_differences
from harness.analysis.stats import SAME_REL_TOL, paired_ratio
from harness.analysis.stats import compare as compare_samples
from reports.frames import sweep_axis
from reports.labels import param_labels

if TYPE_CHECKING:
    import pandas as pd    # imported where a frame is built: `bench run` need not load pandas

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
        import pandas as pd

        return pd.DataFrame(self.rows)


def _timed(r: CaseRecord) -> bool:
    return r.ok and bool(r.samples_s)


def compare_runs(records_a: list[CaseRecord], records_b: list[CaseRecord], axis: str | None = None) -> Comparison:
    """Align on ``case_key`` and compare B against A per case (see ``harness.analysis.stats.compare``)."""
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
    """The ``hard`` fingerprint keys whose values differ between two runs (sorted; a key recorded only since a
    later version and missing on one side is not counted: :func:`harness.contract.records.hard_differences`)."""
    return hard_differences((env_a or {}).get("hard") or {}, (env_b or {}).get("hard") or {})


def pair_records(records_a: list[CaseRecord], records_b: list[CaseRecord], run_a: RunRecord, run_b: RunRecord
                 ) -> list[tuple[CaseRecord, CaseRecord]]:
    """The ok cases of two runs, paired: by ``case_key`` when they share cases; otherwise (two settings of one
    suite, e.g. ``--set dtype=bf16``) by line and the values of the sweep keys."""
    ok_a, ok_b = [r for r in records_a if r.ok], [r for r in records_b if r.ok]
    by_b = {r.case_key: r for r in ok_b}
    shared = [(r, by_b[r.case_key]) for r in ok_a if r.case_key in by_b]
    if shared:
        return shared
    sweep = sorted(set(run_a.spec.sweep if run_a.spec else ()) | set(run_b.spec.sweep if run_b.spec else ()))

    def point(r: CaseRecord) -> tuple:
        return (r.line, *(str(r.value(k)) for k in sweep))
    by_point = {point(r): r for r in ok_b}
    return [(r, by_point[point(r)]) for r in ok_a if point(r) in by_point]


def interleaved_rows(pairs: list[tuple[CaseRecord, CaseRecord]], measured: list[CaseRecord]) -> list[dict[str, Any]]:
    """Per pair, B over A from a re-measurement side by side (``measured``: A's case then B's, pair by pair;
    ``label``: the case as :func:`reports.labels.param_labels` names it):
    the paired per-round ratio with its interval; "same" when the interval holds 1 or the ratio is within
    ``SAME_REL_TOL`` of 1."""
    rows = []
    labels = param_labels([ra for ra, _ in pairs], arch=True)
    for (ra, rb), (ma, mb), label in zip(pairs, zip(measured[::2], measured[1::2]), labels):
        row: dict[str, Any] = {"line": ra.line, "arch": ra.arch, "label": label, "a_status": ma.status,
                               "b_status": mb.status}
        if ma.ok and mb.ok and ma.rounds and len(ma.rounds) == len(mb.rounds) >= 2:
            pr = paired_ratio(mb.samples_s, mb.rounds, ma.samples_s, ma.rounds)
            same = pr.ci_low <= 1.0 <= pr.ci_high or abs(pr.ratio - 1) < SAME_REL_TOL
            row.update(ratio=pr.ratio, ci_low=pr.ci_low, ci_high=pr.ci_high, rounds=pr.n_rounds,
                       a_median_ms=ma.metric("median_ms"), b_median_ms=mb.metric("median_ms"),
                       verdict="same" if same else ("faster" if pr.ratio < 1 else "slower"))
        else:
            row.update(verdict="failed", message=ma.message or mb.message)
        rows.append(row)
    return rows
