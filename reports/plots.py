"""Matplotlib figures of a run (one line per suite line, fitted exponents in the legend; a roofline) and inline SVG.

Figures are built as ``matplotlib.figure.Figure`` objects directly — never through pyplot — so no
interactive backend, GUI or global figure registry is involved; SVG is written by matplotlib's own
non-interactive svg backend (``Agg`` is selected as the default backend for anything else).
"""
from __future__ import annotations

import io
import math
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")  # non-interactive; harmless if already selected
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from harness.stats import fit_loglog  # noqa: E402
from reports.frames import peak_bandwidth, peak_flops, roofline_point, sweep_axis, value  # noqa: E402

MiB = 1024 * 1024

Y_ALIASES = {"latency": "median_ms", "latency_ms": "median_ms", "memory": "peak_bytes", "peak_memory": "peak_bytes",
             "flops": "flops", "macs": "macs", "params": "params"}
"""Plot-spec ``y`` names that stand for a stored metric."""

ERROR_MARKS = {  # status -> (marker, colour, height in axes fraction)
    "oom": ("v", "#c0392b", 0.97),
    "timeout": ("s", "#d68910", 0.93),
    "error": ("X", "#7b241c", 0.89),
    "skipped": ("x", "#7f8c8d", 0.85),
}
"""How a case that produced no number is drawn: a mark at its x, on the top edge of the axes."""


