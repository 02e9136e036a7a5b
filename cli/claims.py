"""``bench claims [--quick] [--only C07,C16] [-o claims.html]``: measure what the claims need (reusing stored
runs and experiments from the same environment), print the verdict table, write the HTML and JSON."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from harness.errors import BenchInputError

DEFAULT_OUTPUT = "results/claims.html"


@click.command("claims")
@click.option("--quick", is_flag=True, help="Quick suite sizes and training budgets (minutes on 2 CPU cores).")
@click.option("--only", default=None, metavar="C07,C16", help="Only these claims (comma-separated ids).")
@click.option("-o", "--output", default=DEFAULT_OUTPUT, show_default=True, metavar="FILE.html",
              help="The claims report; a JSON record of the verdicts is written beside it (.json).")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="SQLAlchemy URL of the results store (default: sqlite:///results/bench.sqlite).")
@click.option("--fresh", is_flag=True, help="Measure everything again instead of reusing stored results.")
@click.option("--seeds", default="0,1,2", show_default=True, metavar="0,1,2", help="Seeds of the training experiments.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all usable cores).")
@click.option("--list", "list_only", is_flag=True, help="List the claims and what each needs; measure nothing.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def claims(quick: bool, only: str | None, output: str, store_url: str | None, fresh: bool, seeds: str,
           threads: int | None, list_only: bool, debug: bool) -> None:
    """Test the documents' claims (C01–C30): a verdict for each, with the figures that decided it."""
    from claims.catalog import load_catalog, select_claims
    from claims.evidence import Context
    from claims.verdicts import run_claims
    from harness.env import fingerprint, usable_cores
    from harness.store import Store
    from reports.claims_view import STYLE, claims_document, render_claims, verdict_table

    out = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    chosen = select_claims(load_catalog(), only)
    if list_only:
        for c in chosen:
            out.print(f"{c.id}  {c.title}  [dim]({c.probe}: {', '.join(c.needs) or 'computed directly'})[/]")
        return
    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise BenchInputError(f"seeds must be comma-separated integers, got {seeds!r}", where="--seeds") from None
    if not seed_list:
        raise BenchInputError("need at least one seed", where="--seeds")
    path = Path(output)
    if path.is_dir():
        raise BenchInputError(f"{output} is a directory", where="--output")
    threads = threads or usable_cores()
    ctx = Context(Store(store_url), quick=quick, fresh=fresh, seeds=seed_list, threads=threads, console=err)
    t0 = time.perf_counter()

    def progress(v) -> None:  # noqa: ANN001
        err.print(f"[bold]{v.claim.id}[/] [{STYLE[v.verdict]}]{v.verdict}[/]: {v.reason}", highlight=False)

    verdicts = run_claims(chosen, ctx, progress)
    out.print(verdict_table(verdicts))
    env = fingerprint(threads=threads)
    context = {"quick": quick, "seeds": list(seed_list), "threads": threads, "used": ctx.used,
               "wall_s": time.perf_counter() - t0}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = json.loads(json.dumps(claims_document(verdicts, env, context), default=str))
        path.with_suffix(".json").write_text(json.dumps(doc, indent=1))
        path.write_text(render_claims(doc), encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {output}: {exc.strerror}", where="--output") from None
    counts = {k: sum(v.verdict == k for v in verdicts) for k in STYLE}
    err.print(f"wrote {path} and {path.with_suffix('.json')} — " + ", ".join(f"{n} {k}" for k, n in counts.items())
              + f" — {context['wall_s'] / 60:,.1f} min")
