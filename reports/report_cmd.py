"""``bench report RUN... [-o FILE.html] [--store URL]``: one self-contained HTML file from stored runs."""
from __future__ import annotations

from pathlib import Path

import click

from harness.errors import BenchInputError
from harness.store import Store

DEFAULT_OUTPUT = "report.html"
"""Written in the current directory unless ``-o`` says otherwise."""


@click.command("report")
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True)
@click.option("-o", "--output", default=DEFAULT_OUTPUT, show_default=True, metavar="FILE.html",
              help="HTML file to write.")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="SQLAlchemy URL of the results store (default: sqlite:///results/bench.sqlite).")
def report(run_refs: tuple[str, ...], output: str, store_url: str | None) -> None:
    """One self-contained HTML report of one or more runs (RUN: an id, an id prefix, or `latest`).

    Several runs (the same suite on two machines or commits) are also shown side by side,
    aligned on their case keys, with each median's ratio to the first run.
    """
    from reports.html import render_report  # matplotlib/jinja2 load only when a report is made

    store = Store(store_url, create=False)
    runs, seen = [], set()
    for ref in run_refs:
        run = store.get_run(ref)
        if run["id"] in seen:
            continue
        seen.add(run["id"])
        runs.append((run, store.records(run["id"])))
    html = render_report(runs)
    path = Path(output)
    if path.is_dir():
        raise BenchInputError(f"{output} is a directory", where="--output")
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {output}: {exc.strerror}", where="--output") from None
    n_cases = sum(len(rows) for _, rows in runs)
    click.echo(f"wrote {path} ({len(runs)} run{'s' if len(runs) != 1 else ''}, {n_cases} cases)", err=True)
