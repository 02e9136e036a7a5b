"""A case measured in several fresh worker processes, its records merged into one (``--processes N``).

The process is the unit of replication (:mod:`harness.analysis.process_stats`): a timing's interval has to cover the
luck of a fresh process, not only the noise inside one. :func:`per_process_timing` splits one case's timing
budget over the N processes (Kalibera & Jones: when the between-process spread dominates, spend the budget on
processes, not on iterations), and :func:`merge_processes` makes the case's record: samples and rounds of
process 0, then of process 1, ...; the timing summary over all samples, then the process-level interval in
place of the pooled one; ``n_processes``, ``n_rounds``, ``n_samples``, ``process_rounds`` (rounds per process)
and each process's median (``process_median_ms_<i>``) stored with it.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from harness.contract.records import CaseRecord
from harness.contract.replication import PRECISION
from harness.analysis.stats import summarize_rounds
from harness.engine.overhead import CASE_PARTS, metric_name
from harness.instruments.timing import TimingConfig

GATE_PROCESSES = 5
"""Worker processes per case for ``bench baseline`` and ``bench check`` (their ``--processes`` default); chosen
with scripts/gate-rates on a shared 2-core machine (README, "CI: regression checks")."""

MAX_STORED_MEDIANS = 64
"""At most this many per-process medians are stored as metrics (the samples keep them all)."""


def per_process_timing(timing: TimingConfig, n: int) -> TimingConfig:
    """Each of ``n`` processes times a case for 1/n of the single-process budget (samples and seconds; at
    least one sample per round), keeping the rounds."""
    if n <= 1:
        return timing
    return dataclasses.replace(timing, min_samples=max(timing.rounds, math.ceil(timing.min_samples / n)),
                               min_time_s=timing.min_time_s / n, max_time_s=max(timing.max_time_s / n, 0.5))


def imprecise(groups: Sequence[Sequence[str]], parts: Mapping[str, Sequence[CaseRecord]],
              precision: float = PRECISION) -> list[int]:
    """The indices of ``groups`` (case keys timed side by side, each with its records so far, one per process)
    whose 95 % interval over processes is wider than ×/÷ ``precision``
    (:func:`harness.analysis.process_stats.group_halfwidth`: a pair's ratio for a group, a case's own median
    alone; a case without samples has no say). A group with a case not ok in some process is left as it is: the
    failure is its result.
    Adding processes until an interval is narrow enough is a fixed-width sequential procedure: the rule reads
    the spread, never the ratio's value or its significance."""
    from harness.analysis.process_stats import group_halfwidth

    limit = math.log(precision)
    out = []
    for i, keys in enumerate(groups):
        recs = [parts[k] for k in keys]
        if not all(r.ok for rs in recs for r in rs):
            continue
        timed = [rs for rs in recs if all(r.samples_s for r in rs)]         # a case that is not timed has no say
        medians = [[statistics.median(r.samples_s) for r in rs] for rs in timed]
        if timed and group_halfwidth(medians) > limit:
            out.append(i)
    return out


