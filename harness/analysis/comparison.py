"""The one comparison of two timings: B over A, its interval, the level it covers, its verdict and what it could see.

Every place that puts two timings side by side reads this module: ``bench compare``, the ``bench run`` headline's
contrasts, the claims' latency figures and the CI gate. Pure numpy/scipy, no torch.

**The level.** A timing is stored as per-call samples in rounds, the rounds of worker process 0 first, then of
process 1, ... (:func:`harness.analysis.process_stats.process_groups`), and a baseline file may hold several
*occasions* (each its per-process medians). :func:`compare_timings` judges at the highest level both sides allow,
because only that level's spread is what a rerun sees:

==============  =========================================================================================  ====
level           statistic (log scale; ``se`` its standard error, ``df`` its degrees of freedom)            units
==============  =========================================================================================  ====
``occasions``   A measured on K ≥ 2 occasions, B one more (unless paired): the prediction for a new          K, 1
                occasion (:func:`~harness.analysis.ratios.occasion_ratio`), ``df = K − 1``
``processes``   two processes or more a side: geometric means of the per-process medians, a two-level      P, P
                bootstrap ``se``; paired (process k of each side timed alternately):
                per pair (:func:`~harness.analysis.ratios.paired_process_ratio`, ``df = P − 1``),
                else Welch (:func:`~harness.analysis.ratios.process_ratio`)
``rounds``      two rounds or more a side: per round its median; paired (the same rounds): the mean of      R, R
                the per-round log ratios (``df = R − 1``), else Welch over the two sides' round medians
``one process`` the medians of the raw samples, a seeded bootstrap ``se`` (the interval covers one          n, n
                process's noise only, never a fresh process's luck)
``exact``       two exact counts: no noise (``se = 0``)                                                     1, 1
==============  =========================================================================================  ====

**The verdict** (smaller is better; ``floor`` the change that counts, default :data:`FLOOR` = 5 %), at the shown
``confidence`` (95 %) and the test's ``alpha`` (:data:`ALPHA`, two-sided):

- ``unchanged``: the *whole* interval lies within ``[1/(1+floor), 1+floor]`` — equivalence shown, not assumed
  (two one-sided tests at 2.5 % each, by interval inclusion);
- ``regressed``: ratio > 1 + floor and the change is significant (``|log ratio| > t(1 − alpha/2, df) · se``);
  ``improved`` mirrored;
- ``inconclusive``: everything else — the interval reaches past the floor and no change beyond it is shown.

**What it could see** (``mde``, the minimum detectable effect): the slowdown this comparison calls ``regressed``
with probability :data:`~harness.analysis.ratios.POWER` (80 %): the estimate must clear both the floor and
the significance threshold, so ``mde = exp(max(log(1+floor), t(1 − alpha/2) · se) + t(POWER) · se) − 1``; never
below the floor. An inconclusive verdict reads "no regression seen (could see ≥ mde)".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from harness.analysis.process_stats import N_BOOT, process_groups, process_summary
from harness.analysis.ratios import POWER, occasion_ratio, paired_process_ratio, paired_ratio, process_ratio
from harness.analysis.stats import _t_ppf, round_medians
from harness.contract.records import CaseRecord

FLOOR = 0.05
"""The smallest timing change that counts (5 %): a change within it is no change, however steady the timings."""
ALPHA = 0.002
"""Two-sided significance level of a regression or improvement (asv's default: few false alarms over many cases)."""
CONFIDENCE = 0.95
"""The interval shown, and the one that must lie within the floor for ``unchanged``."""

LEVELS = ("occasions", "processes", "rounds", "one process", "exact")
"""What an interval covers, from the widest spread to none."""
VERDICTS = ("regressed", "improved", "unchanged", "inconclusive")

_EPS = 1e-12


@dataclass(frozen=True)
class Timing:
    """One side's timing as stored: per-call ``samples_s`` (seconds), ``rounds`` (samples per round, consecutive;
    empty when not in rounds), the worker processes it was measured in (their rounds process by process), and for
    a baseline measured on several occasions each occasion's per-process medians (``occasions_ms``, ms)."""

    samples_s: tuple[float, ...]
    rounds: tuple[int, ...] = ()
    n_processes: int = 1
    occasions_ms: tuple[tuple[float, ...], ...] = ()

    @classmethod
    def of(cls, samples_s: Sequence[float], rounds: Sequence[int] | None = (), n_processes: int | float | None = 1,
           occasions_ms: Sequence[Sequence[float]] = ()) -> Timing:
        """A timing from stored fields: rounds that do not add up to the samples are dropped (no rounds), a
        missing process count is 1, fewer than two occasions are none."""
        samples = tuple(float(s) for s in samples_s)
        r = tuple(int(n) for n in rounds or ())
        occ = tuple(tuple(float(m) for m in o) for o in occasions_ms if len(o))
        return cls(samples, r if r and sum(r) == len(samples) else (), max(1, int(n_processes or 1)),
                   occ if len(occ) >= 2 else ())

    def groups(self) -> list[tuple[float, ...]] | None:
        """The samples of each process (None with fewer than two processes, or rounds that do not cut apart)."""
        return process_groups(self.samples_s, self.rounds, self.n_processes)

    def round_medians(self) -> list[float]:
        """The median of each round (seconds; empty without rounds)."""
        return round_medians(self.samples_s, self.rounds) if self.rounds else []


@dataclass(frozen=True)
class Comparison:
    """B over A (candidate over baseline): ``ratio`` of their typical times (``a_ms``, ``b_ms``: per level the
    geometric mean of the unit medians, or the samples' medians), its interval at ``confidence``, the ``level`` it
    covers (one of :data:`LEVELS`) with ``n_a``/``n_b`` units a side at that level, the ``verdict`` (one of
    :data:`VERDICTS`, by the rule in the module docstring), the smallest slowdown it could have seen (``mde``,
    a fraction), the test behind them (``se_log``, ``df``, ``significant`` at ``alpha``), and the MDE it could
    come to with ever more units measured on B's side (``reachable_mde``)."""

    ratio: float
    ci_low: float
    ci_high: float
    level: str
    n_a: int
    n_b: int
    verdict: str
    mde: float
    floor: float = FLOOR
    se_log: float = 0.0
    df: float = math.inf
    significant: bool = False
    paired: bool = False
    a_ms: float = math.nan
    b_ms: float = math.nan
    confidence: float = CONFIDENCE
    alpha: float = ALPHA
    reachable_mde: float = FLOOR   # the MDE with ever more units on B's side alone (A's spread stays): see below

    # ``reachable_mde``: paired, both sides grow together (``bench check --against``) and the MDE can come down to
    # the floor; unpaired, A is fixed (a baseline file): its part of the standard error, on its degrees of freedom,
    # stays however many processes B adds — few occasions or processes in the baseline hold the MDE up.

    def inverse(self) -> Comparison:
        """A over B: the same comparison read the other way (interval flipped, regressed ↔ improved)."""
        flip = {"regressed": "improved", "improved": "regressed"}
        return replace(self, ratio=1.0 / self.ratio, ci_low=1.0 / self.ci_high, ci_high=1.0 / self.ci_low,
                       n_a=self.n_b, n_b=self.n_a, a_ms=self.b_ms, b_ms=self.a_ms,
                       verdict=flip.get(self.verdict, self.verdict))

    @property
    def interval_text(self) -> str:
        """``1.017 [0.750, 1.378]``."""
        return f"{self.ratio:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}]"

    @property
    def units_text(self) -> str:
        """What the interval is over: ``5+5 processes``, ``5 paired processes``, ``5 baseline occasions``,
        ``12 paired rounds``, ``one process (120+120 samples)``, ``exact``."""
        if self.level == "exact":
            return "exact"
        if self.level == "occasions":
            return f"{self.n_a} baseline occasions"
        if self.level == "one process":
            return f"one process ({self.n_a}+{self.n_b} samples)"
        unit = "processes" if self.level == "processes" else "rounds"
        return f"{self.n_a} paired {unit}" if self.paired and self.n_a == self.n_b else f"{self.n_a}+{self.n_b} {unit}"

    @property
    def mde_text(self) -> str:
        """``could see ≥ 12 %``."""
        return f"could see ≥ {100 * self.mde:.0f} %" if math.isfinite(self.mde) else "could see no slowdown"

    @property
    def summary(self) -> str:
        """The verdict in words: ``unchanged within 5 %``, ``no regression seen (could see ≥ 23 %)``,
        ``regressed: 1.38× [1.20, 1.58]`` or ``improved: 0.71× [0.65, 0.78]``."""
        if self.verdict == "unchanged":
            return f"unchanged within {100 * self.floor:.0f} %"
        if self.verdict == "inconclusive":
            return f"no regression seen ({self.mde_text})"
        return f"{self.verdict}: {self.ratio:.2f}× [{self.ci_low:.2f}, {self.ci_high:.2f}]"

    def as_dict(self) -> dict[str, float | int | str | bool]:
        """The comparison as plain data (a row of ``bench compare``, an export)."""
        return {"ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high, "level": self.level,
                "n_a": self.n_a, "n_b": self.n_b, "verdict": self.verdict, "mde": self.mde, "floor": self.floor,
                "paired": self.paired, "a_median_ms": self.a_ms, "b_median_ms": self.b_ms}


def judge(ratio: float, ci_low: float, ci_high: float, significant: bool, floor: float = FLOOR) -> str:
    """One of :data:`VERDICTS`: ``unchanged`` only when the whole interval lies within ``[1/(1+floor), 1+floor]``;
    ``regressed``/``improved`` when significant and beyond the floor; else ``inconclusive``."""
    if ci_low >= 1.0 / (1.0 + floor) - _EPS and ci_high <= 1.0 + floor + _EPS:
        return "unchanged"
    if significant and ratio > 1.0 + floor:
        return "regressed"
    if significant and ratio < 1.0 / (1.0 + floor):
        return "improved"
    return "inconclusive"


def mde(se_log: float, df: float, floor: float = FLOOR, alpha: float = ALPHA) -> float:
    """The slowdown called ``regressed`` with probability :data:`~harness.analysis.ratios.POWER`, given a
    log ratio's standard error ``se_log`` on ``df`` degrees of freedom (see the module docstring)."""
    if not math.isfinite(se_log):
        return math.inf
    t_test, t_power = _t_ppf(1.0 - alpha / 2.0, df), _t_ppf(POWER, df)
    return math.expm1(max(math.log1p(floor), t_test * se_log) + t_power * se_log)


def from_log(log_r: float, se_log: float, df: float, *, level: str, n_a: int, n_b: int, paired: bool = False,
             a_ms: float = math.nan, b_ms: float = math.nan, floor: float = FLOOR, alpha: float = ALPHA,
             confidence: float = CONFIDENCE, fixed: tuple[float, float] | None = None) -> Comparison:
    """The comparison of a log ratio ``log_r`` with standard error ``se_log`` on Student's t with ``df`` degrees
    of freedom: the interval at ``confidence``, the test at ``alpha``, the verdict and the MDE. ``fixed``: (se, df)
    of the part that more units on B's side cannot shrink (unpaired: A's own), for ``reachable_mde``."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}: one of {', '.join(LEVELS)}")
    t_show = _t_ppf(0.5 + confidence / 2.0, df) if se_log > 0 else 0.0
    lo, hi = math.exp(log_r - t_show * se_log), math.exp(log_r + t_show * se_log)
    t_test = _t_ppf(1.0 - alpha / 2.0, df) if se_log > 0 else 0.0
    significant = abs(log_r) > t_test * se_log + _EPS
    ratio = math.exp(log_r)
    return Comparison(ratio, lo, hi, level, n_a, n_b, judge(ratio, lo, hi, significant, floor),
                      mde(se_log, df, floor, alpha), floor, se_log, df, significant, paired, a_ms, b_ms,
                      confidence, alpha, min(mde(*fixed, floor, alpha), mde(se_log, df, floor, alpha))
                      if fixed is not None else floor)


def _gmean_ms(values_s: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values_s)))) * 1e3


def _medians(groups: Sequence[Sequence[float]]) -> list[float]:
    return [float(np.median(g)) for g in groups]


def _welch(la: np.ndarray, lb: np.ndarray) -> tuple[float, float]:
    """(se, df) of the difference of two means of logs, Welch's."""
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (la.size - 1) + vb ** 2 / (lb.size - 1)) if va + vb > 0 else \
        float(la.size + lb.size - 2)
    return se, df


