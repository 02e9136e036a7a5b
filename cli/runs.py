"""``bench list | run | runs | show | export | compare``: run suites into the store and read runs back."""
from __future__ import annotations

import dataclasses
import fnmatch
import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import (check_max_processes, check_processes, debugging, err, invocation, load_plugins,
                        max_processes_option, out, plugin_option, processes_option, show_logs, store_option)
from harness.contract import registry
from harness.instruments.energy import Absent, find_meter
from harness.contract.errors import BenchInputError
from harness.contract.secrets import hide_passwords
from harness.executors import EXECUTORS
from harness.executors.devices import check_devices, device_type, parse_devices
from harness.executors.process import prestart as prestart_worker
from harness.executors.ray_executor import RAY_MISSING, ray_available
from harness.engine.overhead import RunOverhead, summary_line
from harness.contract.records import CaseRecord, RunRecord
from harness.session import Run, run_options
from harness.store.db import Store
from harness.engine.checks import WORKLOAD_CHECKS
from harness.contract.suite import case_from_record, list_suites, load_suite, parse_set
from harness.analysis.comparison import FLOOR
from reports.compare import compare_runs, env_differences, interleaved_rows, pair_records
from reports.findings import run_findings
from reports.labels import case_labels, case_params
from reports.sentences import headline_lines
from reports.side_by_side import same_lines, side_by_side
from reports.terminal import (cases_table, compare_table, findings_table, interleaved_table, runs_table,
                              side_by_side_view)

SUMMARY_POINTS = 2
"""``bench run``'s summary shows the side-by-side tables at this many sweep points at most (the smallest and the
largest); ``bench show`` and the report show every one."""


@click.command("list")
@click.argument("what", type=click.Choice(["archs", "suites"]), default="archs")
@click.argument("pattern", default="*")
@plugin_option
def list_cmd(what: str, pattern: str, plugins: tuple[str, ...]) -> None:
    """List registered architectures (wildcards allowed) or built-in suites."""
    load_plugins(plugins)
    if what == "archs":
        for name in registry.list_archs(pattern):
            spec = registry.get(name)
            out.print(f"{name:<28} [dim]{spec.family:<12} {spec.description}[/]")
        for name, description in registry.namespace_presets(pattern).items():
            out.print(f"{name:<28} [dim]{name.partition(':')[0]:<12} {description}[/]")
        for ns in registry.namespaces():
            example = next(iter(registry.namespace_presets(f"{ns}:*")), f"{ns}:resnet50")
            out.print(f"{ns + ':NAME':<28} [dim]namespace (e.g. {example})[/]")
    else:
        for path in list_suites():
            if fnmatch.fnmatch(path.stem, pattern):
                out.print(f"{path.stem:<24} [dim]{path}[/]")


