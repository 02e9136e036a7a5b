"""The history of a suite as HTML: one figure per case over commits (median line, interval band, flagged points
marked with their commit, hard-environment cuts), a checkbox per case to show or hide its figure. Its own page
(``bench history --html``) or a section of ``bench report``."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from markupsafe import Markup
from matplotlib.figure import Figure

from harness.contract.errors import BenchInputError
from reports.history import History, Series, change_points
from reports.jinja import template_env
from reports.plots import figure_svg

FLAG_COLOURS = {"slower": "#c0392b", "faster": "#1e8449", "metric": "#d35400", "status": "#7d3c98",
                "transient": "#95a5a6"}


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def series_figure(s: Series) -> Figure:
    """The series over its points (x: the points in git order, labelled by commit)."""
    fig = Figure(figsize=(8.0, 3.0), layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(s.points)))
    use = [p.usable for p in s.points]
    y = [_nan(p.value) if u else math.nan for p, u in zip(s.points, use)]
    lo = [_nan(p.ci_low) if u else math.nan for p, u in zip(s.points, use)]
    hi = [_nan(p.ci_high) if u else math.nan for p, u in zip(s.points, use)]
    ax.fill_between(x, lo, hi, color="#5dade2", alpha=0.3, linewidth=0, label="interval")
    ax.plot(x, y, "o-", color="#1f618d", markersize=3, linewidth=1.2, label=s.metric)
    other = [(i, p.value) for i, p in enumerate(s.points) if not use[i] and p.value is not None]
    if other:
        ax.plot([i for i, _ in other], [v for _, v in other], "o", mfc="none", color="#7f8c8d", markersize=5,
                label="dirty / not ok (not compared)")
    for i, p in enumerate(s.points):
        if p.env_change:
            ax.axvline(i - 0.5, color="#7f8c8d", linestyle="--", linewidth=1)
            ax.annotate("env: " + ", ".join(p.env_change), (i - 0.5, 1), xycoords=("data", "axes fraction"),
                        fontsize=7, color="#555", rotation=90, va="top", ha="right")
    for f in s.flags:
        p = s.points[f.index]
        v = p.value if p.value is not None else (min((v for v in y if not math.isnan(v)), default=0.0))
        ax.plot([f.index], [v], "D", color=FLAG_COLOURS.get(f.kind, "black"), markersize=7)
        ax.annotate(f"{f.commit[:8]} {f.kind}", (f.index, v), textcoords="offset points", xytext=(4, 6),
                    fontsize=8, color=FLAG_COLOURS.get(f.kind, "black"))
    ax.set_xticks(x, [p.short + ("*" if p.dirty else "") for p in s.points], rotation=60, fontsize=7)
    ax.set_xlabel("commit (git order)")
    ax.set_ylabel(s.metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def _summary(s: Series) -> list[str]:
    lines = [f"{f.commit[:8]} · {f.text}" for f in s.flags]
    if s.smallest_step is not None:
        lines.append(f"smallest flaggable step: {100 * s.smallest_step:.0f}%")
    if s.latest_vs_best is not None:
        worse, best = s.latest_vs_best
        lines.append(f"latest {100 * worse:.1f}% worse than the best ({best[:8]})" if worse > 0
                     else "latest is the best")
    if s.drift is not None:
        d = s.drift
        lines.append(f"drift {100 * d.total:+.1f}% [{100 * d.low:+.1f}%, {100 * d.high:+.1f}%] over {d.n} points"
                     + (" — flagged" if d.flagged else ""))
    return lines


def history_context(h: History) -> dict[str, Any]:
    """What ``_history.html.j2`` renders: per series its name, figure (SVG), flags and summary lines."""
    return {"history": {"suite": h.suite, "quick": h.quick, "metric": h.metric, "notes": list(h.notes),
                        "series": [{"name": s.name, "svg": Markup(figure_svg(series_figure(s))),
                                    "n_points": len(s.points), "n_flags": len(change_points(s)), "summary": _summary(s)}
                                   for s in h.series]}}


def render_history_page(h: History) -> str:
    return template_env().get_template("history.html.j2").render(title=f"bench history · {h.suite}",
                                                                   **history_context(h))


def write_history_page(h: History, path: str | Path) -> None:
    path = Path(path)
    if path.is_dir():
        raise BenchInputError(f"{path} is a directory, not an HTML file to write", where="--html")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_history_page(h), encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot write {path}: {exc.strerror}", where="--html") from None
