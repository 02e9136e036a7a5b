"""The roofline of a run: achieved FLOP/s vs arithmetic intensity under the machine's measured roofs.

A case's FLOPs here are those its kernels executed (:func:`reports.frames.executed_flops`: the dense count
minus what fused causal attention skipped, where the record has ``executed_macs``; the dense count otherwise).
A point above its roof (achieved > min(peak, bandwidth × intensity) for its device and dtype) is never drawn
silently: it gets its own marker and is listed, because it means the peak is stale or the FLOP count is
higher than the work done (a computation the kernel skipped that the count does not know of).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from harness.contract.records import CaseRecord
from reports.frames import device_dtype, peak_bandwidth, peak_flops, roofline_point
from reports.labels import case_labels
from reports.plots import set_log, tex_safe

ABOVE_ROOF_MEANING = ("a stale calibration (the peak was measured lower than the machine reaches, e.g. under load) "
                      "or a computation the count does not know was skipped, e.g. causal attention in a case "
                      "without executed_macs: its FLOPs are then counted over all n² scores while a fused kernel "
                      "skips the masked half")
"""What a point above the roof means; the report prints it under the figure."""


@dataclass(frozen=True)
class Roof:
    """The measured roofs of one (device, dtype): matmul FLOP/s, copy bandwidth (None if not measured)."""

    device: str
    dtype: str
    flops_per_s: float
    bytes_per_s: float | None

    @property
    def ridge(self) -> float | None:
        """The intensity (FLOP/byte) where the bandwidth slope meets the compute roof."""
        return self.flops_per_s / self.bytes_per_s if self.bytes_per_s else None

    def attainable(self, intensity: float) -> float:
        """min(peak, bandwidth × intensity): the most FLOP/s a case of this intensity can reach."""
        return min(self.flops_per_s, self.bytes_per_s * intensity) if self.bytes_per_s else self.flops_per_s


@dataclass(frozen=True)
class RoofPoint:
    """One measured case on the roofline, with the roof above it (None: no peak for its device/dtype)."""

    label: str
    line: str
    intensity: float
    achieved: float
    roof: float | None = None

    @property
    def above_roof(self) -> bool:
        return self.roof is not None and self.achieved > self.roof


@dataclass(frozen=True)
class RooflineData:
    """What the roofline of a run shows, without drawing it: ``points`` per line (ok cases with ``flops``,
    ``bytes_moved`` and ``median_ms``), how many ok cases lack one of those (``left_out``), how many cases
    did not finish ok (``not_ok``) and one :class:`Roof` per (device, dtype) with a measured peak."""

    points: dict[str, list[RoofPoint]] = field(default_factory=dict)
    left_out: int = 0
    not_ok: int = 0
    roofs: list[Roof] = field(default_factory=list)

    @property
    def n_points(self) -> int:
        return sum(len(v) for v in self.points.values())

    @property
    def above_roof(self) -> list[RoofPoint]:
        """The points whose achieved FLOP/s exceeds their roof, in the run's order."""
        return [p for pts in self.points.values() for p in pts if p.above_roof]


def roofline_data(records: Sequence[CaseRecord], peak: Mapping[str, Any] | None) -> RooflineData:
    """The roofline of ``records`` under ``peak`` (a run's ``peak``: the calibrated roofs per device)."""
    labels = case_labels(records)
    roofs: dict[tuple[str, str], Roof | None] = {}
    for r in records:
        device, dtype = device_dtype(r)
        if (device, dtype) not in roofs:
            top = peak_flops(dict(peak or {}), device, dtype)
            roofs[(device, dtype)] = Roof(device, dtype, top, peak_bandwidth(dict(peak or {}), device)) if top else None
    points: dict[str, list[RoofPoint]] = {}
    left_out = 0
    for r, label in zip(records, labels):
        if not r.ok:
            continue
        pt = roofline_point(r)
        if pt is None:
            left_out += 1
            continue
        roof = roofs[device_dtype(r)]
        points.setdefault(r.line, []).append(
            RoofPoint(label, r.line, pt[0], pt[1], roof.attainable(pt[0]) if roof else None))
    return RooflineData(points, left_out, sum(not r.ok for r in records), [r for r in roofs.values() if r])


