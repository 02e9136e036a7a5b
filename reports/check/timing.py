"""The gate's timing verdict: one case's timing against the baseline's, as :mod:`harness.analysis.comparison`
judges any two timings (pure, torch-free).

The rule (levels, the equivalence floor, the test, the smallest detectable slowdown) is the comparison's; this
module reads a case's stored sides into it and adds what only the gate knows: a timing measured on a busy
machine decides nothing (:func:`not_on_busy`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from harness.analysis.comparison import ALPHA, FLOOR, VERDICTS, Comparison, Timing, compare_occasions, compare_timings
from harness.analysis.stats import round_summary
from harness.contract.records import CaseRecord

MIN_EFFECT = FLOOR
"""The smallest timing change that counts (5 %): :data:`harness.analysis.comparison.FLOOR`."""

TIMING_VERDICTS = VERDICTS
__all__ = ["ALPHA", "MIN_EFFECT", "TIMING_VERDICTS", "TimingVerdict", "timing_verdict", "process_timing_verdict",
           "occasion_timing_verdict", "round_cv", "n_processes", "busy_note", "not_on_busy"]


@dataclass(frozen=True)
class TimingVerdict:
    """The candidate's timing against the baseline's: the :class:`~harness.analysis.comparison.Comparison`
    (candidate over baseline), the raw sample counts of both sides, and whether the candidate was timed on a
    busy machine (then a regression or improvement reads ``inconclusive``)."""

    comparison: Comparison
    n_base: int = 0
    n_cand: int = 0
    busy: bool = False

    @property
    def verdict(self) -> str:
        v = self.comparison.verdict
        return "inconclusive" if self.busy and v in ("regressed", "improved") else v

    ratio = property(lambda self: self.comparison.ratio)
    ci_low = property(lambda self: self.comparison.ci_low)
    ci_high = property(lambda self: self.comparison.ci_high)
    mde = property(lambda self: self.comparison.mde)
    floor = property(lambda self: self.comparison.floor)
    paired = property(lambda self: self.comparison.paired)
    level = property(lambda self: self.comparison.level)
    base_median_ms = property(lambda self: self.comparison.a_ms)
    cand_median_ms = property(lambda self: self.comparison.b_ms)

    @property
    def over_processes(self) -> bool:
        """Judged over processes or over the baseline's occasions (not within one process)."""
        return self.comparison.level in ("processes", "occasions")

    @property
    def occasions(self) -> int:
        """The occasions the baseline was measured on as the verdict used them (1 unless over occasions)."""
        return self.comparison.n_a if self.comparison.level == "occasions" else 1

    @property
    def processes(self) -> tuple[int, int]:
        """Worker processes of the baseline and the candidate as the verdict counted them (1 within one)."""
        c = self.comparison
        return (c.n_a, c.n_b) if c.level == "processes" else (1, 1)

    @property
    def mde_text(self) -> str:
        """``MDE 12%, 5 paired processes``, ``MDE 30%, 5+5 processes, 1 baseline occasion``, ``MDE 9%, 5 baseline
        occasions`` or ``MDE 40%, 8+8 rounds`` (the level the smallest detectable slowdown rests on)."""
        c = self.comparison
        one = ", 1 baseline occasion" if c.level == "processes" and not c.paired else ""
        return f"MDE {100 * c.mde:.0f}%, {c.units_text}{one}"


def timing_verdict(base_samples: Sequence[float], base_rounds: Sequence[int] | None,
                   cand_samples: Sequence[float], cand_rounds: Sequence[int] | None, *,
                   paired: bool = False, base_processes: int = 1, cand_processes: int = 1,
                   base_occasions_ms: Sequence[Sequence[float]] = (), floor: float = FLOOR) -> TimingVerdict:
    """The verdict on one case's timing (seconds per call on both sides): the comparison of the candidate over the
    baseline at the highest level both sides allow (:func:`harness.analysis.comparison.compare_timings`).

    ``*_rounds``: samples per round, consecutive in the samples. ``paired=True``: both sides were measured side by
    side (the same rounds, process k of each alternately); it needs the rounds of both, and raises ValueError
    without them. ``*_processes``: the worker processes each side was measured in. ``base_occasions_ms``: a
    baseline measured on two occasions or more (per occasion its per-process medians, ms): unless ``paired``,
    the verdict is over occasions."""
    if not base_samples or not cand_samples:
        raise ValueError("timing_verdict() needs samples on both sides")
    if paired and (not base_rounds or not cand_rounds):
        raise ValueError("a paired timing needs the rounds of both sides")
    a = Timing.of(base_samples, base_rounds, base_processes, base_occasions_ms)
    b = Timing.of(cand_samples, cand_rounds, cand_processes)
    return TimingVerdict(compare_timings(a, b, paired=paired, floor=floor), len(base_samples), len(cand_samples))


def process_timing_verdict(base_groups: Sequence[Sequence[float]], cand_groups: Sequence[Sequence[float]],
                           paired: bool = False) -> TimingVerdict:
    """The verdict over processes from each side's samples cut by process (two processes or more a side; one round
    each as stored); ``paired``: process k of each side ran alternately with the other's."""
    def timing(groups: Sequence[Sequence[float]]) -> Timing:
        return Timing.of([x for g in groups for x in g], [len(g) for g in groups], len(groups))
    return TimingVerdict(compare_timings(timing(base_groups), timing(cand_groups), paired=paired),
                         sum(len(g) for g in base_groups), sum(len(g) for g in cand_groups))


def occasion_timing_verdict(base_occasions_ms: Sequence[Sequence[float]], cand_ms: Sequence[float], *,
                            cand_processes: int = 1) -> TimingVerdict:
    """The verdict against a baseline measured on several occasions (per occasion its per-process medians in ms)
    from the candidate's per-process medians (ms) alone."""
    c = compare_occasions(base_occasions_ms, cand_ms)
    return TimingVerdict(c, sum(len(o) for o in base_occasions_ms), max(len(cand_ms), cand_processes))


def round_cv(samples: Sequence[float], rounds: Sequence[int] | None) -> float | None:
    """The between-round coefficient of variation a baseline file stores with a timing (None without rounds)."""
    if not rounds:
        return None
    return round_summary(samples, rounds).get("round_cv")


def n_processes(rec: CaseRecord) -> int:
    """The worker processes a record's timing was measured in (``n_processes``; 1 when not stored)."""
    return max(1, int(rec.metric("n_processes") or 1))


def busy_note(cand: CaseRecord) -> str:
    """"machine busy: ..." when other processes used more than half a core while ``cand`` was timed."""
    if not cand.metric("load_busy"):
        return ""
    return f"machine busy: other processes used {cand.metric('load_others_cores') or 0:.2f} cores while timed"


def not_on_busy(v: TimingVerdict | None, busy: str) -> TimingVerdict | None:
    """A timing measured on a busy machine (``busy``: its :func:`busy_note`) decides nothing: a regression or
    improvement becomes inconclusive."""
    if v is not None and busy:
        return dataclasses.replace(v, busy=True)
    return v
