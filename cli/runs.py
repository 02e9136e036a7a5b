"""The ``bench`` command line (click + rich): parses, calls the library, renders. No measuring here."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from harness import registry, session

from harness.errors import BenchInputError
from harness.executors import EXECUTORS
from harness.plugins import load_files as load_plugin_files
from harness.store import Store
from harness.suite import list_suites, load_suite, parse_set

# Pipes and CI logs get a wide, fixed width so tables never fold; a terminal uses its own width.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


class BenchGroup(click.Group):
    """Every error is one line on stderr: exit 2 for bad input, 1 for anything unexpected."""

    def main(self, args: list[str] | None = None, **kw: Any) -> Any:  # type: ignore[override]
        debug = "--debug" in (args if args is not None else sys.argv[1:])
        try:
            return super().main(args=args, standalone_mode=False, **kw)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            err.print("bench: aborted")
            sys.exit(130)
        except click.UsageError as exc:
            where = f" ({exc.ctx.command_path})" if exc.ctx else ""
            click.echo(f"bench: error{where}: {exc.format_message()}", err=True)
            sys.exit(2)
        except BenchInputError as exc:
            click.echo(f"bench: error: {exc}", err=True)
            sys.exit(2)
        except Exception as exc:  # noqa: BLE001
            if debug:
                raise
            click.echo(f"bench: internal error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
            sys.exit(1)


store_option = click.option("--store", "store_url", default=None, metavar="URL",
                             help="SQLAlchemy URL of the results store (default: sqlite:///results/bench.sqlite).")
debug_option = click.option("--debug", is_flag=True, help="Show tracebacks.")
plugin_option = click.option("--plugin", "plugins", multiple=True, metavar="FILE.py",
                              help="A Python file that registers architectures (repeatable).")


def _load_plugins(plugins: tuple[str, ...]) -> tuple[str, ...]:
    """Import the --plugin files here; returns their absolute paths for the worker processes."""
    load_plugin_files(plugins)
    return tuple(str(Path(p).resolve()) for p in plugins)


@click.group(cls=BenchGroup)
@click.version_option(package_name="bench")
def main() -> None:
    """Benchmark and compare Transformers and their rivals; test the textbook trade-offs."""


@main.command("list")
@click.argument("what", type=click.Choice(["archs", "suites"]), default="archs")
@click.argument("pattern", default="*")
@plugin_option
def list_cmd(what: str, pattern: str, plugins: tuple[str, ...]) -> None:
    """List registered architectures (wildcards allowed) or built-in suites."""
    _load_plugins(plugins)
    if what == "archs":
        for name in registry.list_archs(pattern):
            spec = registry.get(name)
            out.print(f"{name:<28} [dim]{spec.family:<12} {spec.description}[/]")
        for ns in registry.namespaces():
            out.print(f"{ns + ':NAME':<28} [dim]namespace (e.g. {ns}:resnet50)[/]")
    else:
        import fnmatch
        for path in list_suites():
            if fnmatch.fnmatch(path.stem, pattern):
                out.print(f"{path.stem:<24} [dim]{path}[/]")


@main.command("run")
@click.argument("suite_ref", metavar="SUITE")
@click.option("--quick", is_flag=True, help="Use the suite's [quick] sizes and shorter timing.")
@click.option("--device", default=None, help="cpu, cuda or cuda:N (overrides the suite).")
@store_option
@click.option("--resume", is_flag=True, help="Complete the newest run of this suite instead of starting anew.")
@click.option("--dry-run", is_flag=True, help="Validate and list the cases; measure and write nothing.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Pin a suite key (repeatable).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None, help="Per-case timeout in seconds.")
@click.option("--executor", type=click.Choice(sorted(EXECUTORS)), default="process", show_default=True,
              help="Where cases run: an isolated worker process, or inline (no isolation, no timeout).")
@click.option("--no-calibrate", is_flag=True,
              help="Skip measuring this machine's peak (matmul FLOP/s, copy GB/s) before the cases.")
@plugin_option
@debug_option
def run_cmd(suite_ref: str, quick: bool, device: str | None, store_url: str | None, resume: bool,
            dry_run: bool, sets: tuple[str, ...], timeout: float | None, executor: str, no_calibrate: bool,
            plugins: tuple[str, ...], debug: bool) -> None:
    """Run SUITE (a path or a built-in suite name) and store every case as it finishes."""
    plugin_files = _load_plugins(plugins)
    pinned = parse_set(sets)
    if device:
        pinned["device"] = device
    suite = load_suite(suite_ref, quick=quick, sets=pinned)
    cases = list(suite.cases)
    if dry_run:
        for c in cases:
            over = ", ".join(f"{k}={v}" for k, v in c.overrides)
            out.print(f"{c.key}  {c.label()}  {over}")
        out.print(f"[bold]{len(cases)} cases[/] in {suite.name} ({suite.path}); nothing measured or written")
        return
    store = Store(store_url)
    run_id, todo = session.open_run(store, suite, cases, resume=resume, quick=quick, timeout=timeout,
                                    calibrate=not no_calibrate, console=err)
    opts = session.run_options(quick, timeout, debug=debug, plugins=plugin_files)
    failed = session.execute(store, run_id, todo, opts, executor, len(cases), console=err)
    _render_run(store, run_id, suite.plot.get("x"))
    sys.exit(1 if failed else 0)


def _render_run(store: Store, run_id: str, axis: str | None) -> None:
    from reports.export import run_peak
    from reports.frames import exponents, sweep_axis
    from reports.terminal import cases_table, exponents_table
    rows = store.records(run_id)
    axis = sweep_axis(rows, axis)
    peak = run_peak(store.get_run(run_id))
    out.print(cases_table(rows, axis, title=f"run {run_id}", peak=peak))
    if axis and any(r["status"] == "ok" for r in rows):
        out.print(exponents_table(exponents(rows, axis), axis))


@main.command("runs")
@store_option
def runs_cmd(store_url: str | None) -> None:
    """Stored runs, newest first."""
    from reports.terminal import runs_table
    out.print(runs_table(Store(store_url, create=False).list_runs()))


@main.command("show")
@click.argument("run_ref", metavar="RUN")
@store_option
def show_cmd(run_ref: str, store_url: str | None) -> None:
    """One stored run as a table (RUN: an id, an id prefix, or `latest`)."""
    store = Store(store_url, create=False)
    run = store.get_run(run_ref)
    _render_run(store, run["id"], None)


@main.command("export")
@click.argument("run_ref", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "parquet", "tidy-csv"]), required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="File to write (default: stdout; required for parquet).")
@store_option
def export_cmd(run_ref: str, fmt: str, output: str | None, store_url: str | None) -> None:
    """Export one run: JSON (one object per case), CSV (the same, flattened), Parquet (the CSV's
    table) or tidy CSV (one row per case × metric)."""
    from reports.export import to_csv, to_json, to_parquet, to_tidy_csv
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet needs -o FILE (Parquet is binary)")
    store = Store(store_url, create=False)
    run = store.get_run(run_ref)
    rows = store.records(run["id"])
    if fmt == "parquet":
        to_parquet(run, rows, output)
        err.print(f"wrote {len(rows)} cases to {output}")
        return
    text = {"json": to_json, "csv": to_csv, "tidy-csv": to_tidy_csv}[fmt](run, rows)
    if output:
        Path(output).write_text(text)
        err.print(f"wrote {len(rows)} cases to {output}")
    else:
        click.echo(text, nl=False)


@main.command("compare")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@store_option
def compare_cmd(run_a: str, run_b: str, store_url: str | None) -> None:
    """Compare RUN_B against RUN_A case by case: ratio of medians B/A, 95% bootstrap CI, verdict."""
    from reports.compare import compare_runs, env_differences
    from rich.table import Table
    store = Store(store_url, create=False)
    a, b = store.get_run(run_a), store.get_run(run_b)
    differing = env_differences(a["env"], b["env"])
    if differing:
        err.print(f"warning: the runs were measured in different environments (hard keys differ: "
                  f"{', '.join(differing)}); ratios mix machine and code effects", highlight=False, soft_wrap=True)
    result = compare_runs(store.records(a["id"]), store.records(b["id"]))
    table = Table(title=f"B {b['id']} vs A {a['id']} (ratio = B/A median, 95% bootstrap CI)", header_style="bold")
    for col in ("line", "arch", result.axis or "case", "A ms", "B ms", "ratio [95% CI]", "verdict"):
        table.add_column(col, justify="right" if col in ("A ms", "B ms", "ratio [95% CI]") else "left")
    style = {"faster": "green", "slower": "red", "same": "dim"}
    for r in result.rows:
        table.add_row(r["line"], r["arch"], str(r["axis_value"]) if result.axis else r["case_key"][:8],
                      f"{r['a_median_ms']:,.3f}", f"{r['b_median_ms']:,.3f}",
                      f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                      f"[{style[r['verdict']]}]{r['verdict']}[/]")
    out.print(table)
    geo = f"{result.geomean_ratio:.3f}" if result.geomean_ratio is not None else "-"
    n = result.counts
    extra = [f"{k} {v}" for k, v in (("only in A", result.only_a), ("only in B", result.only_b),
                                     ("not ok in one run", result.not_ok)) if v]
    out.print(f"{len(result.rows)} cases compared: {n['faster']} faster, {n['slower']} slower, {n['same']} same; "
              f"geometric-mean ratio B/A {geo}" + (f" ({'; '.join(extra)})" if extra else ""))


from cli.report import report  # noqa: E402  (the command lives with the report code)

main.add_command(report)

from cli.claims import claims  # noqa: E402

main.add_command(claims)

if __name__ == "__main__":  # pragma: no cover
    main()