def _log_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap replicates of log(median(x))."""
    return np.log(np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1))


def _bootstrap_se(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    """Standard errors of log(median(b) / median(a)) and of log(median(a)) alone, each side resampled apart
    (seeded)."""
    rng = np.random.default_rng(seed)
    la = _log_medians(a, n_boot, rng)
    return float((_log_medians(b, n_boot, rng) - la).std(ddof=1)), float(la.std(ddof=1))


def compare_timings(a: Timing, b: Timing, *, paired: bool = False, floor: float = FLOOR, alpha: float = ALPHA,
                    confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = 0) -> Comparison:
    """B (candidate) over A (baseline) at the highest level both sides allow (the table in the module docstring).

    ``paired``: the two sides were timed side by side — the same rounds, and process k of each alternately (one
    run's group, ``bench check --against``, ``bench compare --interleave``): their shared drift cancels. A
    baseline with occasions is judged over them unless ``paired``. Raises ValueError without samples on a side
    or with a non-positive median."""
    if not a.samples_s or not b.samples_s:
        raise ValueError("a comparison needs timing samples on both sides")
    kw = dict(floor=floor, alpha=alpha, confidence=confidence)
    ga, gb = a.groups(), b.groups()
    if len(a.occasions_ms) >= 2 and not paired:
        cand_ms = [m * 1e3 for m in _medians(gb)] if gb is not None else [float(np.median(b.samples_s)) * 1e3]
        return compare_occasions(a.occasions_ms, cand_ms, **kw)
    if ga is not None and gb is not None:
        pair = paired and len(ga) == len(gb)
        pr = (paired_process_ratio if pair else process_ratio)(ga, gb, alpha=alpha, confidence=confidence,
                                                               n_boot=n_boot, seed=seed)
        ma, mb = _medians(ga), _medians(gb)
        fixed = None if pair else (process_summary(ga, confidence, n_boot, seed).se_log, float(len(ga) - 1))
        return from_log(math.log(pr.ratio), pr.se_log, pr.df, level="processes", n_a=len(ga), n_b=len(gb),
                        paired=pair, a_ms=_gmean_ms(ma), b_ms=_gmean_ms(mb), fixed=fixed, **kw)
    ra, rb = a.round_medians(), b.round_medians()
    if paired and len(a.rounds) == len(b.rounds) >= 2:
        pr = paired_ratio(b.samples_s, b.rounds, a.samples_s, a.rounds)          # B over A, per round
        logs = np.log(pr.per_round)
        se = float(logs.std(ddof=1)) / math.sqrt(logs.size)
        pos_a, pos_b = [m for m in ra if m > 0], [m for m in rb if m > 0]
        return from_log(float(logs.mean()), se, float(logs.size - 1), level="rounds", n_a=pr.n_rounds,
                        n_b=pr.n_rounds, paired=True, a_ms=_gmean_ms(pos_a), b_ms=_gmean_ms(pos_b), **kw)
    ra, rb = [m for m in ra if m > 0], [m for m in rb if m > 0]
    if len(ra) >= 2 and len(rb) >= 2:
        la, lb = np.log(ra), np.log(rb)
        se, df = _welch(la, lb)
        fixed = (float(la.std(ddof=1)) / math.sqrt(la.size), float(la.size - 1))
        return from_log(float(lb.mean() - la.mean()), se, df, level="rounds", n_a=len(ra), n_b=len(rb),
                        a_ms=_gmean_ms(ra), b_ms=_gmean_ms(rb), fixed=fixed, **kw)
    xa, xb = np.asarray(a.samples_s, dtype=np.float64), np.asarray(b.samples_s, dtype=np.float64)
    med_a, med_b = float(np.median(xa)), float(np.median(xb))
    if med_a <= 0 or med_b <= 0:
        raise ValueError("a comparison needs positive medians on both sides")
    se, se_a = _bootstrap_se(xa, xb, n_boot, seed) if xa.size > 1 or xb.size > 1 else (math.inf, math.inf)
    df = float(max(1, min(xa.size, xb.size) - 1))
    fixed = (se_a, float(max(1, xa.size - 1)))
    return from_log(math.log(med_b / med_a), se, df, level="one process", n_a=int(xa.size), n_b=int(xb.size),
                    a_ms=med_a * 1e3, b_ms=med_b * 1e3, fixed=fixed, **kw)


def compare_occasions(a_occasions_ms: Sequence[Sequence[float]], b_ms: Sequence[float], *, floor: float = FLOOR,
                      alpha: float = ALPHA, confidence: float = CONFIDENCE) -> Comparison:
    """B (one occasion: its per-process medians, ms) over A measured on two occasions or more (per occasion its
    per-process medians, ms): :func:`harness.analysis.ratios.occasion_ratio`, level ``occasions``."""
    r = occasion_ratio(a_occasions_ms, b_ms, alpha=alpha, confidence=confidence)
    a_ms = float(np.exp(np.mean([np.mean(np.log(o)) for o in a_occasions_ms if len(o)])))
    n_a = float(np.mean([len(o) for o in a_occasions_ms if len(o)]))
    s_o2, s_p2 = r.occasion_sd ** 2, r.process_sd ** 2          # se² less its s_p²/N_c term (more B processes)
    fixed = math.sqrt(max(s_o2 - s_p2 / n_a, 0.0) + s_o2 / r.n_occasions)
    return from_log(math.log(r.ratio), r.se_log, r.df, level="occasions", n_a=r.n_occasions, n_b=1, a_ms=a_ms,
                    b_ms=float(np.exp(np.mean(np.log(b_ms)))), floor=floor, alpha=alpha, confidence=confidence,
                    fixed=(fixed, r.df))


def compare_samples(a_samples: Sequence[float], b_samples: Sequence[float], **kw: float) -> Comparison:
    """B over A from two series of per-call times measured in one process each (level ``one process``)."""
    return compare_timings(Timing.of(a_samples), Timing.of(b_samples), **kw)


def compare_exact(a: float, b: float, *, floor: float = FLOOR) -> Comparison:
    """B over A for two exact counts (MACs, bytes): the ratio, no interval, judged against the floor."""
    if not (a > 0 and b > 0):
        raise ValueError("an exact ratio needs two positive values")
    return from_log(math.log(b / a), 0.0, math.inf, level="exact", n_a=1, n_b=1, a_ms=a, b_ms=b, floor=floor)


# -- stored cases --------------------------------------------------------------------------------------------------
def record_timing(r: CaseRecord) -> Timing:
    """A stored case's timing: its samples, rounds and worker processes (``n_processes``; 1 when not stored)."""
    return Timing.of(r.samples_s, r.rounds, r.metric("n_processes") or 1)


def side_by_side(a: CaseRecord, b: CaseRecord) -> bool:
    """Whether two stored cases were timed side by side in the same rounds (one run, one group)."""
    return bool(a.group and a.group == b.group and a.run_id == b.run_id and a.rounds
                and len(a.rounds) == len(b.rounds))


def compare_records(a: CaseRecord, b: CaseRecord, *, floor: float = FLOOR) -> Comparison:
    """B's time over A's for two stored cases, paired when they were timed side by side: what ``bench compare``,
    the run headline and the claims' latency figures print."""
    return compare_timings(record_timing(a), record_timing(b), paired=side_by_side(a, b), floor=floor)
