"""How long `bench claims` will take, claim by claim (``bench claims --list``), before anything is measured.

A claim costs its probe's own computation plus the suites and experiments it needs (what its probe declares it
reads, ``@probe(..., reads=...)``, or the suite its declared figures read);
a suite or experiment several claims read is measured once, so the total counts each piece once. Each piece's
seconds come, in this order, from:

1. the store: a stored result this run would reuse costs nothing ("stored");
2. ``claims/timings.toml``: seconds measured on this project's 2-core CPU (each entry says when and how), also
   refreshed from a claims run's JSON (``context.pieces``: what each suite, experiment and probe took);
3. the store's latest run of the suite at this size (its wall time), for a suite the table lacks;
4. otherwise the piece has no estimate, and the claim says so (never a 0).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from claims.evidence import Context
from claims.model import Claim
from harness.contract.errors import BenchInputError

TIMINGS = Path(__file__).with_name("timings.toml")


@dataclass(frozen=True)
class Piece:
    """One suite, experiment or probe computation and its estimated seconds (None: no estimate)."""

    name: str                    # "suite kv_cache", "experiment kv_heads", "probe qk_macs"
    seconds: float | None
    source: str                  # "stored", "table", "store", "none"


def load_timings(path: Path = TIMINGS) -> dict[str, float]:
    """The table: ``{"suite X": s, "experiment Y": s, "probe Z": s}``."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {f"{kind} {name}": float(s) for kind in ("suite", "experiment", "probe")
            for name, s in (data.get(kind) or {}).items()}


def pieces_of(claim: Claim, device: str = "cpu") -> list[str]:
    """The pieces a claim needs on ``device``: its probe (or the claim, for declared figures), and each "suite X" /
    "experiment Y" it needs (one marked "(cuda)" only on a CUDA device)."""
    out = [f"probe {claim.source}"]
    for need in claim.needs:
        text = need.strip()
        if text.endswith("(cuda)"):
            if not device.startswith("cuda"):
                continue
            text = text[: -len("(cuda)")].strip()
        kind, _, name = text.partition(" ")
        if kind in ("suite", "experiment") and name:
            out.append(f"{kind} {name}")
    return out


def _wall_s(run: Any) -> float | None:
    try:
        return (datetime.fromisoformat(run.finished_at) - datetime.fromisoformat(run.started_at)).total_seconds()
    except (TypeError, ValueError):
        return None


def _reusable(suite: str, runs: list[Any], ctx: Context) -> bool:
    """Whether ``ctx.suite`` would reuse a stored run of ``suite``: checked case by case for a built-in suite at
    the probes' default ``--set`` (threads); for another suite (claims/generation.toml), a complete, interleaved run
    of `bench claims` at this size on this hard environment."""
    try:
        sets = {"threads": ctx.threads, **({"device": ctx.device} if ctx.device != "cpu" else {})}
        _, cases, reads = ctx.plan_suite(suite, sets)
    except BenchInputError:
        hard = {k: v for k, v in ctx.hard_env().items() if k != "threads"}      # such a suite pins its own threads
        return any(r.options.get("by") == "bench claims" and r.options.get("interleave") and r.stored == r.n_cases
                   and {k: v for k, v in r.hard_env.items() if k != "threads"} == hard for r in runs)
    procs = max(ctx.processes, reads.processes)
    return ctx.stored_suite(suite, sets, {c.key for c in cases}, reads.peak, procs,
                            max(ctx.max_processes, procs)) is not None


def estimate_piece(name: str, ctx: Context | None, table: dict[str, float]) -> Piece:
    kind, _, what = name.partition(" ")
    if ctx is not None and not ctx.fresh:
        if kind == "experiment" and ctx.stored_experiment(what) is not None:
            return Piece(name, 0.0, "stored")
        if kind == "suite":
            runs = [r for r in ctx.store.list_runs(what) if r.quick == ctx.quick and r.status == "done"]
            if _reusable(what, runs, ctx):
                return Piece(name, 0.0, "stored")
            if name not in table and runs and _wall_s(runs[0]) is not None:
                return Piece(name, _wall_s(runs[0]), "store")
    if name in table:
        return Piece(name, table[name], "table")
    return Piece(name, None, "none")


def estimate(claims: list[Claim], ctx: Context | None = None, device: str = "cpu",
             table: dict[str, float] | None = None) -> tuple[dict[str, list[Piece]], float, list[str]]:
    """Per claim its pieces with their estimates; the total seconds counting each piece once; and the pieces
    without an estimate."""
    table = load_timings() if table is None else table
    memo: dict[str, Piece] = {}
    per: dict[str, list[Piece]] = {}
    for c in claims:
        per[c.id] = [memo.setdefault(p, estimate_piece(p, ctx, table)) for p in pieces_of(c, device)]
    total = sum(p.seconds or 0.0 for p in memo.values())
    unknown = sorted(p.name for p in memo.values() if p.seconds is None)
    return per, total, unknown


def minutes(pieces: list[Piece]) -> str:
    """A claim's estimate as text: "~3.2 min", "stored" when everything is reused, "? min" with a missing piece."""
    known = sum(p.seconds or 0.0 for p in pieces)
    if any(p.seconds is None for p in pieces):
        return f"≥ {known / 60:.1f} min (no estimate for {', '.join(p.name for p in pieces if p.seconds is None)})"
    return f"~{known / 60:.1f} min"


def table_from_run(doc: dict[str, Any], note: str = "") -> str:
    """claims/timings.toml's text from a claims run's JSON (``context.pieces``): the seconds of every piece that
    run measured (reused pieces took no time there and are left out), with where they came from."""
    ctx = doc.get("context") or {}
    pieces = ctx.get("pieces") or {}
    env = (doc.get("env") or {}).get("hard") or {}
    lines = [
        "# Seconds each piece of `bench claims` takes, for `bench claims --list` (claims/estimate.py). DATA written by",
        "# `python -m claims.estimate CLAIMS.json` from a claims run's context.pieces (what each suite, experiment and",
        "# probe's own computation took in that run); pieces that run reused from the store are not in it.",
        f"# Run: quick={ctx.get('quick')}, threads {ctx.get('threads')}, seeds {ctx.get('seeds')}, "
        f"{ctx.get('wall_s', 0) / 60:.1f} min wall; cpu {env.get('cpu', '?')}, torch {env.get('torch', '?')}.",
    ]
    if note:
        lines += [f"# {line}" for line in note.splitlines()]
    for kind in ("probe", "suite", "experiment"):
        lines += ["", f"[{kind}]"]
        for name, p in sorted(pieces.items()):
            k, _, what = name.partition(" ")
            if k == kind and not p.get("reused"):
                lines.append(f'"{what}" = {float(p["seconds"]):.1f}')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":          # python -m claims.estimate results/claims.json [NOTE] > claims/timings.toml
    import json
    import sys

    print(table_from_run(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")), " ".join(sys.argv[2:])), end="")