@click.command("run")
@click.argument("suite_ref", metavar="SUITE")
@click.option("--quick", is_flag=True, help="Use the suite's [quick] sizes and shorter timing.")
@click.option("--device", default=None, help="cpu, cuda or cuda:N (overrides the suite).")
@store_option
@click.option("--resume", is_flag=True, help="Complete the newest run of this suite instead of starting anew.")
@click.option("--dry-run", is_flag=True, help="Validate and list the cases; measure and write nothing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Pin a suite key (repeatable).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, help="Per-case timeout in seconds.")
@click.option("--executor", type=click.Choice(sorted([*EXECUTORS, "ray"])), default=None,
              help="Where cases run: an isolated worker process (default), inline (no isolation, no timeout), or "
                   "Ray tasks (the `ray` extra; a local cluster unless --address).")
@click.option("--address", default=None, metavar="ADDR",
              help="With --executor ray: the Ray cluster to connect to (default: start a local one).")
@click.option("--devices", default=None, metavar="DEV,DEV,...",
              help="One worker per device of this machine (cuda:0,cuda:1 or cpu,cpu), cases spread over them, each "
                   "pinned to its worker's device; the cases' device is the list's type unless --device says.")
@click.option("--interleave", is_flag=True,
              help="Time the lines at each sweep point side by side in rounds (one line: the whole sweep), so their "
                   "ratios cancel the machine's drift.")
@click.option("--flush-l2", is_flag=True,
              help="CUDA only: zero a buffer larger than L2 before each timed call and time one call per sample "
                   "(triton do_bench's cold-cache number; default: warm L2, as torch.utils.benchmark).")
@click.option("--no-calibrate", is_flag=True,
              help="Skip measuring this machine's peak (matmul FLOP/s, copy GB/s) before the cases.")
@click.option("-o", "--output", "--report", "report_path", default=None, metavar="FILE.html",
              help="Where to write the run's HTML report (default: report-RUN.html beside the store's file, "
                   "results/ by default).")
@click.option("--no-report", is_flag=True, help="Do not write the HTML report.")
@click.option("--energy", is_flag=True,
              help="Measure energy per call (J, average W) in a pass after timing, where the device has a readable "
                   "counter (NVML on NVIDIA GPUs, RAPL on CPUs); elsewhere each case says why not.")
@click.option("--require-energy", is_flag=True,
              help="As --energy, and exit 2 before anything runs when a device of the run has no energy counter.")
@processes_option(1, "1 by default, so a run stays short: its intervals then cover one process only")
@max_processes_option("default N: no more")
@plugin_option
def run_cmd(suite_ref: str, quick: bool, device: str | None, store_url: str | None, resume: bool,
            dry_run: bool, sets: tuple[str, ...], timeout: float | None, executor: str | None, address: str | None,
            devices: str | None, interleave: bool, flush_l2: bool, no_calibrate: bool, report_path: str | None,
            no_report: bool, energy: bool, require_energy: bool, processes: int | None, max_processes: int | None,
            plugins: tuple[str, ...]) -> None:
    """Run SUITE (a path or a built-in suite name), storing every case as it finishes; then print what the
    run shows (fitted exponents and ratios) and write its HTML report. `bench show RUN` has every case."""
    device_list = parse_devices(devices) if devices else ()
    executor_name = pick_executor(executor, address, device_list)
    processes = check_processes(processes, executor_name)
    max_processes = check_max_processes(max_processes, processes, processes)
    plugin_files = load_plugins(plugins)
    pinned = parse_set(sets)
    if device:
        pinned["device"] = device
    elif len({device_type(d) for d in device_list}) == 1:    # --devices cuda:0,cuda:1 alone: the cases on cuda
        pinned["device"] = device_type(device_list[0])
    suite = load_suite(suite_ref, quick=quick, sets=pinned, checks=WORKLOAD_CHECKS)
    cases = list(suite.cases)
    if device_list:
        check_devices(cases, device_list)
    if flush_l2:
        check_flush_l2(cases)
    if require_energy:
        check_energy(cases, device_list)
    planned = [c.record("skipped") for c in cases]
    labels = dict(zip((c.key for c in cases), case_labels(planned, arch=True)))
    if dry_run:                  # the label, then the case's whole identity (case_params) and its overrides
        for c, params in zip(cases, case_params(planned)):
            ident = " ".join(f"{k}={v}" for k, v in params.items() if k != "arch")
            over = ", ".join(f"{k}={v}" for k, v in c.overrides)
            out.print(f"{c.key}  {labels[c.key]}  ({ident})  {over}", highlight=False, markup=False)
        out.print(f"[bold]{len(cases)} cases[/] in {suite.name} ({suite.path}); nothing measured or written")
        return
    show_logs()
    store = Store(store_url)
    if resume:
        check_resume_timing(store.resumable(suite.name, quick), flush_l2)
    if executor_name == "process" and not no_calibrate:
        prestart_worker()                # the worker imports torch and the zoo while the run calibrates
    extra = {**({"flush_l2": True} if flush_l2 else {}), **({"energy": True} if energy or require_energy else {})}
    run = Run.open_suite(store, suite, cases, resume=resume, quick=quick, calibrate=not no_calibrate,
                         options={"timeout": timeout, **extra},
                         invocation=invocation(executor=executor_name, processes=processes,
                                               max_processes=max_processes))
    opts = run_options(quick, timeout, debug=debugging(), plugins=plugin_files, interleave=interleave,
                       energy=energy or require_energy, processes=processes,
                       max_processes=max_processes)
    if flush_l2:
        opts = dataclasses.replace(opts, timing=dataclasses.replace(opts.timing, flush_l2=True))
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[last]}"))
    try:
        with run, Progress(*columns, console=err, transient=False) as progress:
            task = progress.add_task(run.id, total=len(cases), completed=run.already_stored, last="")

            def on_record(rec: CaseRecord) -> None:
                median = rec.metric("median_ms")
                last = f"{labels.get(rec.case_key, rec.line)} → {rec.status}" + (f" {median:.2f} ms" if median else "")
                progress.update(task, advance=1, last=last)
            failed = run.execute(executor_name, opts, on_record=on_record)
    except KeyboardInterrupt:
        err.print(f"interrupted: finished cases are stored; `bench run ... --resume` completes run {run.id}")
        sys.exit(130)
    records = run.records()
    run = run.record()
    print_summary(run, records, SUMMARY_POINTS)
    if not no_report:
        from reports.html import write_report     # matplotlib and the templates: only when a report is written

        path = Path(report_path or (store.folder or Path("results")) / f"report-{run.id}.html")
        write_report(path, [(run, records)])
        out.print(f"report: {path}   ·   every case: bench show {run.id}", highlight=False, soft_wrap=True)
    sys.exit(1 if failed else 0)


