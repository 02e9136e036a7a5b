"""One suite's cases over the commits of its stored runs: series, change points, distance from the best, drift
(pure, torch-free; the commits' git order comes from the caller).

A **point** is one stored run's record of a case, placed by its run's commit in git order (runs at one commit in
the order they started). A point from a dirty tree is shown but never compared (it is not that commit's code), nor
is a point whose status is not ``ok``. The hard environment (:func:`harness.contract.records.hard_differences`)
cuts a series into **segments**: points of two machines or two software stacks are never compared; each cut is
marked with the keys that changed.

**Change points (timing).** Within a segment, each usable point is judged by the gate's timing verdict against the
runs before it (two to :data:`WINDOW`, none before the last flagged step) as a check against a baseline measured on
that many *occasions* (:func:`reports.check.timing.occasion_timing_verdict`: each run's per-process medians, the
spread between the runs in the standard error, ``K - 1`` degrees of freedom), so the interval covers what moves a
case between runs on this machine; a point with fewer than two runs before it is not judged. A step is **flagged** when the verdict is ``regressed`` or
``improved`` *and* the next usable point confirms it (its verdict against the same runs goes the same way): a step
inside the noise (``unchanged``/``inconclusive``) is not flagged, nor is a single outlier that the next run takes
back. A step at the latest point has no next one: it is flagged "unconfirmed". A step that a later run within
:data:`WINDOW` points takes back (``unchanged`` against the runs before the step) is a **transient** (a burst of load,
or a change reverted soon after): shown with both commits, not counted as a change point. A point measured while other
processes used the machine carries the gate's busy note; its flag says so. The **smallest flaggable step** of a
series is the median of its verdicts' minimum detectable effects (``mde``: the floor, or what the interval's width
lets the test see).

**Exact metrics** (:data:`reports.check.metrics.DETERMINISTIC`: MACs, FLOPs, parameters, analytic bytes) are steps:
every change between usable neighbours of one segment is flagged at the commit where it happened. **Status
changes** (ok → oom / timeout / error and back) are flagged likewise.

**Latest vs best**: the latest usable median over the best (lowest) of its segment. **Drift**: a log-linear trend of
the medians since the segment's last flagged step (:func:`harness.analysis.fits.fit_loglog` of the median against
``e^index``), its total change over those points with a 95 % interval; flagged when the interval excludes no change
and the total exceeds the gate's smallest effect (:data:`reports.check.timing.MIN_EFFECT`), with five points at least.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.analysis.fits import fit_loglog
from harness.contract.records import LATER_HARD_KEYS, CaseRecord, RunRecord, hard_differences
from reports.check.baseline import process_medians_ms
from reports.check.metrics import DETERMINISTIC
from reports.check.timing import MIN_EFFECT, TimingVerdict, busy_note, n_processes, occasion_timing_verdict
from reports.labels import case_labels

TIMING_METRIC = "median_ms"
WINDOW = 5
"""Runs before a point that it is compared with, as occasions (the gate's default number of baseline occasions)."""
DRIFT_MIN_POINTS = 5


@dataclass(frozen=True)
class Point:
    """One run's record of a case. ``order``: the commit's place in git order (None: the repository lacks it)."""

    run_id: str
    commit: str
    subject: str
    order: int | None
    started_at: str
    dirty: bool
    status: str
    value: float | None                         # the followed metric (median_ms by default)
    ci_low: float | None
    ci_high: float | None
    processes: int
    exact: Mapping[str, float] = field(default_factory=dict)
    env_change: tuple[str, ...] = ()            # hard keys that differ from the point before (a segment starts)
    cpu_unknown: bool = False                   # recorded before the CPU identity was (cpu_id)
    busy: str = ""
    samples_s: tuple[float, ...] = field(default=(), repr=False)
    rounds: tuple[int, ...] = field(default=(), repr=False)
    process_ms: tuple[float, ...] = field(default=(), repr=False)   # per-process medians (ms)

    @property
    def short(self) -> str:
        return self.commit[:8] if self.commit else "?"

    @property
    def usable(self) -> bool:
        return self.status == "ok" and not self.dirty and self.order is not None


@dataclass(frozen=True)
class Flag:
    """A flagged point: ``kind`` slower | faster | metric | status, or transient (a timing step taken back soon
    after: shown, not a change point); ``index`` into the series' points."""

    index: int
    commit: str
    kind: str
    text: str
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confirmed: bool = True


@dataclass(frozen=True)
class Drift:
    total: float                                # the trend's change over the window (0.03 = 3 % slower)
    low: float
    high: float
    n: int
    since: str                                  # the window's first commit
    flagged: bool


@dataclass(frozen=True)
class Series:
    key: str
    name: str
    metric: str
    points: tuple[Point, ...]
    flags: tuple[Flag, ...] = ()
    comparisons: tuple[tuple[int, TimingVerdict], ...] = field(default=(), repr=False)   # (point index, vs previous)
    smallest_step: float | None = None
    latest_vs_best: tuple[float, str] | None = None     # (latest / best - 1, best's commit)
    drift: Drift | None = None


@dataclass(frozen=True)
class History:
    suite: str
    quick: bool
    metric: str
    series: tuple[Series, ...]
    notes: tuple[str, ...] = ()


def series_key(run: RunRecord, r: CaseRecord) -> str:
    """A case's identity across commits: its line, arch, label workload fields and the suite's sweep values (not
    the case key, which a changed default config would change)."""
    sweep = sorted(run.spec.sweep) if run.spec else []
    return json.dumps([r.line, r.params(), {k: r.value(k) for k in sweep}], sort_keys=True, default=str)


def _point(run: RunRecord, r: CaseRecord, order: tuple[int, str] | None, metric: str, env_change: tuple[str, ...]
           ) -> Point:
    soft = run.env.get("soft") or {}
    timing = metric == TIMING_METRIC
    return Point(run_id=run.id, commit=run.commit, subject=order[1] if order else "", order=order[0] if order else None,
                 started_at=run.started_at, dirty=bool(soft.get("dirty")), status=r.status, value=r.metric(metric),
                 ci_low=r.metric("ci_low_ms") if timing else None, ci_high=r.metric("ci_high_ms") if timing else None,
                 processes=n_processes(r), exact={m: v for m in DETERMINISTIC if (v := r.metric(m)) is not None},
                 env_change=env_change, cpu_unknown=not any(k in run.hard_env for k in LATER_HARD_KEYS),
                 busy=busy_note(r), samples_s=tuple(r.samples_s), rounds=tuple(r.rounds),
                 process_ms=tuple(process_medians_ms(r)))


def _compare(window: Sequence[Point], b: Point) -> TimingVerdict | None:
    """``b`` against the runs before it (two or more), taken as the occasions of a baseline."""
    if len(window) < 2 or not b.process_ms or not all(p.process_ms for p in window):
        return None
    return occasion_timing_verdict([p.process_ms for p in window], b.process_ms, cand_processes=len(b.process_ms))


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"


def _segments(points: Sequence[Point]) -> list[list[int]]:
    """Indices of the usable points, cut where the hard environment changed."""
    segs: list[list[int]] = [[]]
    for i, p in enumerate(points):
        if p.env_change and segs[-1]:
            segs.append([])
        if p.usable:
            segs[-1].append(i)
    return [s for s in segs if s]


def _timing_flags(points: Sequence[Point], seg: Sequence[int]) -> tuple[list[Flag], list[tuple[int, TimingVerdict]]]:
    flags, comps = [], []
    start = 0                                   # the window never reaches back across a flagged step
    burst: set[int] = set()                     # positions inside a transient: left out of later windows
    j = 0
    while j + 1 < len(seg):
        j += 1
        window = [points[seg[k]] for k in range(start, j) if k not in burst][-WINDOW:]
        b = points[seg[j]]
        v = _compare(window, b) if len(window) >= 2 else None      # a step needs two runs before it
        if v is None:
            continue
        comps.append((seg[j], v))
        if v.verdict not in ("regressed", "improved"):
            continue
        confirmed = None
        if j + 1 < len(seg):
            after = _compare(window, points[seg[j + 1]])
            if after is None or after.verdict != v.verdict:
                continue                    # taken back by the next run: an outlier, not a step
            confirmed = True
        kind = "slower" if v.verdict == "regressed" else "faster"
        against = (f"the {len(window)} runs {window[0].short}..{window[-1].short}" if len(window) > 1
                   else window[0].short)
        back_at = next((k for k in range(j + 2, min(len(seg), j + 1 + WINDOW))
                        if (vk := _compare(window, points[seg[k]])) is not None and vk.verdict == "unchanged"), None)
        back = points[seg[back_at]] if back_at is not None else None
        text = (f"{kind} ×{v.ratio:.3f} [{v.ci_low:.3f}, {v.ci_high:.3f}] vs {against}"
                + ("" if confirmed else " (latest point: unconfirmed)")
                + (f"; back to that level at {back.short}: transient" if back else "")
                + (f"; {b.busy}" if b.busy else ""))
        flags.append(Flag(seg[j], b.commit, "transient" if back else kind, text, v.ratio, v.ci_low, v.ci_high,
                          confirmed=bool(confirmed)))
        if back_at is None:
            start = j
        else:
            burst.update(range(j, back_at))
            j = back_at - 1                     # judged again from the run that took it back
    return flags, comps


def _step_flags(points: Sequence[Point], seg: Sequence[int]) -> list[Flag]:
    flags = []
    for j in range(1, len(seg)):
        a, b = points[seg[j - 1]], points[seg[j]]
        moved = [f"{m} {_fmt(a.exact[m])} → {_fmt(b.exact[m])}" for m in DETERMINISTIC
                 if m in a.exact and m in b.exact and a.exact[m] != b.exact[m]]
        if moved:
            flags.append(Flag(seg[j], b.commit, "metric", "; ".join(moved)))
    return flags


def _status_flags(points: Sequence[Point]) -> list[Flag]:
    seen = [i for i, p in enumerate(points) if not p.dirty and p.order is not None]
    return [Flag(j, points[j].commit, "status", f"status {points[i].status} → {points[j].status}")
            for i, j in zip(seen, seen[1:]) if points[i].status != points[j].status]


def change_points(s: Series) -> list[Flag]:
    """The flags that are change points (all but transients)."""
    return [f for f in s.flags if f.kind != "transient"]


def _drift(points: Sequence[Point], seg: Sequence[int], flags: Sequence[Flag]) -> Drift | None:
    steps = [f.index for f in flags if f.kind in ("slower", "faster")]
    window = [i for i in seg if not steps or i >= max(steps)]
    vals = [points[i].value for i in window]
    if len(window) < DRIFT_MIN_POINTS or any(v is None or v <= 0 for v in vals):
        return None
    fit = fit_loglog(np.exp(np.arange(len(window), dtype=float)), vals)
    if fit is None or math.isnan(fit.ci_low):
        return None
    span = len(window) - 1
    total, low, high = (math.expm1(k * span) for k in (fit.exponent, fit.ci_low, fit.ci_high))
    flagged = (low > 0 or high < 0) and abs(total) > MIN_EFFECT
    return Drift(total, low, high, len(window), points[window[0]].commit, flagged)


def _series(key: str, name: str, metric: str, points: list[Point]) -> Series:
    segs = _segments(points)
    flags: list[Flag] = []
    comps: list[tuple[int, TimingVerdict]] = []
    for seg in segs:
        if metric == TIMING_METRIC:
            f, c = _timing_flags(points, seg)
            flags += f
            comps += c
        flags += _step_flags(points, seg)
    flags += _status_flags(points)
    flags.sort(key=lambda f: f.index)
    mdes = [v.mde for _, v in comps if v.mde is not None]
    smallest = float(np.median(mdes)) if mdes else None
    latest = drift = None
    if segs:
        last = segs[-1]
        vals = [(points[i].value, points[i].commit) for i in last if points[i].value is not None]
        if vals:
            best = min(vals)
            latest = (vals[-1][0] / best[0] - 1.0, best[1]) if best[0] > 0 else None
        if metric == TIMING_METRIC:
            drift = _drift(points, last, [f for f in flags if f.index in last])
    return Series(key, name, metric, tuple(points), tuple(flags), tuple(comps), smallest, latest, drift)


def build_history(runs: Sequence[tuple[RunRecord, Sequence[CaseRecord]]], order: Mapping[str, tuple[int, str]],
                  *, suite: str, quick: bool, metric: str = TIMING_METRIC, case: str = "") -> History:
    """The history of ``runs`` (each with its records) of one suite. ``order``: commit → (git order, subject), as
    :func:`harness.engine.commits.git_order` gives it; runs at commits it lacks are left out and counted in the
    notes. ``case``: keep the series whose name contains it (case-insensitive)."""
    notes = []
    placed = [(run, recs) for run, recs in runs if run.commit in order]
    missing = len(runs) - len(placed)
    if missing:
        notes.append(f"{missing} run(s) left out: their commit is not in this repository's history (or before --since)")
    placed.sort(key=lambda rr: (order[rr[0].commit][0], rr[0].started_at))
    by_key: dict[str, list[Point]] = {}
    names: dict[str, str] = {}
    prev_env: dict[str, Mapping[str, Any]] = {}
    for run, recs in placed:
        for r, label in zip(recs, case_labels(recs, arch=True)):
            key = series_key(run, r)
            names.setdefault(key, label)
            before = prev_env.get(key)
            change = tuple(hard_differences(before, run.hard_env)) if before is not None else ()
            prev_env[key] = run.hard_env
            by_key.setdefault(key, []).append(_point(run, r, order[run.commit], metric, change))
    wanted = [k for k in by_key if case.lower() in names[k].lower()]
    series = tuple(_series(k, names[k], metric, by_key[k]) for k in wanted)
    return History(suite, quick, metric, series, tuple(notes))


def history_dict(h: History) -> dict[str, Any]:
    """The history as JSON-able data (``bench history --json``)."""
    def point(p: Point) -> dict[str, Any]:
        return {"run_id": p.run_id, "commit": p.commit, "subject": p.subject, "order": p.order, "dirty": p.dirty,
                "status": p.status, "value": p.value, "ci_low": p.ci_low, "ci_high": p.ci_high,
                "processes": p.processes, "exact": dict(p.exact), "env_change": list(p.env_change),
                "cpu_unknown": p.cpu_unknown, "busy": p.busy, "started_at": p.started_at}

    def series(s: Series) -> dict[str, Any]:
        return {"name": s.name, "metric": s.metric, "points": [point(p) for p in s.points],
                "flags": [{"index": f.index, "commit": f.commit, "kind": f.kind, "text": f.text, "ratio": f.ratio,
                           "ci_low": f.ci_low, "ci_high": f.ci_high, "confirmed": f.confirmed} for f in s.flags],
                "smallest_flaggable_step": s.smallest_step,
                "latest_vs_best": ({"worse_by": s.latest_vs_best[0], "best_commit": s.latest_vs_best[1]}
                                   if s.latest_vs_best else None),
                "drift": (None if s.drift is None else {"total": s.drift.total, "low": s.drift.low,
                                                        "high": s.drift.high, "points": s.drift.n,
                                                        "since": s.drift.since, "flagged": s.drift.flagged})}
    return {"suite": h.suite, "quick": h.quick, "metric": h.metric, "notes": list(h.notes),
            "series": [series(s) for s in h.series]}
