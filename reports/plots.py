"""Matplotlib figures of a run's metrics vs its swept axis, and inline SVG for the HTML views.

One figure per metric (latency, peak memory, MACs, throughput), every line of the run in it: each line's
legend entry carries the fit the run's headline shows (:func:`harness.analysis.fits.fit_cost`, the project's one
fit: affine with a floor, or a power law over the scaling regime), the fitted curve is drawn over the points it
covers and the floor points below a power law's regime are hollow. Cases that produced no number are marks at their x, never gaps.

Figures are built as ``matplotlib.figure.Figure`` objects directly — never through pyplot — so no
interactive backend, GUI or global figure registry is involved.
"""
from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")  # non-interactive; harmless if already selected
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from harness.analysis.fits import AffineFit, ScalingFit, fit_cost  # noqa: E402
from harness.contract.records import CaseRecord  # noqa: E402
from reports.findings import EXACT_METRICS  # noqa: E402
from reports.frames import is_number  # noqa: E402
from reports.sentences import fit_text, symbol  # noqa: E402

MiB = 1024 * 1024


@dataclass(frozen=True)
class MetricView:
    """How a stored metric is drawn: its short name, axis label and the divisor of its unit."""

    name: str
    label: str
    scale: float = 1.0


FIGURE_METRICS: dict[str, MetricView] = {
    "median_ms": MetricView("latency", "median latency (ms), 95% CI"),
    "peak_bytes": MetricView("peak memory", "peak memory (MiB)", MiB),
    "macs": MetricView("MACs", "GMACs", 1e9),
    "throughput_per_s": MetricView("throughput", "throughput (items/s)"),
    # generation cases (harness.engine.generation): drawn only where a run has them
    "ttft_ms": MetricView("TTFT", "time to first token (ms)"),
    "tpot_ms": MetricView("TPOT", "time per output token after the first (ms)"),
    "itl_p99_ms": MetricView("ITL p99", "inter-token latency, p99 (ms)"),
    "output_tokens_per_s": MetricView("output tokens/s", "output tokens per second (whole generation)"),
    "kv_cache_bytes": MetricView("KV cache", "KV cache / state (MiB)", MiB),
    "energy_per_sample_j": MetricView("energy per sample", "energy per sample (J), --energy"),
    "energy_per_token_j": MetricView("energy per token", "energy per token (J), --energy"),
}
"""The figures of a run, in order (the suite's plot ``y`` leads when it names another metric)."""

Y_ALIASES = {"latency": "median_ms", "latency_ms": "median_ms", "memory": "peak_bytes", "peak_memory": "peak_bytes",
             "throughput": "throughput_per_s"}
"""Plot-spec ``y`` names that stand for a stored metric."""

ERROR_MARKS = {  # status -> (marker, colour, height in axes fraction)
    "oom": ("v", "#c0392b", 0.97),
    "timeout": ("s", "#d68910", 0.93),
    "error": ("X", "#7b241c", 0.89),
    "crashed": ("P", "#512e5f", 0.87),
    "skipped": ("x", "#7f8c8d", 0.85),
}
"""How a case that produced no number is drawn: a mark at its x, on the top edge of the axes."""


@dataclass(frozen=True)
class PlotSpec:
    """What the figures of a run plot: ``x`` the swept axis (None: one category per line), ``y`` the
    metric that leads, log scales and the suite's title for the lead figure."""

    x: str | None
    y: str = "median_ms"
    x_log: bool = False
    y_log: bool = True
    title: str | None = None
    numeric: bool = False


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