def pick_executor(executor: str | None, address: str | None, devices: tuple[str, ...]) -> str:
    """The executor's name for :func:`harness.executors.make_executor` (``process``, ``inline``, ``ray``,
    ``ray=ADDR``, ``devices=DEV,...``); a combination that makes no sense, or ray not installed, is bad input."""
    if address and executor != "ray":
        raise BenchInputError("only with --executor ray", where="--address")
    if devices:
        if executor not in (None, "process"):
            raise BenchInputError(f"runs one process worker per device; not with --executor {executor}",
                                  where="--devices")
        return "devices=" + ",".join(devices)
    if executor == "ray":
        if not ray_available():
            raise BenchInputError(RAY_MISSING)
        return f"ray={address}" if address else "ray"
    return executor or "process"


def check_flush_l2(cases: list) -> None:
    """``--flush-l2`` is CUDA-only: a case on another device is a one-line input error (exit 2)."""
    off = sorted({c.workload.device for c in cases if not c.workload.device.startswith("cuda")})
    if off:
        raise BenchInputError(f"CUDA only, and this run has cases on {', '.join(off)}: a CPU's last-level cache is "
                              "shared with other processes and cannot be flushed defensibly (harness/instruments/timing.py); "
                              "add --device cuda or drop --flush-l2", where="--flush-l2")


def check_energy(cases: list, device_list: tuple[str, ...]) -> None:
    """``--require-energy``: every device the run uses must have a readable energy counter (else exit 2)."""
    for dev in sorted(set(device_list) | {c.workload.device for c in cases}):
        meter = find_meter(dev)
        if isinstance(meter, Absent):
            raise BenchInputError(f"{meter.reason} (device {dev})", where="--require-energy")


def check_resume_timing(previous: RunRecord | None, flush_l2: bool) -> None:
    """A resumed run keeps its timing: its cases and the new ones must agree on ``--flush-l2``."""
    if previous is not None and bool(previous.options.get("flush_l2")) != flush_l2:
        was = "with" if previous.options.get("flush_l2") else "without"
        raise BenchInputError(f"run {previous.id} was timed {was} --flush-l2; resume it the same way, or start a new "
                              "run", where="--resume")


def print_summary(run: RunRecord, records: list[CaseRecord], points: int | None = None) -> None:
    """What a run shows: its counts, then — where its lines are different models or variants — every line against
    the reference side by side (``points``: at most that many sweep points), then how each line scales and the
    chosen contrasts."""
    findings = run_findings(run, records)
    sbs = side_by_side(run, records)
    first, *rest = headline_lines(findings, sbs)
    out.print(first, highlight=False, soft_wrap=True)
    for item in side_by_side_view(sbs, points, run.id) if sbs else []:
        out.print(item, highlight=False, soft_wrap=True)
    for line in rest:
        out.print(line, highlight=False, soft_wrap=True)


def render_run(run: RunRecord, records: list[CaseRecord]) -> None:
    """A stored run in the terminal: every line against the reference side by side (where the lines are different
    models), every case, then the fitted exponents and ratios."""
    findings = run_findings(run, records)
    sbs = side_by_side(run, records)
    for item in side_by_side_view(sbs, None, run.id) if sbs else []:
        out.print(item, highlight=False, soft_wrap=True)
    out.print(cases_table(records, findings.axis, title=f"run {run.id}", peak=run.peak))
    if findings.lines:
        out.print(findings_table(findings))
    for line in headline_lines(findings, sbs):
        out.print(line, highlight=False, soft_wrap=True)
    if run.options.get("overhead"):
        out.print(summary_line(RunOverhead.from_dict(run.options["overhead"])), highlight=False, soft_wrap=True)
    made = invocation_line(run.invocation)
    if made:
        out.print(made, highlight=False, soft_wrap=True, markup=False)


