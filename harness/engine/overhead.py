"""Where a run's wall time goes: the measured parts and the harness's overhead around them.

Every case's record carries its parts in ``metrics`` (seconds, :data:`CASE_PARTS`): the counting pass on
fake tensors, the build, the cold call and warm-up, the timed samples and the memory pass. A run adds its
wall time and what happened outside the cases (process start-up, calibration, worker start-ups) and
:func:`run_overhead` turns them into shares of the wall time:

    overhead = wall − (timed samples + warm-up incl. the cold call + memory pass + counting pass)

Build, imports, worker start-ups, calibration and store writes are overhead. Torch-free (stored with the
run's options; reports and ``bench run`` read it back).
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

MEASURED: tuple[str, ...] = ("timed", "warmup", "memory", "count", "compile", "energy")
"""The parts that are measurement, not overhead (what the run's overhead share leaves out; compiling is measured: ``compile_s``; the
energy pass of ``--energy`` is a measuring pass like the memory pass: harness.instruments.energy)."""
CASE_PARTS: tuple[str, ...] = ("count", "build", "compile", "warmup", "timed", "memory", "energy")
"""Per-case parts, stored as ``metrics[f"time_{part}_s"]``."""
LABELS: dict[str, str] = {"timed": "timed", "warmup": "warm-up", "memory": "memory", "count": "counting",
                          "build": "build", "compile": "compile", "cases_other": "in cases, other", "workers": "worker start",
                          "calibrate": "calibration", "startup": "start-up", "other": "other", "energy": "energy"}


def metric_name(part: str) -> str:
    return f"time_{part}_s"


def process_age_s(pid: int | None = None) -> float:
    """Seconds since this process (or ``pid``) was created: its imports and set-up before a run opens."""
    return max(0.0, time.time() - psutil.Process(pid or os.getpid()).create_time())


def warmup_shares(total_s: float, timed_s: Iterable[float], weights: Iterable[float]) -> list[float]:
    """Split the non-sample time of an interleaved measurement (``total_s`` minus every side's timed samples)
    among its sides in proportion to ``weights`` (each side's cold call + warm-up calls × its median call);
    equal shares when every weight is 0. Never negative."""
    timed, w = list(timed_s), [max(0.0, x) for x in weights]
    rest = max(0.0, total_s - sum(timed))
    if not w:
        return []
    total_w = sum(w)
    return [rest * x / total_w if total_w > 0 else rest / len(w) for x in w]


@dataclass(frozen=True)
class RunOverhead:
    """A run's wall time split into parts (seconds); ``shares`` are fractions of ``wall_s`` summing to 1."""

    wall_s: float
    parts: Mapping[str, float] = field(default_factory=dict)
    n_cases: int = 0
    worker_starts: int = 0

    @property
    def measured_s(self) -> float:
        return sum(self.parts.get(p, 0.0) for p in MEASURED)

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.measured_s

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def shares(self) -> dict[str, float]:
        """Each part's share of the wall time; the parts (overhead's breakdown included) sum to 1."""
        if self.wall_s <= 0:
            return {}
        return {k: v / self.wall_s for k, v in self.parts.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "parts": dict(self.parts), "n_cases": self.n_cases,
                "worker_starts": self.worker_starts, "overhead_s": self.overhead_s,
                "overhead_share": self.overhead_share}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunOverhead:
        return cls(wall_s=float(d["wall_s"]), parts={k: float(v) for k, v in d.get("parts", {}).items()},
                   n_cases=int(d.get("n_cases", 0)), worker_starts=int(d.get("worker_starts", 0)))


def case_parts(metrics: Mapping[str, float]) -> dict[str, float]:
    """The per-case parts a record carries (absent parts are 0: e.g. a case skipped before its build)."""
    return {p: float(metrics.get(metric_name(p), 0.0) or 0.0) for p in CASE_PARTS}


def run_overhead(wall_s: float, cases: Iterable[tuple[Mapping[str, float], float | None]], *,
                 startup_s: float = 0.0, calibrate_s: float = 0.0, workers_s: float = 0.0, worker_starts: int = 0
                 ) -> RunOverhead:
    """Account a run: ``cases`` gives each case's (metrics, duration_s); duration None for a case timed in an
    interleaved group (the group's cases overlap in time). The parts are the sums of the case parts,
    ``cases_other`` (time inside lone cases outside those parts: plug-in loading, failures), the run's
    ``startup``/``calibrate``/``workers`` time, and ``other`` — whatever of the wall time is left (result
    transfer, store writes, progress, gc, a timed-out case's wait, a group's time outside its cases' parts).
    Parts never exceed the wall: a negative remainder raises (the accounting would be wrong)."""
    parts = dict.fromkeys(CASE_PARTS, 0.0)
    parts["cases_other"] = 0.0
    n = 0
    for metrics, duration_s in cases:
        n += 1
        cp = case_parts(metrics)
        for k, v in cp.items():
            parts[k] += v
        if duration_s is not None:
            parts["cases_other"] += max(0.0, duration_s - sum(cp.values()))
    parts.update(workers=workers_s, calibrate=calibrate_s, startup=startup_s)
    rest = wall_s - sum(parts.values())
    if rest < -1e-3 * max(1.0, wall_s):
        raise ValueError(f"overhead accounting exceeds the wall time by {-rest:.3f} s: the parts overlap")
    parts["other"] = max(0.0, rest)
    return RunOverhead(wall_s=wall_s, parts=parts, n_cases=n, worker_starts=worker_starts)


def summary_line(o: RunOverhead) -> str:
    """One line for the end of a run: the wall time, each measured part's share, the overhead's share and
    its largest parts."""
    s = o.shares
    measured = " · ".join(f"{LABELS[p]} {s.get(p, 0.0):.0%}" for p in MEASURED
                          if p not in ("compile", "energy") or s.get(p))
    breakdown = sorted(((v, k) for k, v in s.items() if k not in MEASURED and v >= 0.005), reverse=True)
    detail = ", ".join(f"{LABELS.get(k, k)} {v:.0%}" for v, k in breakdown)
    workers = f"; {o.worker_starts} worker start{'s' if o.worker_starts != 1 else ''}" if o.worker_starts else ""
    return (f"time: {o.wall_s:,.1f} s wall, {o.n_cases} cases — {measured} · overhead {o.overhead_share:.0%}"
            + (f" ({detail}{workers})" if detail or workers else ""))
