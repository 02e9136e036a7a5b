"""Compare two stored runs case by case: B over A with its 95 % interval, the level it covers and a verdict.

Pure: stored records in, plain dicts out (:func:`harness.analysis.comparison.compare_records` does the statistics,
the one comparison the gate, the run headline and the claims use). Cases are aligned on ``case_key``; only cases
``ok`` with timing samples in both runs are compared, the rest are counted. The verdict says it from B's side:
``faster`` (improved), ``slower`` (regressed), ``same`` (unchanged: the whole interval within the floor, 5 %) or
``inconclusive`` (neither shown: ``mde`` is the smallest slowdown it could have seen).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from harness.contract.records import CaseRecord, RunRecord
from harness.analysis.comparison import Comparison as TimeComparison
from harness.analysis.comparison import Timing, compare_records, compare_timings
from reports.frames import sweep_axis
from reports.labels import param_labels

if TYPE_CHECKING:
    import pandas as pd    # imported where a frame is built: `bench run` need not load pandas

VERDICTS = ("faster", "slower", "same", "inconclusive")
WORDS = {"improved": "faster", "regressed": "slower", "unchanged": "same", "inconclusive": "inconclusive"}
"""The comparison's verdict (B as the candidate) in ``bench compare``'s words."""


def row(c: TimeComparison) -> dict[str, Any]:
    """A comparison as ``bench compare`` prints it: its fields and the verdict in :data:`WORDS`."""
    return {**c.as_dict(), "verdict": WORDS[c.verdict], "over": c.units_text}


@dataclass
class RunComparison:
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


def compare_runs(records_a: list[CaseRecord], records_b: list[CaseRecord], axis: str | None = None) -> RunComparison:
    """Align on ``case_key`` and compare B against A per case (:func:`harness.analysis.comparison.compare_records`)."""
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
        out.append({"case_key": a.case_key, "line": a.line, "arch": a.arch,
                    "axis_value": a.value(axis) if axis else None, **row(compare_records(a, b))})
    counts = {v: sum(r["verdict"] == v for r in out) for v in VERDICTS}
    ratios = [r["ratio"] for r in out if r["ratio"] > 0]
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return RunComparison(rows=out, axis=axis, only_a=len(keys_a - by_b.keys()), only_b=len(by_b.keys() - keys_a),
                      not_ok=not_ok, counts=counts, geomean_ratio=geomean)


Comparison = RunComparison
"""The name this class had before :mod:`harness.analysis.comparison` gave "comparison" its one meaning."""


def env_differences(env_a: Mapping[str, Any], env_b: Mapping[str, Any]) -> list[str]:
    """The ``hard`` fingerprint keys whose values differ between two runs (sorted)."""
    ha, hb = (env_a or {}).get("hard", {}), (env_b or {}).get("hard", {})
    return sorted(k for k in ha.keys() | hb.keys() if ha.get(k) != hb.get(k))


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
    the one comparison, paired (the same rounds; over processes where both were timed in several)."""
    rows = []
    labels = param_labels([ra for ra, _ in pairs], arch=True)
    for (ra, rb), (ma, mb), label in zip(pairs, zip(measured[::2], measured[1::2]), labels):
        out: dict[str, Any] = {"line": ra.line, "arch": ra.arch, "label": label, "a_status": ma.status,
                               "b_status": mb.status}
        if ma.ok and mb.ok and ma.rounds and len(ma.rounds) == len(mb.rounds) >= 2:
            c = compare_timings(Timing.of(ma.samples_s, ma.rounds, ma.metric("n_processes")),
                                Timing.of(mb.samples_s, mb.rounds, mb.metric("n_processes")), paired=True)
            out.update(row(c), rounds=len(ma.rounds))
        else:
            out.update(verdict="failed", message=ma.message or mb.message)
        rows.append(out)
    return rows
