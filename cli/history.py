"""``bench history``: a suite's cases over the commits of its stored runs (reports.history), as tables, JSON or an
HTML page. Imports no torch (``bench report`` adds the history section with it)."""
from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from cli.common import err, out, store_option
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from harness.contract.suite import find_suite
from harness.engine.commits import REPO, git_order
from harness.store.db import Store
from reports.history import TIMING_METRIC, History, Series, build_history, change_points, history_dict
from reports.history_page import history_context, write_history_page

repo_option = click.option("--repo", "repo", default=None, metavar="DIR", type=click.Path(file_okay=False),
                           help="The git repository whose commits to follow (default: this checkout).")


def suite_name(ref: str) -> str:
    """The suite's name for a path or built-in name (its ``name`` key), else ``ref`` itself (a stored suite)."""
    try:
        path = find_suite(ref)
    except BenchInputError:
        return ref
    try:
        return str(tomllib.loads(path.read_text(encoding="utf-8")).get("name") or path.stem)
    except (OSError, tomllib.TOMLDecodeError):
        return path.stem


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _value(v: float | None, lo: float | None, hi: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" + (f" [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else "")


def series_table(s: Series) -> Table:
    step = f"; smallest flaggable step {100 * s.smallest_step:.0f}%" if s.smallest_step is not None else ""
    t = Table(title=f"{s.name} ({s.metric}, {len(s.points)} points{step})", title_justify="left")
    for col in ("commit", "subject", f"{s.metric} [interval]", "status", "flag / note"):
        t.add_column(col, overflow="fold")
    flags = {}
    for f in s.flags:
        flags.setdefault(f.index, []).append(f.text)
    for i, p in enumerate(s.points):
        notes = [f"⚑ {x}" for x in flags.get(i, [])]
        if p.env_change:
            notes.append("hard environment changed: " + ", ".join(p.env_change))
        if p.dirty:
            notes.append("dirty tree: not compared")
        if p.cpu_unknown:
            notes.append("CPU identity not recorded")
        t.add_row(p.short + ("*" if p.dirty else ""), p.subject[:40], _value(p.value, p.ci_low, p.ci_high), p.status,
                  "; ".join(notes))
    return t


def summary_lines(s: Series) -> list[str]:
    out_ = []
    if s.latest_vs_best is not None:
        worse, best = s.latest_vs_best
        out_.append(f"latest {100 * worse:.1f}% worse than the best ({best[:8]})" if worse > 0
                    else "latest is the best")
    if s.drift is not None:
        d = s.drift
        out_.append(f"drift {_pct(d.total)} [{_pct(d.low)}, {_pct(d.high)}] over {d.n} points since {d.since[:8]}"
                    + (" ⚑ flagged" if d.flagged else " (not flagged)"))
    flagged = change_points(s)
    out_.append(f"{len(flagged)} flagged" + (": " + ", ".join(f"{f.commit[:8]} {f.kind}" for f in flagged)
                                              if flagged else "")
                + (f"; {len(s.flags) - len(flagged)} transient" if len(s.flags) > len(flagged) else ""))
    return out_


def load_history(store: Store, name: str, quick: bool, repo: Path, since: str | None, metric: str,
                 case: str) -> History:
    runs = [r for r in store.list_runs(suite=name) if bool(r.quick) == quick]
    order = git_order([r.commit for r in runs], repo, since)
    pairs = [(r, store.records(r.id)) for r in runs if r.commit in order]
    h = build_history(pairs, order, suite=name, quick=quick, metric=metric, case=case)
    missing = len(runs) - len(pairs)
    if missing:
        h = dataclasses.replace(h, notes=(f"{missing} run(s) left out: their commit is not in {repo}'s history"
                                          + (f" since {since}" if since else ""),))
    return h


def report_history(store: Store, runs: Sequence[tuple[RunRecord, Sequence[CaseRecord]]]) -> dict[str, Any] | None:
    """The history section of ``bench report``: the first run's suite over the commits of this checkout, when the
    store holds runs of it at two commits or more (else None)."""
    if not runs:
        return None
    first = runs[0][0]
    h = load_history(store, first.suite, bool(first.quick), REPO, None, TIMING_METRIC, "")
    if not any(len({p.commit for p in s.points}) >= 2 for s in h.series):
        return None
    return history_context(h)["history"]


@click.command("history")
@click.argument("suite_ref", metavar="SUITE")
@click.option("--quick", is_flag=True, help="The runs made with --quick (their cases differ from full runs').")
@click.option("--case", "case", default="", metavar="TEXT", help="Only the cases whose name contains TEXT.")
@click.option("--metric", default=TIMING_METRIC, show_default=True, metavar="NAME",
              help="The metric to follow (timings are compared with their intervals; an exact metric such as macs "
                   "is shown as steps).")
@click.option("--since", default=None, metavar="REF", help="Only runs at REF and the commits after it.")
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
@click.option("--html", "html", default=None, metavar="FILE.html", help="Also write the history page.")
@repo_option
@store_option
def history_cmd(suite_ref: str, quick: bool, case: str, metric: str, since: str | None, as_json: bool,
                html: str | None, repo: str | None, store_url: str | None) -> None:
    """A suite's cases over the commits of its stored runs, in git order: each point's median with its interval,
    exact metrics as steps, status changes; change points flagged when beyond the noise, the latest value's distance
    from the best, and slow drift."""
    name = suite_name(suite_ref)
    root = Path(repo).resolve() if repo else REPO
    h = load_history(Store(store_url, create=False), name, quick, root, since, metric, case)
    if not h.series:
        what = f" matching {case!r}" if case else ""
        raise BenchInputError(f"no stored {'--quick ' if quick else ''}runs of {name!r} with cases{what} at commits "
                              f"of {root}", where="SUITE")
    if html:
        write_history_page(h, html)
        err.print(f"wrote {html}")
    if as_json:
        click.echo(json.dumps(history_dict(h), indent=1, default=str))
        return
    for note in h.notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False)
    for s in h.series:
        out.print(series_table(s))
        for line in summary_lines(s):
            out.print(f"  {line}", highlight=False)


COMMANDS = (history_cmd,)
