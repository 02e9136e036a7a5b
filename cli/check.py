"""``bench baseline`` and ``bench check``: a CI regression gate against a committed baseline file, or against
another commit of the code measured in the same job (``--against REF``)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from cli.common import (check_processes, debugging, err, invocation, load_plugins, out, plugin_option,
                        processes_option, show_logs, store_option)
from harness.engine.ab import interleave_versions, worktree
from harness.engine.env import fingerprint
from harness.contract.errors import BenchInputError
from harness.executors import EXECUTORS
from harness.contract.records import FAILED, CaseRecord, RunRecord
from harness.engine.replicate import GATE_PROCESSES, add_processes
from harness.session import Run, run_options
from harness.engine.runner import RunOptions
from harness.contract.spec import Case
from harness.store.db import Store
from harness.engine.checks import WORKLOAD_CHECKS
from harness.contract.suite import Suite, load_suite, parse_set
from reports.check.baseline import (append_occasions, baseline_document, load_baseline, parse_baseline,
                                    process_medians_ms, write_document)
from harness.analysis.comparison import FLOOR
from reports.check.adaptive import Reach, measure_until
from reports.check.render import check_table, headline, markdown, power_line, reach_lines
from reports.check.report import CheckReport, check_run
from reports.check.timing import busy_note, n_processes
from reports.labels import case_labels


def _measure(store: Store, suite: Suite, cases: list[Case], opts: RunOptions, executor: str, quick: bool,
             by: str) -> tuple[RunRecord, list[CaseRecord]]:
    """Measure ``cases`` as a new run of ``suite`` in ``store`` (no calibration: the gate compares runs)."""
    with Run.open_suite(store, suite, cases, quick=quick, options={"by": by},
                        invocation=invocation(executor=executor, processes=opts.processes)) as run:
        run.execute(executor, opts, on_record=lambda r: err.print(
            f"  {r.line} {r.arch} → {r.status}" + (f" {r.metric('median_ms'):.3g} ms" if r.metric("median_ms") else ""),
            highlight=False))
    return run.record(), run.records()


def _write(path: str, text: str, where: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {path}: {exc.strerror}", where=where) from None


_PROCESSES_WHY = ("the between-process spread is what a rerun sees; the A/A check passes with the default: "
                  "README, CI: regression checks")


def _spending(n_cases: int, processes: int) -> str:
    """Where the processes go, said in the output (a gate spends them; `bench run` does not by default)."""
    if processes == 1:
        return (f"measuring {n_cases} cases in one worker process: intervals cover this process only, and a "
                "timing verdict cannot see a fresh process's luck")
    return (f"measuring {n_cases} cases in {processes} fresh worker processes each (the timing budget split "
            "between them): intervals and tests are over processes")


BASELINE_OCCASIONS = 5
"""Occasions `bench baseline` measures the suite on by default (the A/A check against a file passes with it)."""


@click.command("baseline")
@click.argument("suite_ref", metavar="SUITE")
@click.option("-o", "--output", required=True, metavar="FILE.json", help="The baseline file to write.")
@click.option("--quick", is_flag=True, help="The suite's [quick] sizes and shorter timing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Pin a suite key (repeatable).")
@click.option("--executor", type=click.Choice(sorted(EXECUTORS)), default="process", show_default=True)
@processes_option(GATE_PROCESSES, _PROCESSES_WHY)
@click.option("--occasions", type=int, default=BASELINE_OCCASIONS, show_default=True,
              help="Measure the suite this many times, one after the other, each in --processes fresh workers: a "
                   "check against the file then covers the drift between occasions (README, CI).")
@click.option("--append", is_flag=True,
              help="Add this measurement's occasions to FILE.json (same suite, cases, code and machine) instead of "
                   "replacing it: a baseline grown over days covers the drift of days.")
@store_option
@plugin_option
def baseline_cmd(suite_ref: str, output: str, quick: bool, sets: tuple[str, ...], executor: str, processes: int | None,
                 occasions: int, append: bool, store_url: str | None, plugins: tuple[str, ...]) -> None:
    """Measure SUITE and write a baseline: every case's deterministic metrics (MACs, params, analytic and
    tensor-peak bytes), RSS, timings with their raw samples in rounds (per occasion, each process's median),
    and the environment fingerprint."""
    if occasions < 1:
        raise BenchInputError(f"--occasions must be at least 1, got {occasions}", where="--occasions")
    plugin_files = load_plugins(plugins)
    suite = load_suite(suite_ref, quick=quick, sets=parse_set(sets), checks=WORKLOAD_CHECKS)
    if Path(output).is_dir():
        raise BenchInputError(f"{output} is a directory", where="--output")
    old = _appendable(output) if append else None
    processes = check_processes(processes, executor, GATE_PROCESSES)
    show_logs()
    opts = run_options(quick, debug=debugging(), plugins=plugin_files, processes=processes)
    err.print(_spending(len(suite.cases), processes)
              + (f"; on {occasions} occasions, one after the other" if occasions > 1 else ""))
    store = Store(store_url)
    first: tuple[RunRecord, list[CaseRecord]] | None = None
    medians: dict[str, list[list[float]]] = {c.key: [] for c in suite.cases}
    for k in range(occasions):
        if occasions > 1:
            err.print(f"occasion {k + 1} of {occasions}")
        run, records = _measure(store, suite, list(suite.cases), opts, executor, quick, "bench baseline")
        first = first or (run, records)
        for r in records:
            if r.ok and r.samples_s:
                medians.setdefault(r.case_key, []).append(process_medians_ms(r))
    run, records = first
    doc = baseline_document(run, records, {k: v for k, v in medians.items() if len(v) >= 2})
    if old is not None:
        doc = append_occasions(old, doc, output)
    write_document(output, doc)
    bad = [f"{label} {r.status}" for r, label in zip(records, case_labels(records)) if not r.ok]
    held = max(((c.get("timing") or {}).get("n_occasions", 1) for c in doc["cases"]), default=1)
    out.print(f"{'appended to' if old is not None else 'wrote'} {output}: {len(records)} cases of {suite.name} "
              f"(run {run.id}; {held} occasion{'s' if held != 1 else ''})"
              + (f"; {len(bad)} not ok: " + ", ".join(bad) if bad else ""),
              highlight=False, soft_wrap=True)


def _appendable(path: str) -> dict | None:
    """The baseline document at ``path`` for ``--append`` (None when there is no file yet: it is written)."""
    if not Path(path).exists():
        return None
    try:
        load_baseline(path)
    except BenchInputError as exc:
        raise BenchInputError(str(exc), where="--append") from None
    return json.loads(Path(path).read_text(encoding="utf-8"))


TARGET_MDE = 20.0
"""``bench check --target-mde`` (percent): measure a case in more processes until it could see a slowdown this
large (README, CI guide: the measurements behind it)."""
BUDGET_S = 240.0
"""``bench check --budget`` (seconds): the check adds processes only while it is predicted to end within this."""
EXIT_BLIND = 3
"""Exit status of a check that could not see the slowdown ``--max-mde`` asks for (0 passed, 1 failed, 2 bad
input)."""


@click.command("check")
@click.argument("suite_ref", metavar="SUITE")
@click.option("--baseline", "baseline_path", default=None, metavar="FILE.json",
              help="The baseline to check against (written by `bench baseline`).")
@click.option("--against", "ref", default=None, metavar="GIT_REF",
              help="Check against another commit instead: its code and this checkout's, timed in alternating "
                   "worker processes in this job.")
@click.option("--quick", is_flag=True, help="The suite's [quick] sizes and shorter timing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Pin a suite key (repeatable).")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE.md",
              help="Also write the summary as Markdown (a pull-request comment).")
@click.option("--gate-timing/--no-gate-timing", default=None,
              help="Gate timings even against a baseline from another machine (default: only on the same "
                   "hardware and software); --no-gate-timing gates only the deterministic metrics.")
@click.option("--executor", type=click.Choice(sorted(EXECUTORS)), default="process", show_default=True)
@processes_option(GATE_PROCESSES, _PROCESSES_WHY)
@click.option("--target-mde", type=float, default=TARGET_MDE, show_default=True, metavar="PCT",
              help="Measure a case whose timing is inconclusive in more processes until it could see a slowdown "
                   "of PCT percent (its MDE), or --budget is spent.")
@click.option("--budget", type=float, default=BUDGET_S, show_default=True, metavar="SECONDS",
              help="Add processes only while the whole check is predicted to end within this (0: never add).")
@click.option("--max-mde", type=float, default=None, metavar="PCT",
              help=f"Fail (exit {EXIT_BLIND}) when a timing is left inconclusive and could not see a slowdown of PCT "
                   "percent: a blind check is never a pass.")
@store_option
@plugin_option
def check_cmd(suite_ref: str, baseline_path: str | None, ref: str | None, quick: bool, sets: tuple[str, ...],
              markdown_path: str | None, gate_timing: bool | None, executor: str, processes: int | None,
              target_mde: float, budget: float, max_mde: float | None, store_url: str | None,
              plugins: tuple[str, ...]) -> None:
    """Measure SUITE again and give each case a verdict against a baseline: deterministic metrics must be
    equal; a timing is unchanged only when its whole 95 % interval lies within 5 %, regressed or improved when
    shown beyond it, else inconclusive with the smallest slowdown it could see (MDE). Inconclusive cases are
    measured in more processes until their MDE is --target-mde or --budget is spent.
    Exit status: 0 passed; 1 a case regressed, changed, failed or is missing; 2 bad input; 3 (--max-mde) a
    timing could not see a slowdown of that size."""
    if (baseline_path is None) == (ref is None):
        raise click.UsageError("give exactly one of --baseline FILE.json and --against GIT_REF")
    if not target_mde > 100 * FLOOR:
        raise BenchInputError(f"--target-mde must be above the {100 * FLOOR:.0f} % floor (no check sees a change "
                              f"it does not count), got {target_mde:g}", where="--target-mde")
    if budget < 0:
        raise BenchInputError(f"--budget must be 0 or more seconds, got {budget:g}", where="--budget")
    if max_mde is not None and not max_mde > 0:
        raise BenchInputError(f"--max-mde must be a positive percentage, got {max_mde:g}", where="--max-mde")
    started = time.monotonic()
    grow = dict(target=target_mde / 100, budget_s=budget, started=started,
                say=lambda m: err.print(m, highlight=False))
    plugin_files = load_plugins(plugins)
    suite = load_suite(suite_ref, quick=quick, sets=parse_set(sets), checks=WORKLOAD_CHECKS)
    cases = list(suite.cases)
    processes = check_processes(processes, executor if ref is None else "process", GATE_PROCESSES)
    show_logs()
    store = Store(store_url)
    opts = run_options(quick, debug=debugging(), plugins=plugin_files, processes=processes)
    if ref is None:
        baseline = load_baseline(baseline_path)
        if baseline.suite != suite.name:
            raise BenchInputError(f"{baseline_path} is a baseline of suite {baseline.suite!r}, not {suite.name!r}",
                                  where="--baseline")
        if bool(baseline.quick) != quick:
            raise BenchInputError(f"{baseline_path} was measured {'with' if baseline.quick else 'without'} --quick: "
                                  f"check {'with' if baseline.quick else 'without'} it", where="--baseline")
        err.print(_spending(len(cases), processes))
        run, records = _measure(store, suite, cases, opts, executor, quick, "bench check")
        report = check_run(baseline, run, records, gate_timing=gate_timing)
        cand = {r.case_key: r for r in records}

        def more(keys: list[str]) -> CheckReport:      # the candidate's cases in one more batch of processes
            nonlocal report
            _, extra = _measure(store, suite, [c for c in cases if c.key in keys], opts, executor, quick,
                                "bench check (more processes)")
            for rec in extra:
                cand[rec.case_key] = add_processes(cand[rec.case_key], rec)
                new = cand[rec.case_key]
                if new.ok and new.samples_s:
                    report = report.replace_timing(rec.case_key, new.samples_s, new.rounds, busy=busy_note(new),
                                                   cand_processes=n_processes(new))
            return report
        report, reach = measure_until(report, more, per_case_s=(time.monotonic() - started) / max(1, len(cases)),
                                      **grow)
    else:
        report, reach = _check_against(store, suite, cases, opts, quick, ref, gate_timing, grow, started)
    _render(report, reach, markdown_path)
    blind = report.blind(max_mde / 100) if max_mde is not None else []
    if blind and not report.failed:
        worst = max(blind, key=lambda r: r.timing.mde)
        err.print(f"bench check: {len(blind)} timing(s) could not see a {max_mde:g} % slowdown (--max-mde), worst "
                  f"{worst.name} at MDE {100 * worst.timing.mde:.0f} %: exit {EXIT_BLIND}", highlight=False,
                  soft_wrap=True)
    sys.exit(1 if report.failed else EXIT_BLIND if blind else 0)


def _open_sides(store: Store, suite: Suite, cases: list[Case], quick: bool, ref: str, by: str,
                processes: int) -> list[Run]:
    """Two stored runs, REF's (baseline) and this checkout's (candidate), for ``cases`` measured side by side."""
    sides: list[Run] = []
    for side, label in ((0, f"{suite.name}@{ref}"), (1, suite.name)):
        env = fingerprint(threads=max(c.workload.threads or 0 for c in cases) or None)
        if side == 0:
            env["soft"] = {**env["soft"], "commit": ref, "dirty": False}
        sides.append(Run.open(store, label, cases, quick=quick, env=env, options={"by": by, "ref": ref},
                              suite_path=suite.path, suite_text=suite.text, spec=suite.spec,
                              invocation=invocation(side="baseline" if side == 0 else "candidate",
                                                    processes=processes)))
    return sides


def _interleaved(store: Store, suite: Suite, cases: list[Case], opts: RunOptions, quick: bool, ref: str, tree: Path,
                 by: str, seed: int = 0) -> tuple[dict[int, RunRecord], list[tuple[CaseRecord, CaseRecord]]]:
    """REF's code and this checkout's, per case in alternating workers (``opts.processes`` a version, at least two);
    both versions' records stored as each pair ends, in two runs."""
    sides = _open_sides(store, suite, cases, quick, ref, by, max(2, opts.processes))

    def on_pair(b: CaseRecord, c: CaseRecord) -> None:
        sides[0].add(b)
        sides[1].add(c)
        err.print(f"  {c.line} {c.arch}: {b.status}/{c.status}", highlight=False)
    with sides[0], sides[1]:
        pairs = interleave_versions(cases, opts, tree, seed=seed, processes=max(2, opts.processes), on_pair=on_pair)
    return {0: sides[0].record(), 1: sides[1].record()}, pairs


def _check_against(store: Store, suite: Suite, cases: list[Case], opts: RunOptions, quick: bool, ref: str,
                   gate_timing: bool | None, grow: dict, started: float) -> tuple[CheckReport, tuple[Reach, ...]]:
    """REF's code and this checkout's, per case in alternating workers; both runs stored; timings paired; the
    cases that cannot yet see ``--target-mde`` measured in more pairs of processes (:func:`measure_until`)."""
    with worktree(ref) as tree:
        err.print(_spending(len(cases), max(2, opts.processes)).replace("processes each", "processes per version"))
        err.print(f"measuring {len(cases)} cases with {ref} (baseline) and this checkout (candidate), "
                  "alternating round by round")
        runs, pairs = _interleaved(store, suite, cases, opts, quick, ref, tree, "bench check --against")
        base_records, cand_records = [p[0] for p in pairs], [p[1] for p in pairs]
        for b, label in zip(base_records, case_labels(base_records)):
            if b.status in FAILED:
                err.print(f"[yellow]warning:[/] {ref} failed {label}: {b.message.splitlines()[0][:160]} "
                          "(nothing to compare this case with)", highlight=False, soft_wrap=True)
        doc = baseline_document(runs[0], base_records)
        doc["suite"] = suite.name                    # stored as SUITE@REF, a baseline of SUITE
        baseline = parse_baseline(doc, f"{ref} (measured now)")
        report = check_run(baseline, runs[1], cand_records, gate_timing=gate_timing, paired=True)
        held = {c.case_key: (b, c) for b, c in pairs}
        batch = 0

        def more(keys: list[str]) -> CheckReport:   # both versions of these cases in one more batch of process pairs
            nonlocal report, batch
            batch += 1
            _, extra = _interleaved(store, suite, [c for c in cases if c.key in keys], opts, quick, ref, tree,
                                    "bench check --against (more processes)", seed=batch)
            for b, c in extra:
                ob, oc = held[c.case_key]
                held[c.case_key] = nb, nc = add_processes(ob, b), add_processes(oc, c)
                report = rejudge_paired(report, [(nb, nc)])
            return report
        return measure_until(report, more, per_case_s=(time.monotonic() - started) / max(1, len(cases)), **grow)


def rejudge_paired(report: CheckReport, pairs: list[tuple[CaseRecord, CaseRecord]]) -> CheckReport:
    """Each case's timing re-judged on both versions measured again, in the same rounds (paired): the A/B check's
    extra pairs and a bisection's second look at an inconclusive probe."""
    for base, cand in pairs:
        if base.ok and cand.ok and base.rounds and len(base.rounds) == len(cand.rounds) >= 2:
            report = report.replace_timing(cand.case_key, cand.samples_s, cand.rounds,
                                           paired_base=(base.samples_s, base.rounds),
                                           busy=busy_note(cand) or busy_note(base),
                                           cand_processes=n_processes(cand), base_processes=n_processes(base))
    return report


def _render(report: CheckReport, reach: tuple[Reach, ...], markdown_path: str | None) -> None:
    for w in report.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    out.print(check_table(report))
    out.print(headline(report), highlight=False)
    out.print(power_line(report), highlight=False, soft_wrap=True)
    for line in reach_lines(reach):
        out.print(line, highlight=False, soft_wrap=True)
    if markdown_path:
        _write(markdown_path, markdown(report, reach), "--markdown")
        err.print(f"wrote {markdown_path}")


COMMANDS = (baseline_cmd, check_cmd)
