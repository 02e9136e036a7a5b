"""Measure until the check can see: more worker processes for the cases whose smallest detectable slowdown is
still above a target, until it is met or a time budget is spent (pure: the measuring is a callback).

A case is measured again while its gated timing is ``inconclusive`` and its MDE (the slowdown it would call
``regressed`` with 80 % power, :mod:`harness.analysis.comparison`) is above ``target`` — and only when more
processes can bring it there: against a file baseline of few occasions the baseline's own spread holds the MDE
up (:attr:`~harness.analysis.comparison.Comparison.reachable_mde`: the baseline's part of the spread stays however
many processes the candidate adds), and measuring this occasion again would not lower it. Each batch adds the same number of processes to every such case (process pairs with ``--against``);
a batch is started only when the time spent so far plus its predicted time (the last batch's time per case) stays
within ``budget_s``. Stopping at a decided verdict reads the test more than once; at ALPHA = 0.002 a few looks
keep the false alarm rate of a case below about 1 %.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from reports.check.report import CheckReport, CheckRow


@dataclass(frozen=True)
class Reach:
    """What one case's timing reached: its MDE before and after, the batches of processes added, whether the
    target was met, and why not (``budget spent``, ``the baseline's 3 occasions allow ≥ 31 %``, ...)."""

    case_key: str
    name: str
    start_mde: float
    mde: float
    batches: int
    units: str                 # what the final interval is over, e.g. "15 paired processes"
    met: bool
    why: str = ""

    @property
    def text(self) -> str:
        """``resnet-micro · resnet-micro: MDE 143% → 18% with 2 more batches (15 paired processes): target met``."""
        more = f" with {self.batches} more batch{'es' if self.batches != 1 else ''}" if self.batches else ""
        how = self.why or ("target met" if self.met else "not met")
        return (f"{self.name}: MDE {_pct(self.start_mde)} → {_pct(self.mde)}{more} ({self.units}): {how}")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if math.isfinite(x) else "∞"


def wanting(report: CheckReport, target: float) -> list[CheckRow]:
    """The gated timings left inconclusive whose MDE is above ``target`` (a fraction)."""
    return [r for r in report.gated_timings() if r.timing.verdict == "inconclusive" and r.timing.mde > target]


def measure_until(report: CheckReport, more: Callable[[list[str]], CheckReport], *, target: float,
                  budget_s: float, per_case_s: float, started: float,
                  clock: Callable[[], float] = time.monotonic,
                  say: Callable[[str], None] = lambda _: None) -> tuple[CheckReport, tuple[Reach, ...]]:
    """Call ``more(case_keys)`` — measure those cases in one more batch of processes and return the report re-judged
    — while some case wants more (:func:`wanting`) and can get there, and the batch is predicted to end within
    ``budget_s`` of ``started`` (``clock``'s time when the check began). ``per_case_s``: the predicted seconds of a
    batch per case before one has run (then the last batch's). Returns the final report and, per case that
    wanted more at the start, what it reached."""
    start = {r.case_key: r for r in wanting(report, target)}
    batches = dict.fromkeys(start, 0)
    stopped: dict[str, str] = {}
    while True:
        todo = []
        for r in wanting(report, target):
            c = r.timing.comparison
            if c.reachable_mde > target:
                what = (f"the baseline's {c.n_a} occasions" if c.level == "occasions" else
                        f"the baseline's own spread ({c.n_a} {'processes' if c.level == 'processes' else c.level})")
                stopped[r.case_key] = (f"{what} allow ≥ {_pct(c.reachable_mde)} (`bench baseline --append` adds "
                                       "occasions)")
            elif r.case_key not in stopped:
                todo.append(r.case_key)
        if not todo:
            break
        if clock() - started + per_case_s * len(todo) > budget_s:
            for k in todo:
                stopped[k] = f"budget spent ({clock() - started:.0f} s of {budget_s:.0f} s)"
            break
        say(f"{len(todo)} case(s) could not yet see a {_pct(target)} slowdown: measuring them in more processes")
        t0 = clock()
        try:
            report = more(todo)
        except ValueError as exc:           # processes that would not cut apart again: keep what was measured
            for k in todo:
                stopped[k] = f"could not add processes ({exc})"
            break
        per_case_s = (clock() - t0) / len(todo)
        for k in todo:
            batches[k] = batches.get(k, 0) + 1
    out = []
    for key, first in start.items():
        row = report.row(key)
        t = row.timing
        mde = t.mde if t is not None else math.inf
        if t is not None and t.verdict != "inconclusive" and mde > target:
            met, why = True, f"decided: {t.verdict}"
        else:
            met, why = mde <= target, "" if mde <= target else stopped.get(key, "")
        out.append(Reach(key, row.name, first.timing.mde, mde, batches.get(key, 0),
                         t.comparison.units_text if t is not None else "-", met, why))
    return report, tuple(out)
