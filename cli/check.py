"""``bench baseline`` and ``bench check``: a CI regression gate against a committed baseline file, or against
another commit of the code measured in the same job (``--against REF``)."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from cli.common import (check_processes, debugging, err, invocation, load_plugins, out, plugin_option,
                        processes_option, show_logs, store_option)
from harness.engine.ab import interleave_versions, worktree
from harness.engine.env import fingerprint
from harness.contract.errors import BenchInputError
from harness.executors import EXECUTORS, make_executor
from harness.contract.records import FAILED, CaseRecord, RunRecord
from harness.engine.replicate import GATE_PROCESSES
from harness.engine.run import Run, run_options
from harness.engine.runner import RunOptions
from harness.contract.spec import Case
from harness.store.db import Store
from harness.contract.suite import Suite, load_suite, parse_set
from reports.check.baseline import (append_occasions, baseline_document, load_baseline, parse_baseline,
                                    process_medians_ms, write_document)
from reports.check.render import check_table, headline, markdown, power_line
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
    suite = load_suite(suite_ref, quick=quick, sets=parse_set(sets))
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


def _remeasure(cases: list[Case], opts: RunOptions, executor: str) -> dict[str, CaseRecord]:
    """The inconclusive cases measured once more, side by side in one worker, with twice the sampling time."""
    longer = dataclasses.replace(opts, interleave=True, timing=dataclasses.replace(
        opts.timing, min_time_s=2 * opts.timing.min_time_s, max_time_s=2 * opts.timing.max_time_s))
    ex = make_executor(executor)
    try:
        return {r.case_key: r for r in ex.run(cases, longer)}
    finally:
        ex.close()


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
@store_option
@plugin_option
def check_cmd(suite_ref: str, baseline_path: str | None, ref: str | None, quick: bool, sets: tuple[str, ...],
              markdown_path: str | None, gate_timing: bool | None, executor: str, processes: int | None,
              store_url: str | None, plugins: tuple[str, ...]) -> None:
    """Measure SUITE again and give each case a verdict against a baseline: deterministic metrics must be
    equal, timings regressed / improved / unchanged / inconclusive (inconclusive ones are measured once more).
    Exits 1 when a case regressed, changed or failed; 0 otherwise; 2 on bad input."""
    if (baseline_path is None) == (ref is None):
        raise click.UsageError("give exactly one of --baseline FILE.json and --against GIT_REF")
    plugin_files = load_plugins(plugins)
    suite = load_suite(suite_ref, quick=quick, sets=parse_set(sets))
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
        todo = [c for c in cases if c.key in set(report.inconclusive_keys())]
        if todo:
            err.print(f"{len(todo)} inconclusive case(s): measuring them once more, side by side")
            report = check_run(baseline, run, records, gate_timing=gate_timing,
                               remeasured=_remeasure(todo, opts, executor))
    else:
        report = _check_against(store, suite, cases, opts, quick, ref, gate_timing)
    _render(report, markdown_path)
    sys.exit(1 if report.failed else 0)


def _check_against(store: Store, suite: Suite, cases: list[Case], opts: RunOptions, quick: bool, ref: str,
                   gate_timing: bool | None) -> CheckReport:
    """REF's code and this checkout's, per case in alternating workers; both runs stored; timings paired."""
    with worktree(ref) as tree:
        err.print(_spending(len(cases), max(2, opts.processes)).replace("processes each", "processes per version"))
        err.print(f"measuring {len(cases)} cases with {ref} (baseline) and this checkout (candidate), "
                  "alternating round by round")
        sides: list[Run] = []
        for side, label in ((0, f"{suite.name}@{ref}"), (1, suite.name)):
            env = fingerprint(threads=max(c.workload.threads or 0 for c in cases) or None)
            if side == 0:
                env["soft"] = {**env["soft"], "commit": ref, "dirty": False}
            sides.append(Run.open(store, label, cases, quick=quick, env=env,
                                  options={"by": "bench check --against", "ref": ref}, suite_path=suite.path,
                                  suite_text=suite.text, spec=suite.spec,
                                  invocation=invocation(side="baseline" if side == 0 else "candidate",
                                                        processes=max(2, opts.processes))))

        def on_pair(b: CaseRecord, c: CaseRecord) -> None:      # both versions' records stored as each pair ends
            sides[0].add(b)
            sides[1].add(c)
            err.print(f"  {c.line} {c.arch}: {b.status}/{c.status}", highlight=False)
        with sides[0], sides[1]:
            pairs = interleave_versions(cases, opts, tree, processes=max(2, opts.processes), on_pair=on_pair)
        runs = {0: sides[0].record(), 1: sides[1].record()}
        base_records, cand_records = [p[0] for p in pairs], [p[1] for p in pairs]
        for b, label in zip(base_records, case_labels(base_records)):
            if b.status in FAILED:
                err.print(f"[yellow]warning:[/] {ref} failed {label}: {b.message.splitlines()[0][:160]} "
                          "(nothing to compare this case with)", highlight=False, soft_wrap=True)
        doc = baseline_document(runs[0], base_records)
        doc["suite"] = suite.name                    # stored as SUITE@REF, a baseline of SUITE
        baseline = parse_baseline(doc, f"{ref} (measured now)")
        report = check_run(baseline, runs[1], cand_records, gate_timing=gate_timing, paired=True)
        todo = [case for case in cases if case.key in set(report.inconclusive_keys())]
        if todo:
            err.print(f"{len(todo)} inconclusive case(s): measuring both versions of them once more")
            report = _pair(report, interleave_versions(todo, opts, tree, seed=1, processes=max(2, opts.processes)))
    return report


def _pair(report: CheckReport, pairs: list[tuple[CaseRecord, CaseRecord]]) -> CheckReport:
    """Each case's timing re-judged on both versions measured again, in the same rounds (paired)."""
    for base, cand in pairs:
        if base.ok and cand.ok and base.rounds and len(base.rounds) == len(cand.rounds) >= 2:
            report = report.replace_timing(cand.case_key, cand.samples_s, cand.rounds,
                                           paired_base=(base.samples_s, base.rounds),
                                           busy=busy_note(cand) or busy_note(base),
                                           cand_processes=n_processes(cand), base_processes=n_processes(base))
    return report


def _render(report: CheckReport, markdown_path: str | None) -> None:
    for w in report.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    out.print(check_table(report))
    out.print(headline(report), highlight=False)
    out.print(power_line(report), highlight=False, soft_wrap=True)
    if markdown_path:
        _write(markdown_path, markdown(report), "--markdown")
        err.print(f"wrote {markdown_path}")


COMMANDS = (baseline_cmd, check_cmd)