def resolve_plot_spec(spec: dict[str, Any] | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A complete plot spec: the suite's ``plot`` table, filled with the sweep axis and ``median_ms``."""
    spec = dict(spec or {})
    x = sweep_axis(rows, spec.get("x"))
    y = Y_ALIASES.get(spec.get("y") or "median_ms", spec.get("y") or "median_ms")
    numeric = bool(rows) and x is not None and all(_is_num(value(r, x)) for r in rows)
    return {"x": x, "y": y,
            "x_log": bool(spec.get("x_log", numeric)) and numeric,
            "y_log": bool(spec.get("y_log", True)),
            "title": spec.get("title")}


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _tex_safe(text: str) -> str:
    """Matplotlib treats ``$...$`` as math; labels come from suites and must show verbatim."""
    return str(text).replace("$", r"\$")


def _fit_label(line: str, pts: list[tuple[float, float]]) -> str:
    fit = fit_loglog([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 2 else None
    if fit is None:
        return _tex_safe(line)
    if math.isnan(fit.ci_low):
        return f"{_tex_safe(line)}  (k = {fit.exponent:.2f})"
    return f"{_tex_safe(line)}  (k = {fit.exponent:.2f}, 95% CI [{fit.ci_low:.2f}, {fit.ci_high:.2f}])"


def suite_figure(rows: list[dict[str, Any]], plot_spec: dict[str, Any] | None = None) -> Figure:
    """``y`` vs ``x`` with one line per suite line; log-log where the spec says.

    Each legend entry carries the line's fitted log-log exponent ``k`` (``y ~ x**k``, ok cases only)
    and its 95% CI. Cases without a number (oom, timeout, error, skipped) are drawn as marks at their
    x on the top edge of the axes, one legend entry per status, so a missing point is never a gap.
    The error marks carry the SVG id ``status-<status>``.
    """
    spec = resolve_plot_spec(plot_spec, rows)
    x_key, y_key = spec["x"], spec["y"]
    scale, y_label = (MiB, f"{y_key} (MiB)") if y_key.endswith("_bytes") else (1.0, y_key)
    numeric_x = bool(rows) and x_key is not None and all(_is_num(value(r, x_key)) for r in rows)
    if numeric_x:
        def xpos(r: dict[str, Any]) -> float:
            return float(value(r, x_key))
        categories: list[str] = []
    else:  # categorical (or no) sweep axis: positions 0..n-1 labelled with the values
        categories = list(dict.fromkeys(str(value(r, x_key)) if x_key else r["case_key"][:8] for r in rows))

        def xpos(r: dict[str, Any]) -> float:
            return float(categories.index(str(value(r, x_key)) if x_key else r["case_key"][:8]))

    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    top_edge = blended_transform_factory(ax.transData, ax.transAxes)
    seen_status: dict[str, None] = {}
    any_points = False
    for i, line in enumerate(dict.fromkeys(r["line"] for r in rows)):
        color = f"C{i % 10}"
        mine = sorted((r for r in rows if r["line"] == line), key=xpos)
        ok = [r for r in mine if r["status"] == "ok" and _is_num(r["metrics"].get(y_key))]
        pts = [(xpos(r), r["metrics"][y_key] / scale) for r in ok]
        fit_pts = [(float(value(r, x_key)), r["metrics"][y_key]) for r in ok] if numeric_x else []
        if pts:
            any_points = True
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            if y_key == "median_ms" and all("ci_low_ms" in r["metrics"] for r in ok):
                err = [[max(y - r["metrics"]["ci_low_ms"], 0.0) for y, r in zip(ys, ok)],
                       [max(r["metrics"]["ci_high_ms"] - y, 0.0) for y, r in zip(ys, ok)]]
                ax.errorbar(xs, ys, yerr=err, color=color, marker="o", ms=4, capsize=2, lw=1.5,
                            label=_fit_label(line, fit_pts))
            else:
                ax.plot(xs, ys, color=color, marker="o", ms=4, lw=1.5, label=_fit_label(line, fit_pts))
        else:  # keep the line in the legend even when none of its cases produced a number
            ax.plot([], [], color=color, marker="o", ms=4, lw=1.5, label=_tex_safe(line))
        for status, (marker, _, height) in ERROR_MARKS.items():
            bad = [xpos(r) for r in mine if r["status"] == status
                   or (status == "error" and r["status"] not in ERROR_MARKS and r["status"] != "ok")]
            if bad:
                seen_status[status] = None
                ax.scatter(bad, [height] * len(bad), marker=marker, s=60, color=color, linewidths=2,
                           transform=top_edge, clip_on=False, zorder=5, gid=f"status-{status}")
    ticks = sorted({xpos(r) for r in rows})
    if spec["x_log"]:
        ax.set_xscale("log")
        if ticks and len(ticks) <= 12:
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
    if numeric_x and ticks:  # the error marks are not in the data limits: make room for every x
        lo, hi = ticks[0], ticks[-1]
        if spec["x_log"]:
            pad = (hi / lo) ** 0.05 if hi > lo else 2.0
            ax.set_xlim(lo / pad, hi * pad)
        else:
            pad = 0.05 * (hi - lo) if hi > lo else max(abs(lo) * 0.1, 1.0)
            ax.set_xlim(lo - pad, hi + pad)
    if categories:
        ax.set_xticks(range(len(categories)), [_tex_safe(c) for c in categories])
        ax.set_xlim(-0.5, len(categories) - 0.5)
    if spec["y_log"] and any_points:
        ax.set_yscale("log")
    ax.set_xlabel(_tex_safe(x_key or "case"))
    ax.set_ylabel(_tex_safe(y_label))
    ax.grid(True, which="major", alpha=0.3)
    suites = sorted({r["suite"] for r in rows})
    ax.set_title(_tex_safe(spec["title"] or " / ".join(suites)), fontsize=11)
    handles, labels = ax.get_legend_handles_labels()
    for status in seen_status:
        marker, mark_color, _ = ERROR_MARKS[status]
        handles.append(Line2D([], [], ls="", marker=marker, color=mark_color, ms=7, mew=2))
        labels.append(status)
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="best", title="line (fitted log-log exponent k)",
                  title_fontsize=8)
    if not rows:
        ax.text(0.5, 0.5, "no cases stored", transform=ax.transAxes, ha="center", va="center")
    return fig


def roofline_data(rows: list[dict[str, Any]], peak: dict[str, Any] | None) -> dict[str, Any]:
    """What the roofline of a run shows, without drawing it.

    ``points``: per line, ``[(case_key, intensity FLOP/byte, achieved FLOP/s)]`` of the ok cases
    that have ``flops``, ``bytes_moved`` and ``median_ms``; ``left_out``: how many measured
    (ok) cases lack one of them; ``not_ok``: cases that did not finish ok; ``roofs``: one per
    (device, dtype) of the run's cases with a measured peak: ``{device, dtype, flops_per_s,
    bytes_per_s, ridge}`` (``bytes_per_s`` / ``ridge`` None when the bandwidth is missing).
    """
    points: dict[str, list[tuple[str, float, float]]] = {}
    left_out = 0
    pairs: dict[tuple[str, str], None] = {}
    for r in rows:
        pairs[(str(r["workload"].get("device", "cpu")), str(r["workload"].get("dtype", "fp32")))] = None
        if r["status"] != "ok":
            continue
        pt = roofline_point(r)
        if pt is None:
            left_out += 1
            continue
        points.setdefault(r["line"], []).append((r["case_key"], pt[0], pt[1]))
    roofs = []
    for device, dtype in pairs:
        top = peak_flops(peak, device, dtype)
        if not top:
            continue
        bw = peak_bandwidth(peak, device)
        roofs.append({"device": device, "dtype": dtype, "flops_per_s": top, "bytes_per_s": bw,
                      "ridge": top / bw if bw else None})
    return {"points": points, "left_out": left_out, "not_ok": sum(r["status"] != "ok" for r in rows),
            "n_points": sum(len(v) for v in points.values()), "roofs": roofs}


def roofline_figure(rows: list[dict[str, Any]], peak: dict[str, Any] | None,
                    data: dict[str, Any] | None = None) -> Figure:
    """Log-log roofline of one run: x = arithmetic intensity (counted ``flops`` / ``bytes_moved``,
    FLOP/byte), y = achieved FLOP/s (``flops`` / median time), one marker per measured case coloured
    by suite line; the machine's measured roofs from ``peak`` (a run's ``options["peak"]``): the
    matmul peak of the cases' dtype (horizontal, SVG id ``roof-compute-<dtype>``), the copy bandwidth
    slope ``y = bandwidth · x`` (``roof-memory-<dtype>``) and their ridge point (``ridge-<dtype>``).
    Ok cases without the metrics are left out and counted in a note; never raises on missing data.
    ``data``: :func:`roofline_data` of the same rows and peak, when the caller already has it.
    """
    data = data or roofline_data(rows, peak)
    fig = Figure(figsize=(9.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    xs_all = [p[1] for pts in data["points"].values() for p in pts]
    ys_all = [p[2] for pts in data["points"].values() for p in pts]
    for i, line in enumerate(dict.fromkeys(r["line"] for r in rows)):
        pts = data["points"].get(line)
        if not pts:
            continue
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], color=f"C{i % 10}", s=28, zorder=4,
                   marker="os^vDP"[(i // 10) % 6], label=_tex_safe(line), gid=f"points-{i}")
    ridges = [r["ridge"] for r in data["roofs"] if r["ridge"]]
    tops = [r["flops_per_s"] for r in data["roofs"]]
    anchors_x = xs_all + ridges
    if anchors_x:
        lo, hi = min(anchors_x) / 4, max(anchors_x) * 4
    else:
        lo, hi = 0.1, 1000.0
    styles = ["-", "--", ":", "-."]
    for j, roof in enumerate(data["roofs"]):
        ls, dt = styles[j % len(styles)], _tex_safe(roof["dtype"])
        where = f"{_tex_safe(roof['device'])} {dt}"
        top, bw, ridge = roof["flops_per_s"], roof["bytes_per_s"], roof["ridge"]
        if ridge:
            ax.plot([ridge, hi], [top, top], color="k", ls=ls, lw=1.4, gid=f"roof-compute-{roof['dtype']}",
                    label=f"matmul peak {where}: {top / 1e9:,.1f} GFLOP/s")
            ax.plot([lo, ridge], [bw * lo, top], color="0.45", ls=ls, lw=1.4, gid=f"roof-memory-{roof['dtype']}",
                    label=f"copy bandwidth {_tex_safe(roof['device'])}: {bw / 1e9:,.1f} GB/s")
            ax.plot([ridge], [top], ls="", marker="D", color="k", ms=6, zorder=5, gid=f"ridge-{roof['dtype']}",
                    label=f"ridge {ridge:,.1f} FLOP/byte")
        else:
            ax.plot([lo, hi], [top, top], color="k", ls=ls, lw=1.4, gid=f"roof-compute-{roof['dtype']}",
                    label=f"matmul peak {where}: {top / 1e9:,.1f} GFLOP/s (no bandwidth measured)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    y_vals = ys_all + tops
    if y_vals:
        ax.set_ylim(min(y_vals) / 5, max(y_vals) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte) = counted FLOPs / bytes moved")
    ax.set_ylabel("achieved FLOP/s = counted FLOPs / median time")
    ax.grid(True, which="major", alpha=0.3)
    suites = sorted({r["suite"] for r in rows})
    ax.set_title(_tex_safe("roofline" + (f" · {' / '.join(suites)}" if suites else "")), fontsize=11)
    notes = ["FLOPs = 2·MACs; bytes moved: each op reads its inputs and writes its outputs once (no cache reuse)"]
    if not data["roofs"]:
        notes.append("no measured peak stored for these cases (--no-calibrate or an older run): no roofs")
    if data["left_out"]:
        notes.append(f"{data['left_out']} ok case(s) left out: no flops, bytes_moved or median time")
    if not data["n_points"]:
        ax.text(0.5, 0.5, "no case with flops, bytes_moved and a median time", transform=ax.transAxes,
                ha="center", va="center")
    fig.text(0.01, 0.005, _tex_safe("\n".join(notes)), fontsize=7, color="0.3", ha="left", va="bottom",
             gid="roofline-note")
    fig.get_layout_engine().set(rect=(0, 0.03 * len(notes), 1, 1 - 0.03 * len(notes)))
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


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