class PlainLogFormatter(LogFormatter):
    """Labels the ticks matplotlib's LogFormatter would label, as plain text: ``2.5``, ``0.03`` and ``10⁹``, not
    ``2.5×10⁰`` (a metric that spans less than a decade is labelled by its minor ticks). Plain text, not mathtext:
    parsing each mathtext label took a twelfth of a report's rendering."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        if not super().__call__(x, pos):
            return ""
        power = round(math.log10(x)) if x > 0 else 0
        if x > 0 and not -3 <= power <= 4 and math.isclose(x, 10.0 ** power, rel_tol=1e-9):
            return "10" + str(power).translate(_SUPERSCRIPT)
        return f"{x:g}"


def set_log(ax: Axes, *which: str) -> None:
    """A log scale on ``which`` ("x", "y") of ``ax``, its ticks labelled by :class:`PlainLogFormatter`."""
    for name in which:
        getattr(ax, f"set_{name}scale")("log")
        axis = getattr(ax, f"{name}axis")
        axis.set_major_formatter(PlainLogFormatter())
        axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def metric_view(metric: str) -> MetricView:
    if metric in FIGURE_METRICS:
        return FIGURE_METRICS[metric]
    return MetricView(metric, f"{metric} (MiB)", MiB) if metric.endswith("_bytes") else MetricView(metric, metric)


def resolve_plot_spec(plot: Mapping[str, Any] | None, records: Sequence[CaseRecord], axis: str | None) -> PlotSpec:
    """The suite's ``plot`` table (``run.spec.plot``; ``{}`` for a run stored without it) over ``axis``,
    the run's sweep axis: ``x_log`` by default where the axis is a number, ``y_log`` by default."""
    plot = dict(plot or {})
    y = str(plot.get("y") or "median_ms")
    numeric = bool(records) and axis is not None and all(is_number(r.value(axis)) for r in records)
    return PlotSpec(x=axis, y=Y_ALIASES.get(y, y), x_log=bool(plot.get("x_log", numeric)) and numeric,
                    y_log=bool(plot.get("y_log", True)), title=plot.get("title") or None, numeric=numeric)


def figure_metrics(spec: PlotSpec) -> list[str]:
    """The metrics to draw, the spec's ``y`` first."""
    return list(dict.fromkeys([spec.y, *FIGURE_METRICS]))


def tex_safe(text: Any) -> str:
    """Matplotlib treats ``$...$`` as math; labels come from results and must show verbatim."""
    return str(text).replace("$", r"\$")


def line_fits(records: Sequence[CaseRecord], metric: str, spec: PlotSpec) -> dict[str, ScalingFit | AffineFit | None]:
    """Per line, ``metric`` vs the numeric axis by :func:`harness.analysis.fits.fit_cost` (ok cases only), exactly as
    the run's findings fit it."""
    out: dict[str, ScalingFit | AffineFit | None] = {}
    for line in dict.fromkeys(r.line for r in records):
        pts = [(float(r.value(spec.x)), r.metric(metric)) for r in records
               if r.line == line and r.ok and r.metric(metric) is not None] if spec.numeric and spec.x else []
        out[line] = (fit_cost([p[0] for p in pts], [p[1] for p in pts], exact=metric in EXACT_METRICS)
                     if len(pts) >= 2 else None)
    return out


