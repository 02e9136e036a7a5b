"""What a run shows, as data: per line the fits of time, memory and MACs vs the swept size — affine (a floor plus
the marginal cost per unit, :func:`harness.analysis.stats.fit_affine`) where the data have a floor, else the scaling
exponent over the scaling regime (:func:`harness.analysis.stats.fit_scaling`, the floor reported apart) — and the ratios between lines
that differ in exactly one parameter, at the largest size both reached. The terminal headline, the
report's first section and ``bench show`` all read these (torch-free).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.contract.records import CaseRecord, RunRecord
from harness.analysis.comparison import Comparison, compare_records
from harness.analysis.stats import AffineFit, ScalingFit, fit_cost
from reports.frames import is_number, sweep_axis, varying_keys

FIT_METRICS: dict[str, str] = {"median_ms": "time", "peak_bytes": "memory", "macs": "MACs"}
"""Metric → its name in a finding, in the order findings list them."""

EXACT_METRICS = frozenset({"macs", "flops", "params", "bytes_moved"})
"""Exact counts (no noise): an affine fit of them is checked within rounding and gets no noise interval."""


@dataclass(frozen=True)
class Ratio:
    """``value`` = a's figure ÷ b's, with a 95% interval when it comes from raw samples; for a timing, the
    :class:`~harness.analysis.comparison.Comparison` it comes from (a over b: its verdict and what it could see)."""

    value: float
    lo: float | None = None
    hi: float | None = None
    processes: int = 0                  # timings: the worker processes the interval is over (1: this process only)
    comparison: Comparison | None = None


@dataclass(frozen=True)
class LineFinding:
    """One line of a run: its parameters (what sets it apart), its fits and how its cases ended."""

    line: str
    params: dict[str, Any]
    fits: dict[str, ScalingFit | AffineFit | None]
    statuses: dict[str, int]


@dataclass(frozen=True)
class Contrast:
    """Two lines that differ in one parameter ``key`` (``a_value`` → ``b_value``), compared at ``x``:
    ``time`` = a's median ÷ b's (> 1: b is faster), ``memory`` and ``macs`` = a's ÷ b's."""

    key: str
    a: str
    b: str
    a_value: Any
    b_value: Any
    x: Any
    time: Ratio | None = None
    memory: Ratio | None = None
    macs: Ratio | None = None


@dataclass(frozen=True)
class Findings:
    run_id: str
    suite: str
    axis: str | None
    lines: list[LineFinding]
    contrasts: list[Contrast]
    statuses: dict[str, int] = field(default_factory=dict)
    busy: int = 0                        # ok cases timed while other processes loaded the machine
    busy_cores: float = 0.0              # the most cores those other processes used
    intervals: str = ""                 # what the timing intervals cover (:func:`interval_note`)

    def fit(self, line: str, metric: str) -> ScalingFit | AffineFit | None:
        return next((lf.fits.get(metric) for lf in self.lines if lf.line == line), None)


def run_findings(run: RunRecord, records: Sequence[CaseRecord]) -> Findings:
    """The findings of one stored run (its plot's x, if the suite names one, is the axis)."""
    return findings(records, run_id=run.id, suite=run.suite, preferred_axis=run.plot.get("x"))


def findings(records: Sequence[CaseRecord], *, run_id: str = "", suite: str = "",
             preferred_axis: str | None = None) -> Findings:
    """Fits per line vs the sweep axis (when it is numeric) and one-parameter contrasts between lines."""
    axis = sweep_axis(records, preferred_axis)
    numeric = axis is not None and all(is_number(r.value(axis)) for r in records)
    keys = [k for k in varying_keys(records) if k != axis]
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    lines = []
    for line, recs in by_line.items():
        params = {k: recs[0].value(k) for k in keys if len({repr(r.value(k)) for r in recs}) == 1}
        fits = {m: _fit(recs, axis, m) if numeric else None for m in FIT_METRICS}
        lines.append(LineFinding(line, params, fits, _count(recs)))
    busy = [r for r in records if r.ok and r.metric("load_busy")]
    return Findings(run_id, suite, axis, lines, _contrasts(lines, by_line, axis), _count(records), len(busy),
                    max((r.metric("load_others_cores") or 0.0 for r in busy), default=0.0), interval_note(records))


def _count(records: Sequence[CaseRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.status] = out.get(r.status, 0) + 1
    return out


def _fit(records: Sequence[CaseRecord], axis: str, metric: str) -> ScalingFit | AffineFit | None:
    """:func:`harness.analysis.stats.fit_cost`: affine (floor + marginal cost per unit) where the data have a floor,
    else the power law over the scaling regime."""
    pts = [(float(r.value(axis)), r.metric(metric)) for r in records if r.ok and r.metric(metric) is not None]
    return (fit_cost([p[0] for p in pts], [p[1] for p in pts], exact=metric in EXACT_METRICS)
            if len(pts) >= 2 else None)


def _contrasts(lines: list[LineFinding], by_line: dict[str, list[CaseRecord]], axis: str | None) -> list[Contrast]:
    """Every pair of lines whose parameters differ in exactly one key, a = the line listed first."""
    out = []
    for i, la in enumerate(lines):
        for lb in lines[i + 1:]:
            if la.params.keys() != lb.params.keys():
                continue
            differ = [k for k in la.params if la.params[k] != lb.params[k]]
            if len(differ) != 1:
                continue
            pair = _largest_shared(by_line[la.line], by_line[lb.line], axis)
            if pair is None:
                continue
            a, b = pair
            key = differ[0]
            out.append(Contrast(key, la.line, lb.line, la.params[key], lb.params[key],
                                a.value(axis) if axis else None, _time_ratio(a, b),
                                _ratio(a.metric("peak_bytes"), b.metric("peak_bytes")),
                                _ratio(a.metric("macs"), b.metric("macs"))))
    return out


def _largest_shared(a: list[CaseRecord], b: list[CaseRecord], axis: str | None
                    ) -> tuple[CaseRecord, CaseRecord] | None:
    """The two lines' ok cases at the largest axis value both have (the only cases when there is no axis)."""
    if axis is None:
        ok_a, ok_b = [r for r in a if r.ok], [r for r in b if r.ok]
        return (ok_a[0], ok_b[0]) if len(ok_a) == 1 and len(ok_b) == 1 else None
    index_b = {repr(r.value(axis)): r for r in b if r.ok}
    shared = [(r, index_b[repr(r.value(axis))]) for r in a if r.ok and repr(r.value(axis)) in index_b]
    if not shared:
        return None
    return max(shared, key=lambda p: p[0].value(axis) if is_number(p[0].value(axis)) else 0)


def _ratio(a: float | None, b: float | None) -> Ratio | None:
    return Ratio(a / b) if a is not None and b else None


def n_processes(r: CaseRecord) -> int:
    """The worker processes a case's timing was measured in (``n_processes``; 1 when not stored)."""
    return max(1, int(r.metric("n_processes") or 1))


def _time_ratio(a: CaseRecord, b: CaseRecord) -> Ratio | None:
    """a's median time ÷ b's with its 95% interval: the one comparison
    (:func:`harness.analysis.comparison.compare_records`), read as a over b; its level (processes, rounds or one
    process) is what the stored timings allow, paired where the two were timed side by side."""
    if not a.samples_s or not b.samples_s:
        return _ratio(a.metric("median_ms"), b.metric("median_ms"))
    c = compare_records(b, a)                         # ratio = a / b
    return Ratio(c.ratio, c.ci_low, c.ci_high, c.n_a if c.level == "processes" else 1, comparison=c)


def interval_note(records: Sequence[CaseRecord]) -> str:
    """What a run's timing intervals cover: ``timing intervals over 5 processes`` or the one-process note."""
    from harness.analysis.process_stats import ONE_PROCESS_NOTE

    counts = sorted({n_processes(r) for r in records if r.ok and r.samples_s})
    if not counts:
        return ""
    if counts == [1]:
        return f"timing intervals: {ONE_PROCESS_NOTE} (bench run --processes N measures each case in N)"
    if counts[0] == 1:
        return f"timing intervals: over {counts[-1]} processes for some cases; {ONE_PROCESS_NOTE} for the others"
    return "timing intervals over " + "/".join(map(str, counts)) + " worker processes per case"
