"""``bench bisect``: the first commit between two refs at which a case got slower (or an exact metric changed), each
probed commit measured side by side with the good ref as ``bench check --against`` measures (harness.engine.bisect)
and judged by the gate's check (reports.check)."""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import click

from cli.common import (check_processes, debugging, err, load_plugins, out, plugin_option, processes_option,
                        show_logs, store_option)
from cli.check import rejudge_paired
from cli.history import repo_option
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from harness.contract.spec import Case
from harness.engine.checks import WORKLOAD_CHECKS
from harness.contract.suite import Suite, load_suite, parse_set
from harness.engine.bisect import Bisection, Probe, bisect, good_tree, measure_commit
from harness.engine.commits import REPO, Commit, commits_between, resolve
from harness.engine.env import fingerprint
from harness.engine.replicate import GATE_PROCESSES, add_processes
from harness.session import Run, run_options
from harness.engine.runner import RunOptions
from harness.store.db import Store
from reports.check.baseline import baseline_document, parse_baseline
from reports.check.report import CheckReport, CheckRow, check_run

def case_text(c: Case) -> str:
    """What ``--case TEXT`` matches a case on: its line, arch, key and ``name=value`` of its settings."""
    w = dataclasses.asdict(c.workload) if dataclasses.is_dataclass(c.workload) else {}
    return " ".join([c.line, c.arch, c.key, *(f"{k}={v}" for k, v in (*c.overrides, *w.items()))])


def select_cases(suite: Suite, text: str) -> list[Case]:
    cases = [c for c in suite.cases if text.lower() in case_text(c).lower()]
    if not cases:
        raise BenchInputError(f"no case of {suite.name} matches {text!r}", where="--case")
    return cases


def _env_at(commit: Commit, cases: list[Case]) -> dict:
    env = fingerprint(threads=max(c.workload.threads or 0 for c in cases) or None)
    env["soft"] = {**env["soft"], "commit": commit.sha, "dirty": False}
    return env


def _row_text(row: CheckRow) -> str:
    if row.verdict == "changed":
        return "; ".join(f.text for f in row.changed)
    if row.timing is None:
        return f"status {row.base_status} → {row.status}"
    t = row.timing
    mde = f"smallest detectable {100 * t.mde:.0f}%" if t.mde is not None and t.mde < 10 else "smallest detectable > 1000%"
    return f"×{t.ratio:.3f} [{t.ci_low:.3f}, {t.ci_high:.3f}] {t.verdict} ({mde}, {t.processes[0]}+{t.processes[1]} processes)"


def _against_step(row: CheckRow, steps: Mapping[str, float]) -> str:
    """An inconclusive timing judged against the step the bad ref showed (ratio ``s`` > 1): "bad" when its interval
    lies above √s (the geometric middle between no change and the step), "good" when below, else ""."""
    s, t = steps.get(row.case_key), row.timing
    if s is None or s <= 1 or t is None or row.verdict != "inconclusive" or any(
            n.startswith("machine busy") for n in row.notes):
        return ""
    mid = math.sqrt(s)
    return "bad" if t.ci_low > mid else "good" if t.ci_high < mid else ""


def probe_side(report: CheckReport, exact_only: bool = False,
               steps: Mapping[str, float] | None = None) -> tuple[str, str, str]:
    """(side, detail, why) of a probe from its check: bad when a case regressed, changed or failed; inconclusive
    when one could not tell (and none is bad); else good. ``steps`` (case key → the bad ref's regressed ratio): an
    inconclusive timing whose interval lies wholly below or above the middle of that step is on that side — a
    bisection asks "does this commit have the step?", not "is it within 5 %?". ``exact_only``: the search is for an
    exact metric's change (the bad ref differed in nothing else): bad when one changed or a case failed, else good."""
    rows = report.rows
    detail = "; ".join(f"{r.name}: {_row_text(r)}" for r in rows)
    if exact_only:
        return ("bad" if any(r.changed or r.verdict == "failed" for r in rows) else "good"), detail, ""
    judged = {r.case_key: _against_step(r, steps or {}) for r in rows}
    if any(r.verdict in ("regressed", "changed", "failed") or judged[r.case_key] == "bad" for r in rows):
        return "bad", detail, ""
    unsure = [r for r in rows if r.verdict in ("inconclusive", "missing", "new") and judged[r.case_key] != "good"]
    if unsure:
        whys = []
        for r in unsure:
            busy = [n for n in r.notes if n.startswith("machine busy")]
            if busy:
                whys.append(f"{r.name}: {busy[0]}")
            elif r.timing is not None:
                whys.append(f"{r.name}: ×{r.timing.ratio:.3f}, its interval [{r.timing.ci_low:.3f}, "
                            f"{r.timing.ci_high:.3f}] cannot tell: the effect is below the smallest detectable one")
            else:
                whys.append(f"{r.name}: {r.verdict}")
        return "inconclusive", detail, "; ".join(whys)
    return "good", detail, ""