def metric_figure(records: Sequence[CaseRecord], metric: str, spec: PlotSpec,
                  fits: Mapping[str, ScalingFit | AffineFit | None] | None = None, title: str | None = None,
                  figsize: tuple[float, float] = (6.4, 4.8)) -> Figure:
    """``metric`` vs ``spec.x`` with one line per suite line; log-log where the axis is a size.

    ``fits``: per line its :class:`ScalingFit` of ``metric`` (as :mod:`reports.findings` made them; computed
    with the same rule when absent). A line's legend entry reads ``line: n^k [lo, hi]``; the fitted power
    law is drawn over its scaling regime ``[x_min, x_max]`` only (SVG id ``fit-<i>``) and the floor points below it
    are hollow (``floor-<i>``). Cases without a number (oom, timeout, error, skipped) are marks at their x
    on the top edge of the axes (``status-<status>``), one legend entry per status.
    """
    view = metric_view(metric)
    fits = dict(fits) if fits is not None else line_fits(records, metric, spec)
    lines = list(dict.fromkeys(r.line for r in records))
    categories = [] if spec.numeric else list(dict.fromkeys(_category(r, spec) for r in records))

    def xpos(r: CaseRecord) -> float:
        return float(r.value(spec.x)) if spec.numeric else float(categories.index(_category(r, spec)))

    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    top_edge = blended_transform_factory(ax.transData, ax.transAxes)
    seen_status: dict[str, None] = {}
    entries: list[tuple[Any, str]] = []          # the lines' legend entries, in the run's line order
    any_points = any_floor = any_fit = False
    for i, line in enumerate(lines):
        color = f"C{i % 10}"
        mine = sorted((r for r in records if r.line == line), key=xpos)
        ok = [r for r in mine if r.ok and r.metric(metric) is not None]
        fit = fits.get(line)
        label = tex_safe(f"{line}: {fit_text(fit, spec.x, regime=False, metric=metric)}" if fit else line)
        if ok:
            any_points = True
            xs, ys = [xpos(r) for r in ok], [r.metric(metric) / view.scale for r in ok]
            err = _ci_errors(ok, ys) if metric == "median_ms" else None
            entries.append((ax.errorbar(xs, ys, yerr=err, color=color, marker="o", ms=4.5, capsize=2 if err else 0,
                                        lw=1.2, label=label, gid=f"points-{i}"), label))
            if fit is not None:
                any_fit = True
                floor = [(x, y) for x, y in zip(xs, ys) if x < fit.x_min]
                any_floor = any_floor or bool(floor)
                _draw_fit(ax, fit, view.scale, color, i)
                if floor:
                    ax.plot([p[0] for p in floor], [p[1] for p in floor], ls="", marker="o", ms=7, mfc="white",
                            mec=color, mew=1.5, zorder=4, gid=f"floor-{i}")
        else:  # keep the line in the legend even when none of its cases produced a number
            entries.append((ax.plot([], [], color=color, marker="o", ms=4.5, lw=1.2, label=label)[0], label))
        for status, (marker, _, height) in ERROR_MARKS.items():
            bad = [xpos(r) for r in mine if _mark(r) == status]
            if bad:
                seen_status[status] = None
                ax.scatter(bad, [height] * len(bad), marker=marker, s=60, color=color, linewidths=2,
                           transform=top_edge, clip_on=False, zorder=5, gid=f"status-{status}")
    _axes(ax, records, spec, categories, any_points, xpos)
    ax.set_ylabel(tex_safe(view.label))
    ax.set_title(tex_safe(title or f"{view.name} vs {spec.x or 'line'}"), fontsize=10)
    _legend(fig, entries, seen_status, any_fit, any_floor, spec)
    if not records:
        ax.text(0.5, 0.5, "no cases stored", transform=ax.transAxes, ha="center", va="center")
    return fig


def _category(r: CaseRecord, spec: PlotSpec) -> str:
    return str(r.value(spec.x)) if spec.x else r.line


def _mark(r: CaseRecord) -> str | None:
    """The error mark of a case that produced no number (an unknown status counts as an error)."""
    if r.ok:
        return None
    return r.status if r.status in ERROR_MARKS else "error"


def _ci_errors(ok: list[CaseRecord], ys: list[float]) -> list[list[float]] | None:
    lows, highs = [r.metric("ci_low_ms") for r in ok], [r.metric("ci_high_ms") for r in ok]
    if any(v is None for v in lows + highs):
        return None
    return [[max(y - lo, 0.0) for y, lo in zip(ys, lows)], [max(hi - y, 0.0) for y, hi in zip(ys, highs)]]


