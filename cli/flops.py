"""``bench flops ARCH [--by-module [--diff-only]]``: one architecture's MACs by three counters side by side —
ours (:mod:`harness.instruments.flops`), torch's stock ``FlopCounterMode`` and fvcore's ``FlopCountAnalysis``."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import click
from rich.table import Table

from cli.common import load_plugins, out, plugin_option
from harness.contract import registry
from harness.contract.errors import BenchInputError
from harness.engine.flop_table import FlopRow, FlopTable, build_real, flop_table, relative_spread
from harness.contract.spec import MODES, Workload
from harness.contract.suite import parse_set

COUNTERS = (("ours", "ours (harness.instruments.flops)"), ("torch", "torch FlopCounterMode"),
            ("fvcore", "fvcore FlopCountAnalysis"))
UNITS = (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
DEFAULT_DEPTH = 2


def si(n: int | None) -> str:
    """``17.56 G``, ``464.9 M``, ``512``; ``—`` for no figure."""
    if n is None:
        return "—"
    for suffix, scale in UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.4g} {suffix}"
    return str(n)


def vs(value: int | None, ours: int) -> str:
    """``value`` relative to ours, in percent."""
    if value is None or not ours:
        return "—"
    pct = 100 * (value - ours) / ours
    return "0 %" if value == ours else f"{pct:+.2f} %"


def totals_table(table: FlopTable, title: str) -> Table:
    """One row per counter: MACs, exact and short, and the difference from ours."""
    t = Table(title=title, title_justify="left")
    for name, justify in (("counter", "left"), ("MACs", "right"), ("", "right"), ("vs ours", "right")):
        t.add_column(name, justify=justify)
    for key, label in COUNTERS:
        value = getattr(table, key)
        t.add_row(label, f"{value:,}" if value is not None else "—", si(value),
                  "—" if key == "ours" else vs(value, table.ours))
    return t


def module_table(rows: tuple[FlopRow, ...], title: str, tolerance: float) -> Table:
    """One row per module: MACs by each counter, the spread between them, ◆ past ``tolerance``."""
    t = Table(title=title, title_justify="left")
    t.add_column("module")
    t.add_column("class", style="dim")
    for key, _ in COUNTERS:
        t.add_column(f"{key} MACs", justify="right")
    t.add_column("spread", justify="right")
    t.add_column("")
    for r in rows:
        spread = relative_spread((r.ours, r.torch, r.fvcore))
        flag = r.differs(tolerance)
        t.add_row(r.path or "(model)", r.kind, si(r.ours), si(r.torch), si(r.fvcore),
                  f"{100 * spread:.1f} %" if spread else "", "[bold red]◆[/]" if flag else "",
                  style="bold" if flag else None)
    return t


def notes(table: FlopTable, by_module: bool, tolerance: float) -> list[str]:
    """What the reader needs to read the figures: units, what fvcore skipped or could not count."""
    lines = ["MACs = multiply-accumulates. torch's FlopCounterMode (ours and torch) counts FLOPs = 2·MACs, "
             "halved here; fvcore counts one \"flop\" per fused multiply-add, i.e. MACs."]
    if table.fvcore_note:
        lines.append(f"fvcore: {table.fvcore_note}")
    if table.fvcore_elementwise:
        left = ", ".join(f"{op} {si(n)}" for op, n in table.fvcore_elementwise)
        lines.append(f"fvcore: its elementwise counts are left out of its MACs (ours and torch count them 0): {left}")
    if table.fvcore_unsupported:
        ops = ", ".join(f"{u.name} ×{u.calls}" + (" [bold](ours has a formula)[/]" if u.ours_formula else "")
                        for u in table.fvcore_unsupported)
        lines.append(f"fvcore: unsupported ops, counted 0: {ops}")
    if by_module:
        lines.append(f"◆: the counters differ by more than {100 * tolerance:g} % (spread = (max − min) / max); "
                     "—: no figure (the module was not called, e.g. out_proj under nn.MultiheadAttention's "
                     "fused fast path, or fvcore has none)")
    return lines


def write_csv(path: str, table: FlopTable, tolerance: float) -> None:
    """The rows (exact MACs, empty where a counter has no figure) as CSV."""
    try:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "class", "depth", "ours_macs", "torch_macs", "fvcore_macs", "differs"])
            for r in table.rows:
                w.writerow([r.path, r.kind, r.depth, *("" if v is None else v for v in (r.ours, r.torch, r.fvcore)),
                            int(r.differs(tolerance))])
    except OSError as exc:
        raise BenchInputError(f"cannot write {path}: {exc.strerror}", where="--csv") from None


@click.command("flops")
@click.argument("arch")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length (sequence models).")
@click.option("--img-size", type=click.IntRange(min=1), default=None,
              help="Image side (image models; also the model's img_size where its config has one).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a config field (repeatable).")
@click.option("--mode", type=click.Choice([m for m in MODES if m != "train_step"]), default="fwd", show_default=True,
              help="Forward (eval, no grad) or forward + backward (fvcore: forward only).")
@click.option("--by-module", is_flag=True, help="Add one row per module (down to --depth) above the totals.")
@click.option("--depth", type=click.IntRange(min=0), default=None,
              help=f"Module depth shown (the model is 0) [default: {DEFAULT_DEPTH}; every depth with --diff-only].")
@click.option("--diff-only", is_flag=True, help="Only the modules where the counters differ (implies --by-module).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1.0, show_default=True, metavar="PCT",
              help="Relative difference (%) past which a module's counters differ.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON (exact MACs) instead.")
@click.option("--csv", "csv_path", default=None, metavar="FILE.csv", help="Also write the module rows as CSV.")
@plugin_option
def flops(arch: str, batch_size: int, seq_len: int | None, img_size: int | None, sets: tuple[str, ...], mode: str,
          by_module: bool, depth: int | None, diff_only: bool, tolerance: float, as_json: bool, csv_path: str | None,
          plugins: tuple[str, ...]) -> None:
    """MACs of ARCH on one input by three counters side by side: ours (harness.instruments.flops), torch's stock
    FlopCounterMode and fvcore's FlopCountAnalysis; totals, or per module with --by-module."""
    load_plugins(plugins)
    workload = Workload(batch_size=batch_size, seq_len=seq_len, img_size=img_size, mode=mode)
    overrides = parse_set(sets)
    if img_size and hasattr(registry.get(arch).config, "img_size"):
        overrides.setdefault("img_size", img_size)    # as a suite does: a ViT's position table follows the input
    spec = registry.resolve(arch, **overrides)
    try:
        model, inputs = build_real(spec, workload)
    except BenchInputError:
        raise
    except ValueError as exc:       # the config's or the input maker's own rules, e.g. no seq_len given
        hint = "; give --seq-len N" if "seq_len" in str(exc) and seq_len is None else ""
        raise BenchInputError(f"{exc}{hint}", where=arch) from None
    by_module = by_module or diff_only
    if depth is None:
        depth = None if diff_only else DEFAULT_DEPTH
    table = flop_table(model, inputs, depth=depth, mode=mode)
    frac = tolerance / 100
    if csv_path:
        write_csv(csv_path, table, frac)
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs if hasattr(x, "shape"))
    if as_json:
        click.echo(json.dumps({"arch": spec.name, "mode": mode, "inputs": shapes, "tolerance_pct": tolerance,
                               **table.as_dict()}, indent=2))
        return
    title = f"{spec.name} · {mode} · inputs {shapes} · MACs"
    if by_module:
        rows = table.differing(frac) if diff_only else table.rows
        if rows:
            out.print(module_table(rows, title, frac))
        else:
            out.print(f"{title}: no module's counters differ by more than {tolerance:g} %", highlight=False)
    out.print(totals_table(table, "" if by_module else title))
    for line in notes(table, by_module, frac):
        out.print(line, highlight=False, soft_wrap=True)
    if csv_path:
        out.print(f"wrote {len(table.rows)} module rows to {Path(csv_path)}", highlight=False)