def _pooled(first: tuple[CaseRecord, CaseRecord] | None,
            again: tuple[CaseRecord, CaseRecord]) -> tuple[CaseRecord, CaseRecord]:
    """Both versions' second measurement of a case after their first, as one record a side (their processes
    pooled, so the look again sees more than either look alone); the second alone when the two do not pool."""
    if first is None:
        return again
    try:
        return add_processes(first[0], again[0]), add_processes(first[1], again[1])
    except ValueError:
        return again


def _check(baseline_run: RunRecord, base: list[CaseRecord], cand_run: RunRecord, cand: list[CaseRecord],
           label: str) -> CheckReport:
    doc = baseline_document(baseline_run, base)
    doc["suite"] = cand_run.suite
    return check_run(parse_baseline(doc, label), cand_run, cand, paired=True)


@dataclasses.dataclass(frozen=True)
class _Probing:
    store: Store
    suite: Suite
    cases: list[Case]
    opts: RunOptions
    quick: bool
    good: Commit
    tree: Path
    repo: Path
    processes: int
    asked: dict[str, bool] = dataclasses.field(default_factory=dict)     # "exact": bisecting an exact metric
    steps: dict[str, float] = dataclasses.field(default_factory=dict)    # case key → the bad ref's regressed ratio

    def __call__(self, commit: Commit) -> Probe:
        label = f"{self.suite.name}@"
        sides = [Run.open(self.store, label + c.short, self.cases, quick=self.quick, env=_env_at(c, self.cases),
                          options={"by": "bench bisect", "good": self.good.sha, "probe": commit.sha},
                          suite_path=self.suite.path, suite_text=self.suite.text, spec=self.suite.spec)
                 for c in (self.good, commit)]
        exact = self.asked.get("exact", False)
        processes = 1 if exact else self.processes      # an exact metric is the same in every process
        with sides[0], sides[1]:
            pairs = measure_commit(self.cases, self.opts, self.tree, commit, self.repo, processes=processes,
                                   on_pair=lambda b, c: (sides[0].add(b), sides[1].add(c)))
        report = _check(sides[0].record(), [p[0] for p in pairs], sides[1].record(), [p[1] for p in pairs],
                        f"{self.good.short} (measured now)")
        todo = [c for c in self.cases if c.key in set(report.inconclusive_keys())] if not exact else []
        if todo:
            err.print(f"  {len(todo)} inconclusive case(s): measuring both versions of them once more", highlight=False)
            first = {b.case_key: (b, c) for b, c in pairs}
            again = measure_commit(todo, self.opts, self.tree, commit, self.repo, seed=1, processes=self.processes)
            report = rejudge_paired(report, [_pooled(first.get(b.case_key), (b, c)) for b, c in again])
        side, detail, why = probe_side(report, exact, self.steps)
        if "exact" not in self.asked:           # the first probe (the bad ref) sets the question
            slower = any(r.timing is not None and r.timing.verdict == "regressed" for r in report.rows)
            self.steps.update({r.case_key: r.timing.ratio for r in report.rows
                               if r.timing is not None and r.timing.verdict == "regressed"})
            self.asked["exact"] = side == "bad" and not slower and any(r.changed for r in report.rows)
            if self.asked["exact"]:
                err.print("the bad ref differs from the good one in exact metrics, not in timing: bisecting on "
                          "those metrics, one process a version", highlight=False)
        return Probe(commit, side, detail, why)  # type: ignore[arg-type]


