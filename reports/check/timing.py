"""The statistics of the gate's timing verdict: one case's samples against the baseline's (pure, torch-free).

The rule (the floor, the Mann–Whitney test, paired and over-process verdicts, the minimum detectable effect) is
stated in :mod:`reports.check`'s docstring; this module computes it. A timing measured on a busy machine decides
nothing (:func:`not_on_busy`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from harness.analysis.process_stats import occasion_ratio, paired_process_ratio, process_groups, process_ratio
from harness.contract.records import CaseRecord
from harness.analysis.stats import compare as compare_samples
from harness.analysis.stats import paired_ratio, round_summary

MIN_EFFECT = 0.05
"""The smallest timing change that counts (5 %), however steady the timings."""
NOISE_MULTIPLE = 3.0
"""A timing change counts only beyond this many between-round coefficients of variation."""
ALPHA = 0.002
"""Significance level of the two-sided Mann–Whitney U test on the raw samples (asv's default)."""

TIMING_VERDICTS = ("regressed", "improved", "unchanged", "inconclusive")


def effect_floor(base_round_cv: float | None, cand_round_cv: float | None) -> float:
    """The timing change that counts: ``max(MIN_EFFECT, NOISE_MULTIPLE · max of the round CVs available)``."""
    cvs = [c for c in (base_round_cv, cand_round_cv) if c is not None and math.isfinite(c)]
    return max(MIN_EFFECT, NOISE_MULTIPLE * max(cvs)) if cvs else MIN_EFFECT


@dataclass(frozen=True)
class TimingVerdict:
    """The candidate's timing against the baseline's: ``ratio`` = candidate / baseline median (paired: the
    paired ratio) with its 95 % interval, the Mann–Whitney p (None when paired), the floor that counts, and
    the verdict (one of :data:`TIMING_VERDICTS`)."""

    verdict: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float | None
    floor: float
    base_median_ms: float
    cand_median_ms: float
    paired: bool = False
    n_base: int = 0
    n_cand: int = 0
    mde: float | None = None            # the smallest slowdown this check could have seen (see timing_verdict)
    processes: tuple[int, int] = (1, 1)  # worker processes of the baseline and the candidate
    over_processes: bool = False        # judged over processes (:func:`process_timing_verdict`), not samples
    occasions: int = 1                  # occasions the baseline was measured on (>= 2: :func:`occasion_timing_verdict`)

    @property
    def mde_text(self) -> str:
        """``MDE 12%, 5+5 processes`` or ``MDE 30%, not over processes (1+5)`` (a side measured in one process:
        its interval covers that process only; :func:`power_line` says so in full)."""
        if self.mde is None:
            return ""
        if self.occasions > 1:
            return f"MDE {100 * self.mde:.0f}%, {self.occasions} baseline occasions"
        if self.over_processes:
            one = "" if self.paired else ", 1 baseline occasion"
            return f"MDE {100 * self.mde:.0f}%, {self.processes[0]}+{self.processes[1]} processes{one}"
        return f"MDE {100 * self.mde:.0f}%, not over processes ({self.processes[0]}+{self.processes[1]})"


def classify(ratio: float, floor: float, significant: bool) -> str:
    """One of :data:`TIMING_VERDICTS`: ``unchanged`` within the floor whatever the test says, ``regressed`` /
    ``improved`` beyond it when significant, else ``inconclusive``."""
    if abs(math.log(ratio)) <= math.log1p(floor):
        return "unchanged"
    if ratio > 1.0 + floor and significant:
        return "regressed"
    if ratio < 1.0 / (1.0 + floor) and significant:
        return "improved"
    return "inconclusive"


def round_cv(samples: Sequence[float], rounds: Sequence[int] | None) -> float | None:
    if not rounds:
        return None
    return round_summary(samples, rounds).get("round_cv")


def timing_verdict(base_samples: Sequence[float], base_rounds: Sequence[int] | None,
                   cand_samples: Sequence[float], cand_rounds: Sequence[int] | None, *,
                   paired: bool = False, base_processes: int = 1, cand_processes: int = 1,
                   base_occasions_ms: Sequence[Sequence[float]] = ()) -> TimingVerdict:
    """The verdict on one case's timing (seconds per call on both sides; the rule is in the module docstring).

    ``*_rounds``: samples per round, consecutive in the samples (empty or None: no rounds, no round CV).
    ``paired=True`` needs both sides measured in the same rounds (at least two); raises ValueError otherwise.
    ``*_processes``: the worker processes each side was measured in (its rounds, process by process:
    :func:`harness.analysis.process_stats.process_groups`); with two or more on both sides the verdict is over processes
    (:func:`process_timing_verdict`) whatever ``paired`` says. ``base_occasions_ms``: a baseline measured on two
    occasions or more (per occasion, its per-process medians in ms): unless ``paired``, the verdict is over
    occasions (:func:`occasion_timing_verdict`), the only one that covers the drift between a baseline's
    occasion and the check's."""
    base = np.asarray(base_samples, dtype=np.float64)
    cand = np.asarray(cand_samples, dtype=np.float64)
    if base.size == 0 or cand.size == 0:
        raise ValueError("timing_verdict() needs samples on both sides")
    cg = process_groups(cand_samples, cand_rounds or (), cand_processes)
    if len(base_occasions_ms) >= 2 and not paired:
        cand_ms = [float(np.median(g)) * 1e3 for g in cg] if cg is not None else [float(np.median(cand)) * 1e3]
        return occasion_timing_verdict(base_occasions_ms, cand_ms, cand_processes=len(cand_ms))
    bg = process_groups(base_samples, base_rounds or (), base_processes)
    if bg is not None and cg is not None:
        return process_timing_verdict(bg, cg, paired=paired and len(bg) == len(cg))
    floor = effect_floor(round_cv(base, base_rounds), round_cv(cand, cand_rounds))
    med_b, med_c = float(np.median(base)), float(np.median(cand))
    if paired:
        if not base_rounds or not cand_rounds:
            raise ValueError("a paired timing needs the rounds of both sides")
        pr = paired_ratio(cand, cand_rounds, base, base_rounds)
        ratio, lo, hi, p = pr.ratio, pr.ci_low, pr.ci_high, None
        significant = not (lo <= 1.0 <= hi)
    else:
        c = compare_samples(base, cand)
        ratio, lo, hi = c["ratio"], c["ci_low"], c["ci_high"]
        p = float(sps.mannwhitneyu(cand, base, alternative="two-sided").pvalue)
        significant = p < ALPHA
    verdict = classify(ratio, floor, significant)
    # one process a side: the smallest change it calls is the floor, or the interval's reach if wider
    mde = max(floor, float(hi) / float(ratio) - 1.0, 1.0 - float(lo) / float(ratio))
    return TimingVerdict(verdict, float(ratio), float(lo), float(hi), p, floor, med_b * 1e3, med_c * 1e3,
                         paired, int(base.size), int(cand.size), mde=mde,
                         processes=(max(1, base_processes), max(1, cand_processes)))


def process_timing_verdict(base_groups: Sequence[Sequence[float]], cand_groups: Sequence[Sequence[float]],
                           paired: bool = False) -> TimingVerdict:
    """The verdict over processes (each side's samples cut by process, two processes or more a side): the ratio
    of the geometric means of the per-process medians, its 95 % interval from the two-level bootstrap
    (:func:`harness.analysis.process_stats.process_ratio`); significant when the ``1 - ALPHA`` interval excludes 1; the
    floor is :data:`MIN_EFFECT` (the between-process spread is in the interval already). ``mde``: the larger of the
    floor and the slowdown the test would catch with 80 % power given the between-process spread. ``paired``:
    process k of each side ran alternately with the other's (``--against``): the ratio is taken per pair
    (:func:`harness.analysis.process_stats.paired_process_ratio`), so load shared by a pair cancels."""
    pr = (paired_process_ratio if paired else process_ratio)(base_groups, cand_groups, alpha=ALPHA)
    floor = MIN_EFFECT
    verdict = classify(pr.ratio, floor, pr.significant)
    med_b = float(np.exp(np.mean(np.log([np.median(g) for g in base_groups]))))
    med_c = float(np.exp(np.mean(np.log([np.median(g) for g in cand_groups]))))
    return TimingVerdict(verdict, pr.ratio, pr.ci_low, pr.ci_high, None, floor, med_b * 1e3, med_c * 1e3,
                         paired, sum(len(g) for g in base_groups), sum(len(g) for g in cand_groups),
                         mde=max(floor, pr.mde), processes=(len(base_groups), len(cand_groups)), over_processes=True)


def occasion_timing_verdict(base_occasions_ms: Sequence[Sequence[float]], cand_ms: Sequence[float], *,
                            cand_processes: int = 1) -> TimingVerdict:
    """The verdict against a baseline measured on several occasions (per occasion its per-process medians in ms;
    the candidate's per-process medians): the ratio of the geometric means, its 95 % interval and the test over
    occasions (:func:`harness.analysis.process_stats.occasion_ratio`, ``K - 1`` degrees of freedom); significant
    when the ``1 - ALPHA`` interval excludes 1; the floor is :data:`MIN_EFFECT`."""
    r = occasion_ratio(base_occasions_ms, cand_ms, alpha=ALPHA)
    verdict = classify(r.ratio, MIN_EFFECT, r.significant)
    logs = np.log([m for o in base_occasions_ms for m in o])
    med_b = float(np.exp(np.mean([np.mean(np.log(o)) for o in base_occasions_ms if len(o)])))
    med_c = float(np.exp(np.mean(np.log(cand_ms))))
    n_base = int(logs.size)
    return TimingVerdict(verdict, r.ratio, r.ci_low, r.ci_high, None, MIN_EFFECT, med_b, med_c, False, n_base,
                         len(cand_ms), mde=max(MIN_EFFECT, r.mde), processes=(n_base, max(1, cand_processes)),
                         over_processes=True, occasions=r.n_occasions)


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
    if v is not None and busy and v.verdict in ("regressed", "improved"):
        return dataclasses.replace(v, verdict="inconclusive")
    return v
