"""``bench claims [--quick] [--only C07,C16] [--device cuda] [--merge cpu.json] [-o claims.html]``: measure what
the claims need (reusing stored runs and experiments from the same environment), print the verdict table, write
the HTML and JSON. ``--device cuda`` decides the claims with a GPU rule on the GPU; ``--merge`` joins the verdicts
another device's ``bench claims`` wrote, each rule decided on its own device."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import torch

from claims.catalog import load_catalog, select_claims
from claims.estimate import TIMINGS, estimate, minutes
from claims.evidence import Context
from claims.experiments.runner import Training, training
from claims.merge import base_device, merge_runs
from claims.model import Claim, Verdict
from claims.record import claims_document, read_verdicts
from claims.verdicts import run_claims
from cli.common import (check_max_processes, check_processes, err, max_processes_option, out,
                        processes_option, show_logs, store_option)
from harness.engine.env import fingerprint, usable_cores
from harness.contract.errors import BenchInputError
from harness.contract.replication import CLAIMS_MAX_FACTOR
from harness.store.db import Store
from reports.claims_view import VERDICTS, check_document, markdown_table, render_claims
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
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads per case (default: all usable cores; on a shared machine 1 keeps another program's busy core out of the timings).")
@click.option("--force", is_flag=True,
              help="Decide timing rules even when other processes kept the machine busy while they were measured.")
@click.option("--list", "list_only", is_flag=True, help="List the claims, what each needs and its estimated minutes (reused stored results count 0); measure "
                   "nothing.")
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
              help="Where to measure. On cuda: the claims with a rule for a GPU (`--list --device cuda` lists them), "
                   "their rules decided there.")
@click.option("--merge", "merge_path", default=None, metavar="OTHER.json",
              help="Join the verdicts `bench claims` wrote on another device (its .json, e.g. a CPU run's "
                   "results/claims.json): each rule decided on its own device, each claim decided again over all "
                   "its rules; the written report holds both.")
@processes_option(1, "1 by default; N > 1 makes every timing figure's interval one over processes")
@max_processes_option(f"default {CLAIMS_MAX_FACTOR}×N with --processes N > 1")
def claims(quick: bool, only: str | None, output: str, markdown: str | None, store_url: str | None, fresh: bool,
           seeds: str, threads: int | None, force: bool, list_only: bool, device: str, merge_path: str | None,
           processes: int | None, max_processes: int | None) -> None:
    """Test the documents' claims (claims/claims.toml; `--list` lists them): a verdict for each, with the figures that decided it, the device
    that measured them and their provenance. Exits 1 (after the table and the report) when a probe failed."""
    catalog = load_catalog()
    device = check_device(device)
    chosen = select_claims(catalog, only)
    if base_device(device) == "cuda":
        chosen = gpu_claims(catalog, chosen, only)
    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise BenchInputError(f"seeds must be comma-separated integers, got {seeds!r}", where="--seeds") from None
    if not seed_list:
        raise BenchInputError("need at least one seed", where="--seeds")
    if list_only:
        list_claims(chosen, store_url, quick, fresh, device, threads, seed_list)
        return
    path = Path(output)
    if path.is_dir():
        raise BenchInputError(f"{output} is a directory", where="--output")
    merged = read_merge(merge_path, device, catalog) if merge_path else None
    cuda_available(device)
    show_logs()
    threads = threads or usable_cores()
    ctx = Context(Store(store_url), quick=quick, fresh=fresh, seeds=seed_list, threads=threads, force=force,
                  device=device, processes=(n := check_processes(processes, "process")),
                  max_processes=check_max_processes(max_processes, n, CLAIMS_MAX_FACTOR * n if n > 1 else 1))
    t0 = time.perf_counter()

    def progress(v: Verdict) -> None:
        err.print(f"[bold]{v.claim.id}[/] [{VERDICT_STYLE[v.verdict]}]{v.verdict}[/] ({v.device}, {v.mode}): "
                  f"{v.reason}", highlight=False)

    try:
        with training(Training.pooled(threads)):     # the experiments' trials share one pool of worker processes
            measured = run_claims(chosen, ctx, progress)
    finally:
        ctx.close()                                  # the suites' kept worker
    context = {"quick": quick, "seeds": list(seed_list), "threads": threads, "used": ctx.used, "force": force,
               "device": device, "processes": ctx.processes, "max_processes": ctx.max_processes,
               "wall_s": time.perf_counter() - t0,
               "pieces": {k: {**v, "seconds": round(v["seconds"], 2)} for k, v in ctx.pieces.items()}}
    verdicts = measured
    if merged is not None:
        other_doc, other = merged
        verdicts = merge_runs(measured, other)
        context["used"] = list(dict.fromkeys([*ctx.used, *other_doc["context"].get("used", [])]))
        context["merged"] = {"path": str(merge_path), "context": other_doc["context"], "env": other_doc["env"]}
        err.print(f"merged with {merge_path} ({len(other)} claims decided on "
                  f"{', '.join(sorted(doc_devices(other_doc)))}): {len(verdicts)} claims", highlight=False)
    doc = json.loads(json.dumps(claims_document(verdicts, fingerprint(threads=threads), context), default=str,
                                allow_nan=False))                   # strict JSON: non-finite values are null
    out.print(verdict_table(doc))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".json").write_text(json.dumps(doc, indent=1, allow_nan=False))
        path.write_text(render_claims(doc), encoding="utf-8")
        if markdown:
            Path(markdown).write_text(markdown_table(doc), encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {output}: {exc.strerror}", where="--output") from None
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    err.print(f"wrote {path} and {path.with_suffix('.json')} — " + ", ".join(f"{n} {k}" for k, n in counts.items())
              + f" — {context['wall_s'] / 60:,.1f} min")
    torn = [v.claim.id for v in verdicts if any(o.conflict for o in v.outcomes)]
    if torn:
        err.print(f"[yellow]devices disagree on rules of {', '.join(torn)}[/]: those rules read unsure, "
                  "both outcomes in their detail", highlight=False)
    failed = {v.claim.source: v.evidence.failed for v in measured if v.evidence.failed}
    if failed:
        for name, why in failed.items():
            err.print(f"[red]probe {name} failed[/]: {why}", highlight=False)
        err.print(f"[red]{len(failed)} probe(s) failed: their claims read inconclusive[/]")
        sys.exit(1)


def list_claims(chosen: list[Claim], store_url: str | None, quick: bool, fresh: bool, device: str,
                threads: int | None, seeds: tuple[int, ...] = (0, 1, 2)) -> None:
    """``--list``: each claim, what it needs and its estimated minutes (claims.estimate: the store's reusable
    results cost nothing, else claims/timings.toml's seconds measured on the 2-core CPU), then the total with each
    suite and experiment counted once. Reads the store (never creates one) and measures nothing."""
    store = None
    try:
        store = Store(store_url, create=False)
    except BenchInputError:
        pass                                         # no store yet: nothing stored to reuse, the table alone
    ctx = (Context(store, quick=quick, fresh=fresh, seeds=seeds, threads=threads or usable_cores(), device=device)
           if store is not None else None)
    per, total, unknown = estimate(chosen, ctx, device)
    for c in chosen:
        out.print(f"{c.id}  {c.title}  [bold]{minutes(per[c.id])}[/]  "
                  f"[dim]({c.probe or 'figures declared in the catalog'}: {', '.join(c.needs) or 'computed directly'})[/]",
                  highlight=False, soft_wrap=True)
    size = "--quick sizes" if quick else "full sizes (the table's seconds are --quick's: a lower bound)"
    stored = sorted({p.name for ps in per.values() for p in ps if p.source == "stored"})
    err.print(f"estimated {total / 60:.1f} min for {len(chosen)} claims at {size}, each suite and experiment "
              f"counted once" + (f"; {len(stored)} reused from the store ({', '.join(stored)})" if stored else "")
              + (f"; no estimate for {', '.join(unknown)}" if unknown else "")
              + f" — seconds from {TIMINGS.name} (measured on a 2-core CPU, see its header) and the store",
              highlight=False)


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` (normalised); anything else is a one-line error."""
    d = device.strip().lower()
    kind, _, index = d.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise BenchInputError(f"{device!r} is not a device: use cpu, cuda or cuda:N", where="--device")
    return d


def cuda_available(device: str) -> None:
    """A one-line error unless ``device`` is the CPU or a CUDA device this process can use."""
    if base_device(device) != "cuda":
        return
    if not torch.cuda.is_available():
        why = "torch was built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise BenchInputError(f"CUDA is not available here (torch {torch.__version__}: {why}); run it on a machine "
                              "with a GPU (scripts/gpu-check does the whole GPU check)", where="--device")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise BenchInputError(f"there is no {device}: this machine has {torch.cuda.device_count()} CUDA device(s)",
                              where="--device")


