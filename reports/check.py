"""A CI regression gate: a run checked against a stored baseline, one verdict per case (pure, torch-free).

``bench baseline SUITE -o FILE.json`` stores a measured run as a baseline document (:func:`write_baseline`);
``bench check SUITE --baseline FILE.json`` measures again and :func:`check_run` gives every case a verdict.
Cases are aligned on ``case_key``.

**Timing.** A timing regresses when the candidate's median is slower by more than the larger of 5 % and three
times the between-round coefficient of variation, and a Mann–Whitney U test on the raw samples gives
p < 0.002 (asv uses ratio > 1.1 and p < 0.002). In full, with ``ratio = median(candidate) / median(baseline)``
and ``floor = max(MIN_EFFECT, NOISE_MULTIPLE · max(round CV of the baseline, round CV of the candidate))``
(:func:`effect_floor`; the round CV is the standard deviation of the round medians over their mean,
:func:`harness.stats.round_summary`, the drift a rerun sees; a side timed in fewer than two rounds has none):

- ``regressed``: ratio > 1 + floor and p < ALPHA (two-sided Mann–Whitney U on the raw per-call samples);
- ``improved``: ratio < 1 / (1 + floor) and p < ALPHA;
- ``unchanged``: |log ratio| ≤ log(1 + floor), whatever p: a change too small to matter;
- ``inconclusive``: beyond the floor but not significant (the CLI re-measures these cases once); also a
  regression or improvement measured while other processes used more than half a core
  (``load_busy``, :mod:`harness.load`): a busy machine decides nothing.

**Over processes** (issue 25): where both sides were measured in two or more worker processes
(``n_processes``; their rounds process by process, :func:`harness.process_stats.process_groups`), the ratio is
the geometric mean of the candidate's per-process medians over the baseline's, with a two-level bootstrap
interval (:func:`harness.process_stats.process_ratio`; per pair of processes with ``--against``:
:func:`harness.process_stats.paired_process_ratio`); ``regressed`` when ratio > 1 + MIN_EFFECT and the
``1 - ALPHA`` interval lies above 1 (``improved`` mirrored; within the floor ``unchanged``; else
``inconclusive``). Every verdict carries its minimum detectable effect (``mde``: the slowdown caught with 80 %
power given the spread between processes; with one process a side, the floor or the interval's reach),
printed in the verdict cell and summed up by :func:`power_line`.

*Paired* timings (both sides measured in the same rounds, side by side, e.g. a re-measurement that interleaves
the baseline's code with the candidate's): the ratio is the paired ratio of :func:`harness.stats.paired_ratio`
(geometric mean of the per-round ratios of the round medians) and "significant" means its 95 % interval
excludes 1, in place of the Mann–Whitney p; the floor rule is the same. The ratio's interval shown is the
bootstrap interval of :func:`harness.stats.compare` for unpaired timings, the paired interval for paired ones.

**Deterministic metrics** (:data:`DETERMINISTIC`: ``macs``, ``flops``, ``params``, ``est_peak_bytes``,
``activation_peak_bytes``, ``peak_bytes`` and every ``analytic_*``) are compared *exactly* when the torch
version matches; any difference is ``changed``. On CUDA cases ``peak_bytes`` and ``activation_peak_bytes``
come from the caching allocator and get the relative tolerance :data:`CUDA_PEAK_TOLERANCE` instead.
**Tolerant metrics** (:data:`TOLERANT`: RSS and CUDA allocator peaks) are ``changed`` when they move by more
than their stated relative tolerance (RSS 50 %, CUDA allocator 10 %).

**Environment.** The hard fingerprint keys of the baseline and the candidate
(:func:`reports.compare.env_differences`) decide what is gated. Another torch version: deterministic
differences only warn. Any hard key differing (another machine or software stack): a warning; timing and
tolerant-metric verdicts are still computed and shown but marked "not gated", unless ``gate_timing=True``
forces timing gating. ``gate_timing=None`` (the default) gates timing only when the hard environments match;
``False`` never gates it.

**Case verdicts**, first that applies: ``missing`` (in the baseline, not in this run), ``new`` (only in this
run; never gated), ``failed`` (an error now — as `bench run` exits 1 on one — or ok in the baseline and not ok now),
``changed`` (a gated deterministic or tolerant
metric moved), then the gated timing verdict ``regressed`` / ``inconclusive`` / ``improved``, else ``ok``.
The check fails when any case is ``regressed``, ``changed``, ``failed`` or ``missing``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table
from scipy import stats as sps

from harness.errors import BenchInputError
from harness.records import FAILED, LABEL_KEYS, STATUSES, CaseRecord, RunRecord
from harness.stats import compare as compare_samples
from harness.process_stats import paired_process_ratio, process_groups, process_ratio
from harness.stats import paired_ratio, round_summary
from reports.compare import env_differences

BASELINE_FORMAT = 1
"""The version of the baseline document :func:`baseline_document` writes and :func:`load_baseline` reads."""

DETERMINISTIC: tuple[str, ...] = ("macs", "flops", "params", "est_peak_bytes", "activation_peak_bytes", "peak_bytes")
"""Metrics compared exactly (with the torch version unchanged), plus every metric named ``analytic_*``."""
ANALYTIC_PREFIX = "analytic_"

CUDA_PEAK_METRICS = ("peak_bytes", "activation_peak_bytes")
CUDA_PEAK_TOLERANCE = 0.10
"""On CUDA cases the peaks in :data:`CUDA_PEAK_METRICS` come from the caching allocator: relative tolerance."""

TOLERANT: dict[str, float] = {"rss_hwm_bytes": 0.50, "cuda_reserved_bytes": 0.10, "cuda_max_reserved_bytes": 0.10,
                              "cuda_max_allocated_bytes": 0.10}
"""Metrics that vary from run to run, each with the relative change that counts (``|new/old - 1| > tol``). RSS is
the worker's whole resident set — torch's libraries and the allocator's arenas besides the tensors — and moved
from 0.81 to 1.16 GB (+43 %) between runs of the same small suite on one machine, so only a change beyond 50 %
counts (a leak, not noise); the exact tensor peak (``peak_bytes``) is the memory gate."""

MIN_EFFECT = 0.05
"""The smallest timing change that counts (5 %), however steady the timings."""
NOISE_MULTIPLE = 3.0
"""A timing change counts only beyond this many between-round coefficients of variation."""
ALPHA = 0.002
"""Significance level of the two-sided Mann–Whitney U test on the raw samples (asv's default)."""

TIMING_VERDICTS = ("regressed", "improved", "unchanged", "inconclusive")
VERDICTS = ("ok", "regressed", "improved", "changed", "failed", "missing", "new", "inconclusive")
FAILING = ("regressed", "changed", "failed", "missing")
"""Case verdicts that fail the check."""


def is_deterministic(metric: str) -> bool:
    return metric in DETERMINISTIC or metric.startswith(ANALYTIC_PREFIX)


def effect_floor(base_round_cv: float | None, cand_round_cv: float | None) -> float:
    """The timing change that counts: ``max(MIN_EFFECT, NOISE_MULTIPLE · max of the round CVs available)``."""
    cvs = [c for c in (base_round_cv, cand_round_cv) if c is not None and math.isfinite(c)]
    return max(MIN_EFFECT, NOISE_MULTIPLE * max(cvs)) if cvs else MIN_EFFECT


# -- the timing verdict ---------------------------------------------------------------------------------
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

    @property
    def mde_text(self) -> str:
        """``MDE 12%, 5+5 processes`` or ``MDE 30%, not over processes (1+5)`` (a side measured in one process:
        its interval covers that process only; :func:`power_line` says so in full)."""
        if self.mde is None:
            return ""
        if self.over_processes:
            return f"MDE {100 * self.mde:.0f}%, {self.processes[0]}+{self.processes[1]} processes"
        return f"MDE {100 * self.mde:.0f}%, not over processes ({self.processes[0]}+{self.processes[1]})"


def _round_cv(samples: Sequence[float], rounds: Sequence[int] | None) -> float | None:
    if not rounds:
        return None
    return round_summary(samples, rounds).get("round_cv")


def timing_verdict(base_samples: Sequence[float], base_rounds: Sequence[int] | None,
                   cand_samples: Sequence[float], cand_rounds: Sequence[int] | None, *,
                   paired: bool = False, base_processes: int = 1, cand_processes: int = 1) -> TimingVerdict:
    """The verdict on one case's timing (seconds per call on both sides; the rule is in the module docstring).

    ``*_rounds``: samples per round, consecutive in the samples (empty or None: no rounds, no round CV).
    ``paired=True`` needs both sides measured in the same rounds (at least two); raises ValueError otherwise.
    ``*_processes``: the worker processes each side was measured in (its rounds, process by process:
    :func:`harness.process_stats.process_groups`); with two or more on both sides the verdict is over processes
    (:func:`process_timing_verdict`) whatever ``paired`` says."""
    base = np.asarray(base_samples, dtype=np.float64)
    cand = np.asarray(cand_samples, dtype=np.float64)
    if base.size == 0 or cand.size == 0:
        raise ValueError("timing_verdict() needs samples on both sides")
    bg = process_groups(base_samples, base_rounds or (), base_processes)
    cg = process_groups(cand_samples, cand_rounds or (), cand_processes)
    if bg is not None and cg is not None:
        return process_timing_verdict(bg, cg, paired=paired and len(bg) == len(cg))
    floor = effect_floor(_round_cv(base, base_rounds), _round_cv(cand, cand_rounds))
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
    if abs(math.log(ratio)) <= math.log1p(floor):
        verdict = "unchanged"
    elif ratio > 1.0 + floor and significant:
        verdict = "regressed"
    elif ratio < 1.0 / (1.0 + floor) and significant:
        verdict = "improved"
    else:
        verdict = "inconclusive"
    # one process a side: the smallest change it calls is the floor, or the interval's reach if wider
    mde = max(floor, float(hi) / float(ratio) - 1.0, 1.0 - float(lo) / float(ratio))
    return TimingVerdict(verdict, float(ratio), float(lo), float(hi), p, floor, med_b * 1e3, med_c * 1e3,
                         paired, int(base.size), int(cand.size), mde=mde,
                         processes=(max(1, base_processes), max(1, cand_processes)))


def process_timing_verdict(base_groups: Sequence[Sequence[float]], cand_groups: Sequence[Sequence[float]],
                           paired: bool = False) -> TimingVerdict:
    """The verdict over processes (each side's samples cut by process, two processes or more a side): the ratio
    of the geometric means of the per-process medians, its 95 % interval from the two-level bootstrap
    (:func:`harness.process_stats.process_ratio`); significant when the ``1 - ALPHA`` interval excludes 1; the
    floor is :data:`MIN_EFFECT` (the between-process spread is in the interval already). ``mde``: the larger of the
    floor and the slowdown the test would catch with 80 % power given the between-process spread. ``paired``:
    process k of each side ran alternately with the other's (``--against``): the ratio is taken per pair
    (:func:`harness.process_stats.paired_process_ratio`), so load shared by a pair cancels."""
    pr = (paired_process_ratio if paired else process_ratio)(base_groups, cand_groups, alpha=ALPHA)
    floor = MIN_EFFECT
    if abs(math.log(pr.ratio)) <= math.log1p(floor):
        verdict = "unchanged"
    elif pr.ratio > 1.0 + floor and pr.significant:
        verdict = "regressed"
    elif pr.ratio < 1.0 / (1.0 + floor) and pr.significant:
        verdict = "improved"
    else:
        verdict = "inconclusive"
    med_b = float(np.exp(np.mean(np.log([np.median(g) for g in base_groups]))))
    med_c = float(np.exp(np.mean(np.log([np.median(g) for g in cand_groups]))))
    return TimingVerdict(verdict, pr.ratio, pr.ci_low, pr.ci_high, None, floor, med_b * 1e3, med_c * 1e3,
                         paired, sum(len(g) for g in base_groups), sum(len(g) for g in cand_groups),
                         mde=max(floor, pr.mde), processes=(len(base_groups), len(cand_groups)), over_processes=True)


# -- readable case identity -----------------------------------------------------------------------------
def label_keys(records: Sequence[CaseRecord]) -> tuple[str, ...]:
    """Fields beyond :meth:`CaseRecord.params`' own (arch and the label workload fields) that tell the cases
    of one line apart: the workload and config fields that vary within some line."""
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    keys: dict[str, None] = {}
    for recs in by_line.values():
        for k in dict.fromkeys(k for r in recs for k in (*r.workload, *r.config)):
            if k not in LABEL_KEYS and len({repr(r.value(k)) for r in recs}) > 1:
                keys[k] = None
    return tuple(keys)


def case_params(records: Sequence[CaseRecord]) -> list[dict[str, Any]]:
    """Per record, its readable identity: ``arch``, the label workload fields (seq_len, batch_size, ...) and
    the fields that vary within its line (:func:`label_keys`)."""
    keys = label_keys(records)
    return [r.params(keys) for r in records]


def params_text(params: Mapping[str, Any]) -> str:
    """``decoder-tiny · seq_len=64 · batch_size=1``."""
    return " · ".join(str(v) if k == "arch" else f"{k}={v}" for k, v in params.items())


def short_labels(params: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`params_text` of each, keeping ``arch`` and only the fields whose value differs between them."""
    keys = dict.fromkeys(k for p in params for k in p)
    varying = {k for k in keys if len({repr(p.get(k)) for p in params}) > 1}
    return [params_text({k: v for k, v in p.items() if k == "arch" or k in varying}) for p in params]


# -- the baseline document ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BaselineTiming:
    median_ms: float
    round_cv: float | None
    samples_s: tuple[float, ...]
    rounds: tuple[int, ...]
    n_processes: int = 1            # worker processes; their rounds consecutive (a file before issue 25: 1)


@dataclass(frozen=True)
class BaselineCase:
    case_key: str
    line: str
    arch: str
    status: str
    workload: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    deterministic: Mapping[str, float] = field(default_factory=dict)
    tolerant: Mapping[str, float] = field(default_factory=dict)
    timing: BaselineTiming | None = None

    def record(self, suite: str = "") -> CaseRecord:
        """The case as a :class:`CaseRecord` (its metrics: the stored deterministic and tolerant ones)."""
        t = self.timing
        return CaseRecord(case_key=self.case_key, suite=suite, line=self.line, arch=self.arch,
                          status=self.status, config=dict(self.config), workload=dict(self.workload),
                          metrics={**self.deterministic, **self.tolerant,
                                   **({"n_processes": float(t.n_processes)} if t else {})},
                          samples_s=t.samples_s if t else (), rounds=t.rounds if t else ())


@dataclass(frozen=True)
class Baseline:
    """A loaded baseline document (see :func:`baseline_document`)."""

    format: int
    suite: str
    quick: bool
    created: str
    env: Mapping[str, Any]
    cases: tuple[BaselineCase, ...]
    run_id: str = ""
    commit: str = ""
    path: str = ""

    def case(self, case_key: str) -> BaselineCase | None:
        return next((c for c in self.cases if c.case_key == case_key), None)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _metric_split(r: CaseRecord) -> tuple[dict[str, float], dict[str, float]]:
    det = {k: float(v) for k, v in r.metrics.items() if is_deterministic(k) and _finite(v)}
    tol = {k: float(v) for k, v in r.metrics.items() if k in TOLERANT and _finite(v)}
    return det, tol


def _timing_doc(r: CaseRecord) -> dict[str, Any] | None:
    if not r.samples_s:
        return None
    rounds = list(r.rounds) if r.rounds and sum(r.rounds) == len(r.samples_s) else []
    n_proc = int(r.metric("n_processes") or 1)
    groups = process_groups(r.samples_s, rounds, n_proc)
    doc = {"median_ms": float(np.median(r.samples_s)) * 1e3, "round_cv": _round_cv(r.samples_s, rounds),
           "samples_s": [float(s) for s in r.samples_s], "rounds": rounds}
    if groups:                          # one process: the document stays as it was before issue 25
        doc["n_processes"] = n_proc
        doc["process_medians_ms"] = [float(np.median(g)) * 1e3 for g in groups]
        doc["n_rounds"], doc["n_samples"] = len(rounds), len(r.samples_s)
    return doc


def baseline_document(run: RunRecord, records: Sequence[CaseRecord]) -> dict[str, Any]:
    """The baseline of a measured run as a JSON-able dict: ``format``, ``suite``, ``quick``, ``created``, ``run_id``,
    ``commit``, ``env`` (the run's fingerprint) and ``cases``, one per record: identity, status, workload, config,
    the ``deterministic`` and ``tolerant`` metrics it has, and its ``timing`` (median_ms, round_cv, the raw
    samples_s and rounds; null without samples)."""
    cases = []
    for r in records:
        det, tol = _metric_split(r)
        cases.append({"case_key": r.case_key, "line": r.line, "arch": r.arch, "status": r.status,
                      "workload": dict(r.workload), "config": dict(r.config), "deterministic": det,
                      "tolerant": tol, "timing": _timing_doc(r)})
    return {"format": BASELINE_FORMAT, "suite": run.suite, "quick": bool(run.quick),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "run_id": run.id,
            "commit": run.commit, "env": dict(run.env), "cases": cases}


def write_baseline(path: str | Path, run: RunRecord, records: Sequence[CaseRecord]) -> None:
    """Write :func:`baseline_document` to ``path`` as JSON; a path that cannot be written raises BenchInputError."""
    text = json.dumps(baseline_document(run, records), indent=1, default=str, allow_nan=False) + "\n"
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise BenchInputError(f"cannot write {path}: {exc.strerror or exc}", where="--output") from None


class _Invalid(Exception):
    pass


def _need(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in d:
        raise _Invalid(f"{what} has no {key!r}")
    v = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        raise _Invalid(f"{what}: {key!r} is not {_kind_name(kind)}")
    return v


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", bool: "true/false", int: "an integer",
             float: "a number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _numbers(d: Any, what: str) -> dict[str, float]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and _finite(v) for k, v in d.items()):
        raise _Invalid(f"{what} is not an object of finite numbers")
    return {k: float(v) for k, v in d.items()}


def _parse_case(i: int, c: Any) -> BaselineCase:
    what = f"case #{i + 1}"
    if not isinstance(c, dict):
        raise _Invalid(f"{what} is not an object")
    key = _need(c, "case_key", str, what)
    what = f"case {key}"
    status = _need(c, "status", str, what)
    if status not in STATUSES:
        raise _Invalid(f"{what}: unknown status {status!r}")
    timing = None
    t = c.get("timing")
    if t is not None:
        if not isinstance(t, dict):
            raise _Invalid(f"{what}: 'timing' is not an object")
        samples = t.get("samples_s")
        if not isinstance(samples, list) or not samples or not all(_finite(s) and s > 0 for s in samples):
            raise _Invalid(f"{what}: timing 'samples_s' is not a list of positive numbers")
        rounds = t.get("rounds") or []
        if not isinstance(rounds, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                   for n in rounds):
            raise _Invalid(f"{what}: timing 'rounds' is not a list of counts")
        if rounds and sum(rounds) != len(samples):
            raise _Invalid(f"{what}: timing rounds hold {sum(rounds)} samples, samples_s has {len(samples)}")
        cv = t.get("round_cv")
        n_proc = t.get("n_processes", 1)
        if not isinstance(n_proc, int) or isinstance(n_proc, bool) or n_proc < 1:
            raise _Invalid(f"{what}: timing 'n_processes' is not a positive count")
        if n_proc > 1 and process_groups(samples, rounds, n_proc) is None:
            raise _Invalid(f"{what}: timing rounds ({len(rounds)}) do not split into {n_proc} processes")
        timing = BaselineTiming(median_ms=float(np.median(samples)) * 1e3,
                                round_cv=float(cv) if _finite(cv) else None,
                                samples_s=tuple(float(s) for s in samples), rounds=tuple(rounds), n_processes=n_proc)
    return BaselineCase(case_key=key, line=_need(c, "line", str, what), arch=_need(c, "arch", str, what),
                        status=status, workload=dict(_need(c, "workload", dict, what)),
                        config=dict(_need(c, "config", dict, what)),
                        deterministic=_numbers(c.get("deterministic", {}), f"{what}: 'deterministic'"),
                        tolerant=_numbers(c.get("tolerant", {}), f"{what}: 'tolerant'"), timing=timing)


def parse_baseline(doc: Any, path: str = "") -> Baseline:
    """A baseline from its JSON document; raises BenchInputError (``where="--baseline"``) if it is not one."""
    name = path or "the baseline"
    try:
        if not isinstance(doc, dict) or "format" not in doc:
            raise _Invalid("is not a bench baseline (a JSON object with a 'format' key; `bench baseline` writes one)")
        if doc["format"] != BASELINE_FORMAT:
            raise _Invalid(f"has baseline format {doc['format']!r}; this bench reads format {BASELINE_FORMAT}")
        suite = _need(doc, "suite", str, "the document")
        env = _need(doc, "env", dict, "the document")
        raw = _need(doc, "cases", list, "the document")
        cases = tuple(_parse_case(i, c) for i, c in enumerate(raw))
        seen: set[str] = set()
        for c in cases:
            if c.case_key in seen:
                raise _Invalid(f"holds case {c.case_key} twice")
            seen.add(c.case_key)
    except _Invalid as exc:
        text = str(exc)
        raise BenchInputError(f"{name} {text}" if text.startswith(("is ", "has ", "holds ")) else f"{name}: {text}",
                              where="--baseline") from None
    return Baseline(format=BASELINE_FORMAT, suite=suite, quick=bool(doc.get("quick", False)),
                    created=str(doc.get("created", "")), env=env, cases=cases, run_id=str(doc.get("run_id") or ""),
                    commit=str(doc.get("commit") or ""), path=path)


def load_baseline(path: str | Path) -> Baseline:
    """Read a baseline file written by :func:`write_baseline`. A missing, unreadable or invalid file raises
    :class:`~harness.errors.BenchInputError` (``where="--baseline"``) with one line saying why."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot read {path}: {exc.strerror or exc}", where="--baseline") from None
    except UnicodeDecodeError:
        raise BenchInputError(f"{path} is not a bench baseline (not UTF-8 text)", where="--baseline") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchInputError(f"{path} is not a bench baseline (not JSON: {exc.msg} at line {exc.lineno})",
                              where="--baseline") from None
    return parse_baseline(doc, str(path))


# -- metric findings ------------------------------------------------------------------------------------
def _fmt_value(v: float, other: float) -> str:
    """``v`` with as few significant digits (3 at least) as tell it from ``other``: ``4.09e9``, ``1234``."""
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    for digits in range(3, 17):
        a, b = f"{v:.{digits}g}", f"{other:.{digits}g}"
        if a != b or digits == 16:
            break
    if "e" in a:
        mant, exp = a.split("e")
        a = f"{mant}e{int(exp)}"
    return a


@dataclass(frozen=True)
class MetricFinding:
    """A metric that moved: exact ones (``tolerance`` 0) by any amount, tolerant ones beyond their tolerance.
    ``gated``: it fails the case (False: only a warning, e.g. another torch version)."""

    metric: str
    old: float
    new: float
    tolerance: float
    gated: bool

    @property
    def rel_change(self) -> float | None:
        return self.new / self.old - 1.0 if self.old else None

    @property
    def text(self) -> str:
        """``macs 4.09e9 → 4.5e9 (+10.0%)``."""
        rel = self.rel_change
        change = f"{100 * rel:+.1f}%" if rel is not None else "from 0"
        tol = f", tolerance {100 * self.tolerance:.0f}%" if self.tolerance else ""
        return f"{self.metric} {_fmt_value(self.old, self.new)} → {_fmt_value(self.new, self.old)} ({change}{tol})"


def _on_cuda(workload: Mapping[str, Any]) -> bool:
    return str(workload.get("device", "cpu")).startswith("cuda")


def metric_findings(base: BaselineCase, cand: CaseRecord, *, exact_gated: bool,
                    tolerant_gated: bool) -> tuple[list[MetricFinding], list[str]]:
    """The deterministic and tolerant metrics of a case that moved, and notes on metrics only one side has."""
    det, tol = _metric_split(cand)
    cuda = _on_cuda(cand.workload) or _on_cuda(base.workload)
    found, notes = [], []
    for name in sorted(base.deterministic.keys() | det.keys()):
        old, new = base.deterministic.get(name), det.get(name)
        if old is None or new is None:
            if cand.ok and base.status == "ok":
                notes.append(f"{name} {'only in the baseline' if new is None else 'new'}")
            continue
        if cuda and name in CUDA_PEAK_METRICS:
            if abs(new - old) > CUDA_PEAK_TOLERANCE * abs(old):
                found.append(MetricFinding(name, old, new, CUDA_PEAK_TOLERANCE, tolerant_gated))
        elif new != old:
            found.append(MetricFinding(name, old, new, 0.0, exact_gated))
    for name in sorted(base.tolerant.keys() & tol.keys()):
        old, new = base.tolerant[name], tol[name]
        if abs(new - old) > TOLERANT[name] * abs(old):
            found.append(MetricFinding(name, old, new, TOLERANT[name], tolerant_gated))
    return found, notes


# -- the report -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckRow:
    """One case of the check. ``kind``: ``both`` (in the baseline and this run), ``missing`` or ``new``.
    ``timing`` is None where either side has no ok timing; ``timing_gated`` says whether it decides the verdict."""

    case_key: str
    line: str
    arch: str
    label: str                                  # arch and the fields that tell the cases apart
    params: Mapping[str, Any]                   # arch, the label workload fields and the fields varying in a line
    kind: str
    status: str                                 # this run's status ("" when missing)
    base_status: str                            # the baseline's ("" when new)
    findings: tuple[MetricFinding, ...] = ()
    timing: TimingVerdict | None = None
    timing_gated: bool = False
    notes: tuple[str, ...] = ()
    remeasured: bool = False
    base_samples: tuple[float, ...] = field(default=(), repr=False)
    base_rounds: tuple[int, ...] = field(default=(), repr=False)
    base_processes: int = field(default=1, repr=False)

    @property
    def name(self) -> str:
        """``MHA · decoder-tiny · seq_len=64``."""
        return f"{self.line} · {self.label}"

    @property
    def changed(self) -> tuple[MetricFinding, ...]:
        """Findings that fail the case."""
        return tuple(f for f in self.findings if f.gated)

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` (the order of precedence is in the module docstring)."""
        if self.kind in ("missing", "new"):
            return self.kind
        if self.status in FAILED or (self.base_status == "ok" and self.status != "ok"):
            return "failed"
        if self.changed:
            return "changed"
        if self.timing is not None and self.timing_gated and self.timing.verdict != "unchanged":
            return self.timing.verdict
        return "ok"


@dataclass(frozen=True)
class CheckReport:
    """Every case's verdict, the warnings (environment, ungated changes) and whether the check failed."""

    rows: tuple[CheckRow, ...]
    warnings: tuple[str, ...] = ()
    suite: str = ""
    env_differences: tuple[str, ...] = ()
    timing_gated: bool = True
    baseline_created: str = ""
    baseline_commit: str = ""

    @property
    def failed(self) -> bool:
        return any(r.verdict in FAILING for r in self.rows)

    @property
    def summary(self) -> dict[str, int]:
        """Count of cases per verdict (every verdict named, zeros included)."""
        counts = dict.fromkeys(VERDICTS, 0)
        for r in self.rows:
            counts[r.verdict] += 1
        return counts

    def row(self, case_key: str) -> CheckRow:
        for r in self.rows:
            if r.case_key == case_key:
                return r
        raise KeyError(case_key)

    def not_ok(self) -> list[CheckRow]:
        return [r for r in self.rows if r.verdict != "ok"]

    def inconclusive_keys(self) -> list[str]:
        """Cases whose gated timing verdict is inconclusive (the CLI re-measures these once)."""
        return [r.case_key for r in self.rows
                if r.timing is not None and r.timing_gated and r.timing.verdict == "inconclusive"]

    def replace_timing(self, case_key: str, cand_samples: Sequence[float], cand_rounds: Sequence[int] = (), *,
                       paired_base: tuple[Sequence[float], Sequence[int]] | None = None, busy: str = "",
                       cand_processes: int = 1, base_processes: int | None = None) -> CheckReport:
        """A new report with ``case_key``'s timing re-judged on a re-measurement of the candidate.

        ``paired_base``: ``(samples, rounds)`` of the baseline's code re-measured side by side with the candidate,
        in the same rounds: then the verdict is paired (see the module docstring) against those samples.
        Without it the re-measurement is judged against the stored baseline samples. ``busy``: the re-measurement
        ran on a busy machine (:func:`busy_note`), so a regression or improvement reads inconclusive.
        ``cand_processes`` / ``base_processes`` (default: the stored baseline's): the worker processes of each
        side; with two or more on both the verdict is over processes (:func:`process_timing_verdict`).
        Raises KeyError for an
        unknown case and ValueError for a case without a baseline timing (and no ``paired_base``)."""
        row = self.row(case_key)
        if paired_base is not None:
            base_samples, base_rounds = tuple(paired_base[0]), tuple(paired_base[1])
            verdict = timing_verdict(base_samples, base_rounds, cand_samples, cand_rounds, paired=True,
                                     base_processes=base_processes or 1, cand_processes=cand_processes)
        else:
            if not row.base_samples:
                raise ValueError(f"case {case_key} has no baseline timing to compare with")
            verdict = timing_verdict(row.base_samples, row.base_rounds, cand_samples, cand_rounds,
                                     base_processes=base_processes or row.base_processes,
                                     cand_processes=cand_processes)
        if busy and verdict.verdict in ("regressed", "improved"):       # measured on a busy machine: decides nothing
            verdict = dataclasses.replace(verdict, verdict="inconclusive")
        notes = row.notes + ((busy,) if busy else ())
        new = dataclasses.replace(row, timing=verdict, remeasured=True, notes=notes)
        return dataclasses.replace(self, rows=tuple(new if r.case_key == case_key else r for r in self.rows))


def busy_note(cand: CaseRecord) -> str:
    """"machine busy: ..." when other processes used more than half a core while ``cand`` was timed."""
    if not cand.metric("load_busy"):
        return ""
    return f"machine busy: other processes used {cand.metric('load_others_cores') or 0:.2f} cores while timed"


def not_on_busy(v: TimingVerdict | None, cand: CaseRecord) -> TimingVerdict | None:
    """A timing measured on a busy machine decides nothing: a regression or improvement becomes inconclusive."""
    if v is not None and busy_note(cand) and v.verdict in ("regressed", "improved"):
        return dataclasses.replace(v, verdict="inconclusive")
    return v


def _timing_sides(base: BaselineCase, cand: CaseRecord, paired: bool = False) -> TimingVerdict | None:
    if base.status != "ok" or not cand.ok or base.timing is None or not cand.samples_s:
        return None
    rounds = cand.rounds if cand.rounds and sum(cand.rounds) == len(cand.samples_s) else ()
    paired = paired and len(rounds) >= 2 and len(rounds) == len(base.timing.rounds or ())
    return not_on_busy(timing_verdict(base.timing.samples_s, base.timing.rounds, cand.samples_s, rounds,
                                      paired=paired, base_processes=base.timing.n_processes,
                                      cand_processes=n_processes(cand)), cand)


def n_processes(rec: CaseRecord) -> int:
    """The worker processes a record's timing was measured in (``n_processes``; 1 when not stored)."""
    return max(1, int(rec.metric("n_processes") or 1))


def check_run(baseline: Baseline, run: RunRecord, records: Sequence[CaseRecord], *,
              gate_timing: bool | None = None, remeasured: Mapping[str, CaseRecord] | None = None,
              paired: bool = False) -> CheckReport:
    """Check a measured run against a baseline, case by case (aligned on ``case_key``; the rules are in the
    module docstring). ``gate_timing``: None gates timing only when the hard environments match, True always,
    False never. ``remeasured``: re-measured records by case key, whose samples replace the run's for the
    timing verdict (the same as :meth:`CheckReport.replace_timing` on each). ``paired``: the baseline was
    measured in the same rounds as this run, side by side (``bench check --against``): timings are judged paired."""
    diffs = tuple(env_differences(baseline.env, run.env))
    same_torch = "torch" not in diffs
    timing_gated = (not diffs) if gate_timing is None else bool(gate_timing)
    tolerant_gated = not diffs
    warnings: list[str] = []
    if baseline.suite and baseline.suite != run.suite:
        warnings.append(f"the baseline is of suite {baseline.suite!r}, this run of {run.suite!r}")
    if bool(baseline.quick) != bool(run.quick):
        warnings.append(f"the baseline was measured {'with' if baseline.quick else 'without'} --quick, "
                        f"this run {'with' if run.quick else 'without'}: their cases differ")
    if diffs:
        hb, hc = (baseline.env or {}).get("hard") or {}, run.hard_env
        detail = "; ".join(f"{k}: {hb.get(k)!r} → {hc.get(k)!r}" for k in diffs)
        gating = ("timing gated anyway, as asked" if timing_gated
                  else "timing and memory verdicts are shown but not gated")
        warnings.append(f"the baseline was measured in another environment ({detail}): {gating}")
    if not same_torch:
        warnings.append("another torch version: differences of the deterministic metrics "
                        f"({', '.join(DETERMINISTIC)}, analytic_*) only warn")

    by_cand = {r.case_key: r for r in records}
    base_keys = {c.case_key for c in baseline.cases}
    both = [(b, by_cand.get(b.case_key)) for b in baseline.cases]
    new = [r for r in records if r.case_key not in base_keys]
    # labels over every case either side has, so they tell the cases apart the same way in both
    shown = [c if c is not None else b.record(baseline.suite) for b, c in both] + new
    all_params = case_params(shown)
    labels = dict(zip((r.case_key for r in shown), zip(all_params, short_labels(all_params))))

    rows: list[CheckRow] = []
    for b, c in both:
        params, label = labels[b.case_key]
        ident = dict(case_key=b.case_key, line=b.line, arch=b.arch, label=label, params=params,
                     base_samples=b.timing.samples_s if b.timing else (),
                     base_rounds=b.timing.rounds if b.timing else (),
                     base_processes=b.timing.n_processes if b.timing else 1)
        if c is None:
            rows.append(CheckRow(**ident, kind="missing", status="", base_status=b.status))
            continue
        findings, notes = metric_findings(b, c, exact_gated=same_torch, tolerant_gated=tolerant_gated)
        if b.status != c.status and b.status != "ok":
            notes.append(f"status {b.status} → {c.status}")
        if busy_note(c):
            notes.append(busy_note(c))
        row = CheckRow(**ident, kind="both", status=c.status, base_status=b.status, findings=tuple(findings),
                       timing=_timing_sides(b, c, paired), timing_gated=timing_gated, notes=tuple(notes))
        rows.append(row)
        ungated = [f.text for f in findings if not f.gated]
        if ungated:
            warnings.append(f"{row.name}: {'; '.join(ungated)} (not gated)")
    for r in new:
        params, label = labels[r.case_key]
        rows.append(CheckRow(case_key=r.case_key, line=r.line, arch=r.arch, label=label,
                             params=params, kind="new", status=r.status, base_status=""))
    report = CheckReport(rows=tuple(rows), warnings=tuple(warnings), suite=run.suite, env_differences=diffs,
                         timing_gated=timing_gated, baseline_created=baseline.created,
                         baseline_commit=baseline.commit)
    for key, rec in (remeasured or {}).items():
        row = report.row(key)
        if row.timing is not None and rec.ok and rec.samples_s:
            rounds = rec.rounds if rec.rounds and sum(rec.rounds) == len(rec.samples_s) else ()
            report = report.replace_timing(key, rec.samples_s, rounds, busy=busy_note(rec),
                                           cand_processes=n_processes(rec))
    return report


# -- views ----------------------------------------------------------------------------------------------
MARK = {"ok": "✅", "regressed": "🔴", "improved": "🟢", "changed": "🟠", "failed": "💥", "missing": "❔",
        "new": "🆕", "inconclusive": "⚪"}
STYLE = {"ok": "green", "regressed": "bold red", "improved": "green", "changed": "red", "failed": "bold red",
         "missing": "red", "new": "cyan", "inconclusive": "yellow"}


def headline(report: CheckReport) -> str:
    """``❌ 2 regressed, 1 changed (of 12 cases)`` or ``✅ no regression (12 cases: 11 ok, 1 improved)``."""
    n = report.summary
    total = len(report.rows)
    if report.failed:
        bad = ", ".join(f"{n[v]} {v}" for v in FAILING if n[v])
        return f"❌ {bad} (of {total} cases)"
    rest = ", ".join(f"{n[v]} {v}" for v in VERDICTS if n[v] and v not in FAILING)
    return f"✅ no regression ({total} cases" + (f": {rest})" if rest else ")")


def power_line(report: CheckReport) -> str:
    """How little a green check proves: the smallest slowdown each timing verdict could have seen (its minimum
    detectable effect), as the median and the largest over the cases, and how many processes they rest on."""
    ts = [r.timing for r in report.rows if r.timing is not None and r.timing.mde is not None]
    if not ts:
        return "no timing compared: this check could not see any slowdown"
    mdes = sorted(t.mde for t in ts)
    worst = max((r for r in report.rows if r.timing is not None and r.timing.mde is not None),
                key=lambda r: r.timing.mde)
    procs = sorted({t.processes for t in ts})
    basis = ("over processes (" + ", ".join(f"{a}+{b}" for a, b in procs) + ")" if all(t.over_processes for t in ts)
             else "some with a side measured in one process: one process: the interval covers this process only")
    gated = "" if report.timing_gated else " (timing not gated)"
    return (f"smallest slowdown this check could see{gated}: {100 * mdes[len(mdes) // 2]:.0f}% median over "
            f"{len(ts)} timings, {100 * worst.timing.mde:.0f}% at worst ({worst.name}); {basis}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.4g}"


def _cells(row: CheckRow) -> dict[str, str]:
    t = row.timing
    verdict = row.verdict
    extra = []
    if t is not None and not row.timing_gated and t.verdict != "unchanged":
        extra.append(f"timing {t.verdict}, not gated")
    if row.remeasured:
        extra.append("re-measured" + (", paired" if t is not None and t.paired else ""))
    if t is not None and t.mde_text:
        extra.append(t.mde_text)
    status = "" if row.kind != "both" or row.status == row.base_status else f"{row.base_status} → {row.status}"
    changes = "; ".join([f.text + ("" if f.gated else " (not gated)") for f in row.findings] + list(row.notes))
    return {
        "case": row.name,
        "base": _ms(t.base_median_ms) if t else "-",
        "cand": _ms(t.cand_median_ms) if t else "-",
        "ratio": f"{t.ratio:.3f} [{t.ci_low:.3f}, {t.ci_high:.3f}]" if t else "-",
        "p": ((("processes, paired" if t.paired else "processes") if t.over_processes else
               "paired" if t.paired else f"{t.p_value:.2g}") if t else "-"),
        "floor": f"{100 * t.floor:.1f}%" if t else "-",
        "verdict": verdict + (f" ({'; '.join(extra)})" if extra else ""),
        "status": status,
        "changes": "; ".join(x for x in (status, changes) if x),
    }


_MD_COLUMNS = (("case", "case"), ("baseline ms", "base"), ("candidate ms", "cand"), ("ratio [95% CI]", "ratio"),
               ("p", "p"), ("floor", "floor"), ("verdict", "verdict"), ("deterministic changes", "changes"))


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: Sequence[CheckRow]) -> list[str]:
    out = ["| " + " | ".join(h for h, _ in _MD_COLUMNS) + " |",
           "|" + "|".join(":--" if k in ("case", "verdict", "changes") else "--:" for _, k in _MD_COLUMNS) + "|"]
    for r in rows:
        c = _cells(r)
        c["verdict"] = f"{MARK[r.verdict]} {c['verdict']}"
        out.append("| " + " | ".join(_md_escape(c[k]) for _, k in _MD_COLUMNS) + " |")
    return out


def markdown(report: CheckReport) -> str:
    """What a pull-request comment shows: the headline, the warnings, the cases that are not ``ok``, then every
    case in a collapsible ``<details>`` block."""
    out = [f"### {headline(report)}", ""]
    gate = ("timing gated" if report.timing_gated else "timing **not gated** ("
            + ("another environment" if report.env_differences else "--no-gate-timing") + ")")
    floor = (f"a timing counts beyond max({100 * MIN_EFFECT:.0f}%, {NOISE_MULTIPLE:g}× round CV) with p < {ALPHA:g}; "
             f"over processes beyond {100 * MIN_EFFECT:.0f}% with its {100 * (1 - ALPHA):g}% interval clear of 1")
    commit = f" (commit `{report.baseline_commit[:10]}`)" if report.baseline_commit else ""
    out += [f"Suite `{report.suite}` against the baseline of {report.baseline_created or '?'}{commit}: {gate}; "
            f"{floor}.", "", power_line(report) + ".", ""]
    if report.warnings:
        out += [f"> ⚠️ {_md_escape(w)}" for w in report.warnings]
        out.append("")
    bad = report.not_ok()
    if bad:
        out += _md_table(bad)
        out.append("")
    out += [f"<details><summary>All {len(report.rows)} cases</summary>", ""]
    out += _md_table(report.rows)
    out += ["", "</details>", ""]
    return "\n".join(out)


def check_table(report: CheckReport, title: str = "") -> Table:
    """The check in the terminal: per case the medians, the ratio with its 95 % interval, p, the floor, the
    verdict and what changed; cases that are not ok first."""
    table = Table(title=title or f"check · {headline(report)}", header_style="bold")
    for col, just in (("line", "left"), ("case", "left"), ("baseline ms", "right"), ("candidate ms", "right"),
                      ("ratio [95% CI]", "right"), ("p", "right"), ("floor", "right"), ("verdict", "left"),
                      ("changes", "left")):
        table.add_column(col, justify=just, no_wrap=col not in ("case", "changes", "verdict"), overflow="fold")
    rows = sorted(report.rows, key=lambda r: r.verdict == "ok")
    for r in rows:
        c = _cells(r)
        table.add_row(r.line, r.label, c["base"], c["cand"], c["ratio"], c["p"], c["floor"],
                      f"[{STYLE[r.verdict]}]{c['verdict']}[/]", c["changes"])
    return table