def invocation_line(made: dict) -> str:
    """``made by: bench run SUITE --quick --processes 3 ... (executor process, ...)``: a stored run's command, its
    arguments and the options it was given (a flag that is off, an option left unset, is not shown), then what the
    command resolved from them; "" for a run stored without them."""
    if not made:
        return ""
    words = [str(v) for v in (made.get("arguments") or {}).values() if v not in (None, "", [])]
    for flag, value in (made.get("options") or {}).items():
        if value in (None, False, [], ""):
            continue
        words += [flag] if value is True else [f"{flag} {v}" for v in (value if isinstance(value, list) else [value])]
    if made.get("debug"):
        words.append("--debug")
    resolved = ", ".join(f"{k} {v}" for k, v in (made.get("resolved") or {}).items())
    return f"made by: {made.get('command', 'bench')} {' '.join(words)}" + (f" ({resolved})" if resolved else "")


@click.command("runs")
@store_option
def runs_cmd(store_url: str | None) -> None:
    """Stored runs, newest first."""
    out.print(runs_table(Store(store_url, create=False).list_runs()))


@click.command("show")
@click.argument("run_ref", metavar="RUN")
@store_option
def show_cmd(run_ref: str, store_url: str | None) -> None:
    """One stored run as a table (RUN: an id, an id prefix, or `latest`)."""
    store = Store(store_url, create=False)
    run = store.get_run(run_ref)
    render_run(run, store.records(run.id))


@click.command("export")
@click.argument("run_ref", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "parquet", "tidy-csv", "pytest-benchmark",
                                                  "github-action-benchmark"]),
              required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="File to write (default: stdout; required for parquet).")
@store_option
def export_cmd(run_ref: str, fmt: str, output: str | None, store_url: str | None) -> None:
    """Export one run: JSON (one object per case), CSV (the same, flattened), Parquet (the CSV's
    table), tidy CSV (one row per case × metric), pytest-benchmark's JSON (for `pytest-benchmark compare`
    and github-action-benchmark's `tool: pytest`) or github-action-benchmark's `customSmallerIsBetter` JSON."""
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet needs -o FILE (Parquet is binary)")
    from reports.export import (to_csv, to_github_action_benchmark, to_json, to_parquet,   # pandas: here only
                                to_pytest_benchmark, to_tidy_csv)

    store = Store(store_url, create=False)
    run = store.get_run(run_ref)
    records = store.records(run.id)
    if fmt == "parquet":
        to_parquet(run, records, output)
        err.print(f"wrote {len(records)} cases to {output}")
        return
    text = {"json": to_json, "csv": to_csv, "tidy-csv": to_tidy_csv,
            "pytest-benchmark": to_pytest_benchmark,
            "github-action-benchmark": to_github_action_benchmark}[fmt](run, records)
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise BenchInputError(f"cannot write {output}: {exc.strerror}", where="--output") from None
        err.print(f"wrote {len(records)} cases to {output}")
    else:
        click.echo(text, nl=False)


@click.command("compare")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--interleave", is_flag=True,
              help="Measure the two runs' cases again now, with this code, side by side in one worker (round by "
                   "round), instead of comparing the stored timings.")