def roofline_figure(records: Sequence[CaseRecord], peak: Mapping[str, Any] | None,
                    data: RooflineData | None = None, title: str = "roofline") -> Figure:
    """Log-log roofline of one run: x = arithmetic intensity (executed FLOPs / ``bytes_moved``,
    FLOP/byte), y = achieved FLOP/s (executed FLOPs / median time), one marker per measured case coloured by
    line (SVG id ``points-<i>``), a point above its roof as a red-edged star (``above-roof-<i>``); the
    measured roofs: the matmul peak of each dtype (``roof-compute-<dtype>``), the copy bandwidth slope
    ``y = bandwidth · x`` (``roof-memory-<dtype>``) and their ridge point (``ridge-<dtype>``).
    Ok cases without the metrics are left out and counted in a note; never raises on missing data.
    ``data``: :func:`roofline_data` of the same records and peak, when the caller already has it.
    """
    data = data or roofline_data(records, peak)
    fig = Figure(figsize=(9.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    every = [p for pts in data.points.values() for p in pts]
    for i, line in enumerate(dict.fromkeys(r.line for r in records)):
        pts = data.points.get(line, [])
        under, over = [p for p in pts if not p.above_roof], [p for p in pts if p.above_roof]
        color, marker = f"C{i % 10}", "os^vDP"[(i // 10) % 6]
        if under:
            ax.scatter([p.intensity for p in under], [p.achieved for p in under], color=color, s=28, zorder=4,
                       marker=marker, label=tex_safe(line), gid=f"points-{i}")
        elif over:
            ax.scatter([], [], color=color, s=28, marker=marker, label=tex_safe(line))
        if over:
            ax.scatter([p.intensity for p in over], [p.achieved for p in over], color=color, s=150, zorder=6,
                       marker="*", edgecolors="#c0392b", linewidths=1.4, gid=f"above-roof-{i}")
    lo, hi = _x_range(every, data.roofs)
    styles = ["-", "--", ":", "-."]
    for j, roof in enumerate(data.roofs):
        ls, where = styles[j % len(styles)], tex_safe(f"{roof.device} {roof.dtype}")
        top, bw, ridge = roof.flops_per_s, roof.bytes_per_s, roof.ridge
        if bw and ridge:
            ax.plot([ridge, hi], [top, top], color="k", ls=ls, lw=1.4, gid=f"roof-compute-{roof.dtype}",
                    label=f"matmul peak {where}: {top / 1e9:,.1f} GFLOP/s")
            ax.plot([lo, ridge], [bw * lo, top], color="0.45", ls=ls, lw=1.4, gid=f"roof-memory-{roof.dtype}",
                    label=f"copy bandwidth {tex_safe(roof.device)}: {bw / 1e9:,.1f} GB/s")
            ax.plot([ridge], [top], ls="", marker="D", color="k", ms=6, zorder=5, gid=f"ridge-{roof.dtype}",
                    label=f"ridge {ridge:,.1f} FLOP/byte")
        else:
            ax.plot([lo, hi], [top, top], color="k", ls=ls, lw=1.4, gid=f"roof-compute-{roof.dtype}",
                    label=f"matmul peak {where}: {top / 1e9:,.1f} GFLOP/s (no bandwidth measured)")
    if data.above_roof:
        ax.scatter([], [], marker="*", s=150, color="white", edgecolors="#c0392b", linewidths=1.4,
                   label=f"above the roof ({len(data.above_roof)}): see the note")
    set_log(ax, "x", "y")
    ax.set_xlim(lo, hi)
    y_vals = [p.achieved for p in every] + [r.flops_per_s for r in data.roofs]
    if y_vals:
        ax.set_ylim(min(y_vals) / 5, max(y_vals) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte) = executed FLOPs / bytes moved")
    ax.set_ylabel("achieved FLOP/s = executed FLOPs / median time")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(tex_safe(title), fontsize=10)
    _notes(fig, ax, data)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _x_range(points: list[RoofPoint], roofs: list[Roof]) -> tuple[float, float]:
    anchors = [p.intensity for p in points] + [r.ridge for r in roofs if r.ridge]
    return (min(anchors) / 4, max(anchors) * 4) if anchors else (0.1, 1000.0)


def _notes(fig: Figure, ax: Any, data: RooflineData) -> None:
    notes = ["FLOPs = 2·MACs executed (causal attention's skipped half taken off where recorded); bytes moved: "
             "each op reads its inputs and writes its outputs once (no cache reuse)"]
    if not data.roofs:
        notes.append("no measured peak stored for these cases (--no-calibrate or an older run): no roofs")
    if data.left_out:
        notes.append(f"{data.left_out} ok case(s) left out: no flops, bytes_moved or median time")
    if data.above_roof:
        notes.append(f"{len(data.above_roof)} point(s) above the roof (stars): a stale calibration or a "
                     "computation the count skipped")
    if not data.n_points:
        ax.text(0.5, 0.5, "no case with flops, bytes_moved and a median time", transform=ax.transAxes,
                ha="center", va="center")
    fig.text(0.01, 0.005, tex_safe("\n".join(notes)), fontsize=7, color="0.3", ha="left", va="bottom",
             gid="roofline-note")
    fig.get_layout_engine().set(rect=(0, 0.03 * len(notes), 1, 1 - 0.03 * len(notes)))