def bisect_summary(b: Bisection, wall_s: float) -> tuple[str, int]:
    """The closing line and the exit code (0 a commit named, 1 no regression in the range, 3 inconclusive)."""
    n = len(b.steps)
    if b.outcome == "found" and b.first_bad is not None:
        probe = next(p for p in b.steps if p.commit.sha == b.first_bad.sha)
        return (f"first bad commit: {b.first_bad.sha} {b.first_bad.subject!r}: {probe.detail} "
                f"({n} steps, {wall_s:.0f} s)"), 0
    if b.outcome == "none":
        return (f"no regression between {b.good.short} and {b.bad.short}: {b.steps[0].detail} "
                f"({n} step, {wall_s:.0f} s)"), 1
    lo = b.last_good.short if b.last_good else b.good.short
    hi = b.first_bad.short if b.first_bad else b.bad.short
    return (f"inconclusive: {b.steps[-1].why}; the first bad commit is after {lo} and at or before {hi} "
            f"({n} steps, {wall_s:.0f} s)"), 3


@click.command("bisect")
@click.argument("suite_ref", metavar="SUITE")
@click.option("--good", "good_ref", required=True, metavar="REF", help="A commit where the case was fine.")
@click.option("--bad", "bad_ref", required=True, metavar="REF", help="A later commit where it is slower.")
@click.option("--case", "case", default="", metavar="TEXT", help="Only the cases whose line, arch or settings "
              "contain TEXT (default: every case of the suite; a probe is bad when one of them is).")
@click.option("--quick", is_flag=True, help="The suite's [quick] sizes and shorter timing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Pin a suite key (repeatable).")
@processes_option(GATE_PROCESSES, "as `bench check --against`")
@repo_option
@store_option
@plugin_option
def bisect_cmd(suite_ref: str, good_ref: str, bad_ref: str, case: str, quick: bool, sets: tuple[str, ...],
               processes: int | None, repo: str | None, store_url: str | None, plugins: tuple[str, ...]) -> None:
    """The first commit between --good and --bad at which a case got slower (or an exact metric changed): each
    probed commit measured side by side with --good, as `bench check --against` measures; about log2(commits) + 1
    steps. Exits 0 naming the commit, 1 when the range holds no regression, 3 when a step cannot tell, 2 on bad
    input."""
    root = Path(repo).resolve() if repo else REPO
    good, bad = resolve(good_ref, root, "--good"), resolve(bad_ref, root, "--bad")
    commits = commits_between(good, bad, root)
    plugin_files = load_plugins(plugins)
    suite = load_suite(suite_ref, quick=quick, sets=parse_set(sets), checks=WORKLOAD_CHECKS)
    cases = select_cases(suite, case)
    processes = max(2, check_processes(processes, "process", GATE_PROCESSES))
    show_logs()
    store = Store(store_url)
    opts = run_options(quick, debug=debugging(), plugins=plugin_files, processes=processes)
    expected = 1 + max(1, (len(commits) - 1).bit_length())
    err.print(f"bisecting {len(commits)} commits after {good.short} up to {bad.short} ({len(cases)} case(s), "
              f"{processes} processes per version): about {expected} steps", highlight=False)
    t0 = time.perf_counter()
    with good_tree(good, root) as tree:
        probing = _Probing(store, suite, cases, opts, quick, good, tree, root, processes)

        shown: list[Probe] = []

        def on_step(p: Probe) -> None:
            shown.append(p)
            out.print(f"step {len(shown)}: {p.commit.short} {p.side}: {p.detail}" + (f" — {p.why}" if p.why else "")
                      + f"  ({p.commit.subject[:60]})", highlight=False, soft_wrap=True)
        result = bisect(good, commits, probing, on_step)
    line, code = bisect_summary(result, time.perf_counter() - t0)
    out.print(line, highlight=False, soft_wrap=True)
    sys.exit(code)


COMMANDS = (bisect_cmd,)
