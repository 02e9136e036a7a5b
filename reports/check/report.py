"""The check itself: a measured run against a :class:`~reports.check.baseline.Baseline`, one verdict per case
(:func:`check_run`; the order of precedence is in :mod:`reports.check`'s docstring). Pure, torch-free."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.contract.records import FAILED, CaseRecord, RunRecord
from reports.check.baseline import Baseline, BaselineCase
from reports.check.metrics import DETERMINISTIC, MetricFinding, metric_findings
from reports.check.timing import TimingVerdict, busy_note, n_processes, not_on_busy, timing_verdict
from reports.compare import env_differences
from reports.labels import case_params, param_labels

VERDICTS = ("ok", "regressed", "improved", "changed", "failed", "missing", "new", "inconclusive")
FAILING = ("regressed", "changed", "failed", "missing")
"""Case verdicts that fail the check."""


@dataclass(frozen=True)
class CheckRow:
    """One case of the check. ``kind``: ``both`` (in the baseline and this run), ``missing`` or ``new``.
    ``timing`` is None where either side has no ok timing; ``timing_gated`` says whether it decides the verdict."""

    case_key: str
    line: str
    arch: str
    label: str                                  # arch and the fields that tell the cases apart (reports.labels)
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
    base_occasions_ms: tuple[tuple[float, ...], ...] = field(default=(), repr=False)

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

    def gated_timings(self) -> list[CheckRow]:
        """The rows whose timing verdict decides (compared and gated)."""
        return [r for r in self.rows if r.timing is not None and r.timing_gated]

    def inconclusive_keys(self) -> list[str]:
        """Cases whose gated timing verdict is inconclusive."""
        return [r.case_key for r in self.gated_timings() if r.timing.verdict == "inconclusive"]

    def blind_mde(self) -> float | None:
        """The largest smallest-detectable-slowdown over the gated timings that are inconclusive (what this check
        could have missed); None when every gated timing was decided (or none is gated)."""
        mdes = [r.timing.mde for r in self.gated_timings() if r.timing.verdict == "inconclusive"]
        return max(mdes) if mdes else None

    def blind(self, max_mde: float) -> list[CheckRow]:
        """The gated timings left inconclusive that could not have seen a slowdown of ``max_mde`` (a fraction):
        ``bench check --max-mde`` fails on them."""
        return [r for r in self.gated_timings() if r.timing.verdict == "inconclusive" and r.timing.mde > max_mde]

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
                                     cand_processes=cand_processes, base_occasions_ms=row.base_occasions_ms)
        verdict = not_on_busy(verdict, busy)
        notes = row.notes + ((busy,) if busy and busy not in row.notes else ())
        new = dataclasses.replace(row, timing=verdict, remeasured=True, notes=notes)
        return dataclasses.replace(self, rows=tuple(new if r.case_key == case_key else r for r in self.rows))


def _timing_sides(base: BaselineCase, cand: CaseRecord, paired: bool = False) -> TimingVerdict | None:
    if base.status != "ok" or not cand.ok or base.timing is None or not cand.samples_s:
        return None
    rounds = cand.rounds if cand.rounds and sum(cand.rounds) == len(cand.samples_s) else ()
    paired = paired and len(rounds) >= 2 and len(rounds) == len(base.timing.rounds or ())
    return not_on_busy(timing_verdict(base.timing.samples_s, base.timing.rounds, cand.samples_s, rounds,
                                      paired=paired, base_processes=base.timing.n_processes,
                                      cand_processes=n_processes(cand),
                                      base_occasions_ms=base.timing.occasion_medians_ms), busy_note(cand))


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
    labels = dict(zip((r.case_key for r in shown), zip(case_params(shown), param_labels(shown, arch=True))))

    rows: list[CheckRow] = []
    for b, c in both:
        params, label = labels[b.case_key]
        ident = dict(case_key=b.case_key, line=b.line, arch=b.arch, label=label, params=params,
                     base_samples=b.timing.samples_s if b.timing else (),
                     base_rounds=b.timing.rounds if b.timing else (),
                     base_processes=b.timing.n_processes if b.timing else 1,
                     base_occasions_ms=b.timing.occasion_medians_ms if b.timing else ())
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