def _draw_fit(ax: Axes, fit: ScalingFit | AffineFit, scale: float, color: str, i: int) -> None:
    """The fitted power law over the scaling regime only (an affine fit, floor + slope·x, over all its points):
    a broad translucent band under the points."""
    n = 24
    lo, hi = math.log(fit.x_min), math.log(fit.x_max)
    xs = [math.exp(lo + (hi - lo) * j / (n - 1)) for j in range(n)]
    if isinstance(fit, AffineFit):
        ys = [(fit.base + fit.slope * x) / scale for x in xs]
    else:
        ys = [math.exp(fit.fit.intercept) * x ** fit.exponent / scale for x in xs]
    ax.plot(xs, ys, color=color, lw=5, alpha=0.22, solid_capstyle="round", zorder=1, gid=f"fit-{i}")


def _axes(ax: Axes, records: Sequence[CaseRecord], spec: PlotSpec, categories: list[str], any_points: bool,
          xpos: Any) -> None:
    ticks = sorted({xpos(r) for r in records})
    if spec.x_log:
        set_log(ax, "x")
        if ticks and len(ticks) <= 12:
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
    if spec.numeric and ticks:  # the error marks are not in the data limits: make room for every x
        lo, hi = ticks[0], ticks[-1]
        if spec.x_log:
            pad = (hi / lo) ** 0.05 if hi > lo else 2.0
            ax.set_xlim(lo / pad, hi * pad)
        else:
            pad = 0.05 * (hi - lo) if hi > lo else max(abs(lo) * 0.1, 1.0)
            ax.set_xlim(lo - pad, hi + pad)
    if categories:
        ax.set_xticks(range(len(categories)), [tex_safe(c) for c in categories],
                      rotation=20 if sum(map(len, categories)) > 60 else 0, ha="right" if
                      sum(map(len, categories)) > 60 else "center")
        ax.set_xlim(-0.5, len(categories) - 0.5)
    if spec.y_log and any_points:
        set_log(ax, "y")
    ax.set_xlabel(tex_safe(spec.x or "line"))
    ax.grid(True, which="major", alpha=0.3)


def _legend(fig: Figure, entries: list[tuple[Any, str]], seen_status: Mapping[str, None], any_fit: bool,
            any_floor: bool, spec: PlotSpec) -> None:
    """Below the axes: the lines (with their fits), then what the fit band, hollow points and marks mean."""
    handles, labels = [h for h, _ in entries], [lbl for _, lbl in entries]
    if any_fit:
        handles.append(Line2D([], [], color="0.5", lw=5, alpha=0.3))
        labels.append("fitted power law, over the scaling regime")
    if any_floor:
        handles.append(Line2D([], [], ls="", marker="o", ms=7, mfc="white", mec="0.4", mew=1.5))
        labels.append("floor: below the regime, not fitted")
    for status in seen_status:
        marker, mark_color, _ = ERROR_MARKS[status]
        handles.append(Line2D([], [], ls="", marker=marker, color=mark_color, ms=7, mew=2))
        labels.append(status)
    if not handles:
        return
    longest = max(len(lbl) for lbl in labels)
    ncols = 2 if len(handles) > 3 and longest <= 44 else 1
    title = f"line: {symbol(spec.x)}^exponent [95% CI] over the scaling regime" if any_fit else None
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=7, title=title,
               title_fontsize=7, frameon=False)


_SVG_START = re.compile(r"<svg\b")
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_XMLNS = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')


def figure_svg(fig: Figure) -> str:
    """The figure as inline SVG text for an HTML page.

    Text stays text (``svg.fonttype = none``: a generic font family, no embedded or linked fonts).
    The XML header, DOCTYPE, comment, RDF metadata and namespace declarations are stripped: inline
    SVG in HTML needs none of them, and they are the only URLs matplotlib writes.
    """
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "sans-serif"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    start = _SVG_START.search(text)
    text = text[start.start():] if start else text
    text = _METADATA.sub("", text, count=1)
    head_end = text.index(">") + 1
    return _XMLNS.sub("", text[:head_end]) + text[head_end:].rstrip() + "\n"