def timing_metrics(samples_s: Sequence[float], rounds: Sequence[int], n_processes: int) -> dict[str, float]:
    """:func:`harness.analysis.stats.summarize_rounds` of the pooled samples, then — with two processes or more — the
    process-level interval (:func:`harness.analysis.process_stats.process_summary`) as ``ci_low_ms``/``ci_high_ms``, and
    the counts. The pooled interval stays as ``pooled_ci_low_ms``/``pooled_ci_high_ms``."""
    from harness.analysis.process_stats import process_groups, process_summary   # scipy.stats: not at worker start

    out = summarize_rounds(samples_s, rounds)
    out["n_samples"] = float(len(samples_s))
    out["n_rounds"] = float(len(rounds))
    out["n_processes"] = float(max(1, n_processes))
    groups = process_groups(samples_s, rounds, n_processes)
    if groups is None:
        return out
    ps = process_summary(groups)
    out["pooled_ci_low_ms"], out["pooled_ci_high_ms"] = out["ci_low_ms"], out["ci_high_ms"]
    out.update(ps.metrics())
    out["process_rounds"] = float(len(rounds) // n_processes)
    out["ci_low_ms"], out["ci_high_ms"] = ps.ci_low_ms, ps.ci_high_ms
    for i, m in enumerate(ps.medians_ms[:MAX_STORED_MEDIANS]):
        out[f"process_median_ms_{i}"] = m
    return out


def _summed_parts(records: Sequence[CaseRecord]) -> dict[str, float]:
    """The seconds each part of a case took (harness.engine.overhead), summed over the processes it ran in: the run's
    account of where its wall time went counts every process, not the first alone."""
    names = [metric_name(p) for p in CASE_PARTS]
    return {n: sum(r.metrics.get(n, 0.0) or 0.0 for r in records) for n in names
            if any(n in r.metrics for r in records)}


def merge_processes(parts: Sequence[CaseRecord]) -> CaseRecord:
    """One case's records from several processes (in process order) as one record. A process where the case
    was not ok decides the record (its failure is the result, never hidden by the others); otherwise the
    counted metrics and memory come from the first process, the timing from all of them (a process with a
    different round count than the first is left out, so the rounds still cut into processes)."""
    if not parts:
        raise ValueError("merge_processes() needs at least one record")
    bad = next((r for r in parts if not r.ok), None)
    if bad is not None or len(parts) == 1:
        return bad if bad is not None else parts[0]
    first = parts[0]
    timed = [r for r in parts if r.samples_s and r.rounds and sum(r.rounds) == len(r.samples_s)]
    if not timed:
        return first
    timed = [r for r in timed if len(r.rounds) == len(timed[0].rounds)]
    samples = tuple(x for r in timed for x in r.samples_s)
    rounds = tuple(n for r in timed for n in r.rounds)
    metrics = dict(first.metrics)
    metrics.update(timing_metrics(samples, rounds, len(timed)))
    metrics.update(_summed_parts(parts))
    loads = [r.metric("load_others_cores") for r in timed if r.metric("load_others_cores") is not None]
    if loads:
        metrics["load_others_cores"] = max(loads)
        metrics["load_busy"] = float(any(r.metric("load_busy") for r in timed))
    metrics["throughput_per_s"] = first.workload.get("batch_size", 1) / (metrics["median_ms"] / 1e3)
    return dataclasses.replace(first, samples_s=samples, rounds=rounds, metrics=metrics,
                               duration_s=sum(r.duration_s for r in parts))


def add_processes(merged: CaseRecord, more: CaseRecord) -> CaseRecord:
    """``merged`` (a case measured in P worker processes, :func:`merge_processes`) with the processes of ``more``
    (the same case measured again in fresh ones, as many rounds each) after its own: what ``bench check`` does to
    a case that could not yet see the slowdown it is asked to (:mod:`reports.check.adaptive`). A side that is not
    ok decides the record, as in :func:`merge_processes`. Raises ValueError when the two do not cut into processes
    of the same number of rounds (then the merged rounds could not be cut apart again)."""
    if not merged.ok or not more.ok:
        return merged if not merged.ok else more
    n1, n2 = (max(1, int(r.metric("n_processes") or 1)) for r in (merged, more))
    for r, n in ((merged, n1), (more, n2)):
        if not r.samples_s or not r.rounds or sum(r.rounds) != len(r.samples_s) or len(r.rounds) % n:
            raise ValueError(f"{r.case_key}: {n} process(es) whose rounds do not cut apart")
    if len(merged.rounds) // n1 != len(more.rounds) // n2:
        raise ValueError(f"{merged.case_key}: {len(merged.rounds) // n1} rounds a process, then "
                         f"{len(more.rounds) // n2}")
    samples, rounds = merged.samples_s + more.samples_s, merged.rounds + more.rounds
    metrics = {k: v for k, v in merged.metrics.items() if not k.startswith("process_median_ms_")}
    metrics.update(timing_metrics(samples, rounds, n1 + n2))
    metrics.update(_summed_parts((merged, more)))
    loads = [r.metric("load_others_cores") for r in (merged, more) if r.metric("load_others_cores") is not None]
    if loads:
        metrics["load_others_cores"] = max(loads)
        metrics["load_busy"] = float(any(r.metric("load_busy") for r in (merged, more)))
    metrics["throughput_per_s"] = merged.workload.get("batch_size", 1) / (metrics["median_ms"] / 1e3)
    return dataclasses.replace(merged, samples_s=samples, rounds=rounds, metrics=metrics,
                               duration_s=merged.duration_s + more.duration_s)
