"""``bench claims [--quick] [--only C07,C16] [-o claims.html]``: measure what the claims need (reusing stored
runs and experiments from the same environment), print the verdict table, write the HTML and JSON."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from claims.catalog import load_catalog, select_claims
from claims.evidence import Context
from claims.model import Verdict
from claims.record import claims_document
from claims.verdicts import run_claims
from cli.common import debug_option, err, out, show_logs, store_option
from harness.env import fingerprint, usable_cores
from harness.errors import BenchInputError
from harness.store import Store
from reports.claims_view import VERDICTS, markdown_table, render_claims
from reports.terminal import VERDICT_STYLE, verdict_table

DEFAULT_OUTPUT = "results/claims.html"


@click.command("claims")
@click.option("--quick", is_flag=True, help="Quick suite sizes and training budgets (minutes on 2 CPU cores).")
@click.option("--only", default=None, metavar="C07,C16", help="Only these claims (comma-separated ids).")
@click.option("-o", "--output", default=DEFAULT_OUTPUT, show_default=True, metavar="FILE.html",
              help="The claims report; a JSON record of the verdicts is written beside it (.json).")
@click.option("--markdown", default=None, metavar="FILE.md", help="Also write the verdict table as Markdown.")
@store_option
@click.option("--fresh", is_flag=True, help="Measure everything again instead of reusing stored results.")
@click.option("--seeds", default="0,1,2", show_default=True, metavar="0,1,2", help="Seeds of the training experiments.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all usable cores).")
@click.option("--force", is_flag=True,
              help="Decide timing rules even when other processes kept the machine busy while they were measured.")
@click.option("--list", "list_only", is_flag=True, help="List the claims and what each needs; measure nothing.")
@debug_option
def claims(quick: bool, only: str | None, output: str, markdown: str | None, store_url: str | None, fresh: bool,
           seeds: str, threads: int | None, force: bool, list_only: bool, debug: bool) -> None:
    """Test the documents' claims (C01–C39): a verdict for each, with the figures that decided it, the device
    that measured them and their provenance. Exits 1 (after the table and the report) when a probe failed."""
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
    show_logs()
    threads = threads or usable_cores()
    ctx = Context(Store(store_url), quick=quick, fresh=fresh, seeds=seed_list, threads=threads, force=force)
    t0 = time.perf_counter()

    def progress(v: Verdict) -> None:
        err.print(f"[bold]{v.claim.id}[/] [{VERDICT_STYLE[v.verdict]}]{v.verdict}[/] ({v.device}, {v.mode}): "
                  f"{v.reason}", highlight=False)

    verdicts = run_claims(chosen, ctx, progress)
    context = {"quick": quick, "seeds": list(seed_list), "threads": threads, "used": ctx.used, "force": force,
               "wall_s": time.perf_counter() - t0}
    doc = json.loads(json.dumps(claims_document(verdicts, fingerprint(threads=threads), context), default=str))
    out.print(verdict_table(doc))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".json").write_text(json.dumps(doc, indent=1))
        path.write_text(render_claims(doc), encoding="utf-8")
        if markdown:
            Path(markdown).write_text(markdown_table(doc), encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {output}: {exc.strerror}", where="--output") from None
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    err.print(f"wrote {path} and {path.with_suffix('.json')} — " + ", ".join(f"{n} {k}" for k, n in counts.items())
              + f" — {context['wall_s'] / 60:,.1f} min")
    failed = {v.claim.probe: v.evidence.failed for v in verdicts if v.evidence.failed}
    if failed:
        for name, why in failed.items():
            err.print(f"[red]probe {name} failed[/]: {why}", highlight=False)
        err.print(f"[red]{len(failed)} probe(s) failed: their claims read inconclusive[/]")
        sys.exit(1)