@click.option("--quick", is_flag=True, help="With --interleave: the quick timing.")
@store_option
@plugin_option
def compare_cmd(run_a: str, run_b: str, interleave: bool, quick: bool, store_url: str | None,
                plugins: tuple[str, ...]) -> None:
    """Compare RUN_B against RUN_A case by case: ratio of medians B/A, its 95% interval (over processes where both
    were measured in several), verdict (same only when the whole interval lies within 5%). Where both runs hold the
    same lines and these are different models, each run's lines against its reference come first. With
    --interleave (same code only: two settings or two architectures), each pair of cases is measured again side
    by side and the ratio's interval spans the rounds, so the machine's drift is in it."""
    store = Store(store_url, create=False)
    a, b = store.get_run(run_a), store.get_run(run_b)
    if interleave:
        _compare_interleaved(store, a, b, quick, load_plugins(plugins))
        return
    differing = env_differences(a.env, b.env)
    if differing:
        err.print(f"warning: the runs were measured in different environments (hard keys differ: "
                  f"{', '.join(differing)}); ratios mix machine and code effects", highlight=False, soft_wrap=True)
    records_a, records_b = store.records(a.id), store.records(b.id)
    result = compare_runs(records_a, records_b)
    if same_lines(records_a, records_b):        # the same lines: each run's lines against the reference first
        for run, records in ((a, records_a), (b, records_b)):
            sbs = side_by_side(run, records)
            if sbs:
                out.print(f"run {'A' if run is a else 'B'} {run.id}:", highlight=False)
                for item in side_by_side_view(sbs, SUMMARY_POINTS, run.id):
                    out.print(item, highlight=False, soft_wrap=True)
    out.print(compare_table(result, a.id, b.id))
    geo = f"{result.geomean_ratio:.3f}" if result.geomean_ratio is not None else "-"
    n = result.counts
    extra = [f"{k} {v}" for k, v in (("only in A", result.only_a), ("only in B", result.only_b),
                                     ("not ok in one run", result.not_ok)) if v]
    out.print(f"{len(result.rows)} cases compared: {n['faster']} faster, {n['slower']} slower, {n['same']} same "
              f"within {100 * FLOOR:.0f} %, {n['inconclusive']} inconclusive; "
              f"geometric-mean ratio B/A {geo}" + (f" ({'; '.join(extra)})" if extra else ""))


def _compare_interleaved(store: Store, a: RunRecord, b: RunRecord, quick: bool, plugin_files: tuple[str, ...]) -> None:
    pairs = pair_records(store.records(a.id), store.records(b.id), a, b)
    if not pairs:
        raise BenchInputError(f"runs {a.id} and {b.id} have no ok cases to pair (by case, or by line and sweep "
                              "point)", where="RUN_B")
    metrics_a = tuple(a.spec.metrics) if a.spec else ("latency",)
    metrics_b = tuple(b.spec.metrics) if b.spec else ("latency",)
    cases = []
    for i, (ra, rb) in enumerate(pairs):      # one point per pair: each pair is one group, timed side by side
        cases.append(dataclasses.replace(case_from_record(ra, metrics_a), line=f"A {ra.line}", point=i))
        cases.append(dataclasses.replace(case_from_record(rb, metrics_b), line=f"B {rb.line}", point=i))
    show_logs()
    err.print(f"measuring {len(pairs)} pairs side by side ({len(cases)} cases)")
    opts = run_options(quick, interleave=True, plugins=plugin_files)
    name = f"compare {a.suite} {a.id} vs {b.id}"
    with Run.open(Store(store.url), name, cases, quick=quick, options={"by": "bench compare --interleave", "a": a.id,
                                                             "b": b.id, "interleave": True},
                  invocation=invocation(executor="process")) as run:
        run.execute("process", opts)
    recs = run.records()
    rows = interleaved_rows(pairs, recs)
    out.print(interleaved_table(rows, a.id, b.id))
    n = {v: sum(r["verdict"] == v for r in rows) for v in ("faster", "slower", "same", "inconclusive", "failed")}
    out.print(f"{len(rows)} pairs measured side by side: {n['faster']} faster, {n['slower']} slower, {n['same']} same "
              f"within {100 * FLOOR:.0f} %, {n['inconclusive']} inconclusive"
              + (f", {n['failed']} failed" if n["failed"] else ""))


@click.command("merge")
@click.argument("sources", nargs=-1, required=True, metavar="FILE.sqlite...")
@store_option
def merge_cmd(sources: tuple[str, ...], store_url: str | None) -> None:
    """Add the runs and cases of other stores (e.g. the local file a run kept while its store was down) to this
    store: runs matched by id and cases by key, so merging twice adds nothing."""
    target = Store(store_url)
    for src in sources:
        url = src if "://" in src else f"sqlite:///{src}"
        runs_added, cases_added = target.merge_from(Store(url, create=False))
        out.print(f"{hide_passwords(src)}: {runs_added} runs and {cases_added} cases added to {target.shown}",
                  highlight=False)


COMMANDS = (list_cmd, run_cmd, runs_cmd, show_cmd, export_cmd, compare_cmd, merge_cmd)
