"""``bench report RUN... [-o FILE.html] [--store URL] [--claims CLAIMS.json]``: one self-contained HTML file
from stored runs (and the claims' verdicts)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cli.history import report_history
from harness.contract.errors import BenchInputError
from harness.store.db import Store
from reports.claims_view import check_document
from reports.html import write_report

DEFAULT_OUTPUT = "report.html"
"""Written in the current directory unless ``-o`` says otherwise."""


@click.command("report")
@click.argument("run_refs", metavar="RUN...", nargs=-1)
@click.option("-o", "--output", default=DEFAULT_OUTPUT, show_default=True, metavar="FILE.html",
              help="HTML file to write.")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="SQLAlchemy URL of the results store (default: sqlite:///results/bench.sqlite).")
@click.option("--claims", "claims_path", default=None, metavar="CLAIMS.json",
              help="Add the claims section: the .json that `bench claims` wrote (e.g. results/claims.json).")
def report(run_refs: tuple[str, ...], output: str, store_url: str | None, claims_path: str | None) -> None:
    """One self-contained HTML report of one or more runs (RUN: an id, an id prefix, or `latest`).

    It opens on what each run shows (fitted exponents, contrasts, the lead figure). Several runs of
    one suite (on two machines or commits) are also set side by side on the cases they share, with
    each median's ratio to the first run. ``--claims`` adds the verdict of every claim with its
    evidence and chart (runs are then optional).
    """
    if not run_refs and not claims_path:
        raise BenchInputError("name at least one RUN (an id, an id prefix, or `latest`) or --claims FILE.json",
                              where="bench report")
    path = Path(output)
    if path.is_dir():
        raise BenchInputError(f"{output} is a directory", where="--output")
    claims_doc = read_claims(claims_path) if claims_path else None
    store = Store(store_url, create=False) if run_refs else None
    runs, seen = [], set()
    for ref in run_refs:
        run = store.get_run(ref)
        if run.id in seen:
            continue
        seen.add(run.id)
        runs.append((run, store.records(run.id)))
    try:
        write_report(path, runs, claims=claims_doc, history=report_history(store, runs) if store else None)
    except BenchInputError as exc:
        raise BenchInputError(str(exc), where="--output") from None
    n_cases = sum(len(records) for _, records in runs)
    claims_part = f", {len(claims_doc['claims'])} claims" if claims_doc else ""
    click.echo(f"wrote {path} ({len(runs)} run{'s' if len(runs) != 1 else ''}, {n_cases} cases{claims_part})",
               err=True)


def read_claims(path: str) -> dict[str, Any]:
    """The JSON record ``bench claims`` wrote; a clear error for anything else."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BenchInputError(f"cannot read {path}: {exc.strerror}", where="--claims") from None
    except ValueError as exc:
        raise BenchInputError(f"{path} is not JSON ({exc})", where="--claims") from None
    try:
        check_document(doc)
    except ValueError as exc:
        raise BenchInputError(f"{path} {exc}", where="--claims") from None
    return doc