def gpu_claims(catalog: list[Claim], chosen: list[Claim], only: str | None) -> list[Claim]:
    """The claims a GPU run decides: those with a rule for cuda (of ``--only``'s, when given: each must have one)."""
    with_gpu = [c for c in catalog if any(r.device == "cuda" for r in c.rules)]
    ids = {c.id for c in with_gpu}
    if only:
        bad = [c.id for c in chosen if c.id not in ids]
        if bad:
            raise BenchInputError(f"{', '.join(bad)} {'has' if len(bad) == 1 else 'have'} no rule for a GPU; "
                                  f"--device cuda decides {', '.join(sorted(ids))}", where="--only")
        return chosen
    return with_gpu


def doc_devices(doc: dict) -> set[str]:
    """The devices a claims document's verdicts were decided on (``cpu + cuda`` names two)."""
    return {base_device(d) for r in doc["claims"] for d in str(r.get("device") or "cpu").split("+") if d.strip()}


def read_merge(path: str, device: str, catalog: list[Claim]) -> tuple[dict, list[Verdict]]:
    """The document to merge and its verdicts: a claims document of this catalog, with claims, decided on
    devices other than ``device``; anything else is a one-line error."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BenchInputError(f"cannot read {path}: {exc.strerror}", where="--merge") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"{path} is not JSON ({exc})", where="--merge") from None
    try:
        check_document(doc)
    except ValueError as exc:
        raise BenchInputError(f"{path} {exc}", where="--merge") from None
    if not doc["claims"]:
        raise BenchInputError(f"{path} holds no claims: nothing to merge", where="--merge")
    same = doc_devices(doc) & {base_device(device)}
    if same:
        raise BenchInputError(f"{path} holds verdicts decided on {', '.join(sorted(same))}, as this run's: --merge "
                              "joins the verdicts of another device", where="--merge")
    try:
        return doc, read_verdicts(doc, catalog)
    except BenchInputError as exc:
        raise BenchInputError(f"{path}: {exc}", where="--merge") from None
