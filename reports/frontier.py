"""The accuracy-vs-cost frontier of a vision run (torch-free): quoted ImageNet top-1 against measured cost.

Accuracy is a **quoted** figure (``quoted_top1``, published with the model's weights; its source is in the
case's note, :mod:`harness.contract.quoted`), never a measurement of this harness; the cost is measured here: median
latency, counted MACs, throughput. :func:`pareto` is the pure computation (in :mod:`reports.pareto`, which the
claims may import; re-exported here) — a model is *dominated* when another is at least as accurate and at least
as cheap, and strictly better in one; the frontier is the rest.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from harness.contract.quoted import sources
from harness.contract.records import CaseRecord
from harness.contract.metrics import BY_NAME
from reports.pareto import Frontier, Point, dominates, pareto  # noqa: F401  (re-exported: the pure part)
from reports.plots import set_log, tex_safe

TOP1 = "quoted_top1"
COSTS: dict[str, tuple[str, bool, str]] = {      # metric -> (axis label, lower is better: the catalog's, short word)
    "median_ms": ("median latency (ms), measured", BY_NAME["median_ms"].better == "lower", "slower"),
    "macs": ("GMACs, counted", BY_NAME["macs"].better == "lower", "more MACs"),
    "throughput_per_s": ("throughput (images/s), measured", BY_NAME["throughput_per_s"].better == "lower",
                         "lower throughput"),
}


def _label(r: CaseRecord) -> str:
    return r.line


def frontier_records(records: Sequence[CaseRecord]) -> list[CaseRecord]:
    """The ok cases that have a quoted top-1 and a measured median."""
    return [r for r in records if r.ok and r.metric(TOP1) is not None and r.metric("median_ms") is not None]


def points(records: Sequence[CaseRecord], cost: str) -> list[Point]:
    return [Point(_label(r), r.metric(TOP1), r.metric(cost)) for r in records if r.metric(cost) is not None]


def workload_text(records: Sequence[CaseRecord]) -> str:
    """The workload the costs were measured at, e.g. "batch 1, 224 px, fp32 on cpu"."""
    if not records:
        return ""
    w = records[0].workload
    return f"batch {w.get('batch_size')}, {w.get('img_size') or 'default'} px, {w.get('dtype')} on {w.get('device')}"


def dominated_rows(records: Sequence[CaseRecord], cost: str = "median_ms") -> list[dict[str, str]]:
    """One row per dominated model: "ViT-B/16: dominated by ConvNeXt-T — slower and less accurate at batch 1 on
    cpu", with both models' quoted top-1 and measured cost."""
    recs = frontier_records(records)
    if len({(r.workload.get("batch_size"), r.workload.get("img_size"), r.workload.get("device"),
             r.workload.get("dtype")) for r in recs}) > 1:
        raise ValueError("a frontier compares models at one workload; this run's vision cases differ")
    label, lower, worse = COSTS[cost]
    f = pareto(points(recs, cost), lower)
    by = {p.name: p for p in points(recs, cost)}
    w = recs[0].workload if recs else {}
    where = f"at batch {w.get('batch_size')} on {w.get('device')}"
    rec = {_label(r): r for r in recs}
    rows = []
    for name, dom in sorted(f.dominated.items(), key=lambda kv: -by[kv[0]].accuracy):
        p = by[name]
        acc = "less accurate" if dom.accuracy > p.accuracy else "as accurate"
        cost_word = worse if (p.cost > dom.cost if lower else p.cost < dom.cost) else "as costly"
        noise = ""
        if cost == "median_ms" and not clearly_slower(rec[name], rec[dom.name]):
            noise = " (within the timing noise: the two 95% intervals overlap)"
        rows.append({"model": name, "top1": f"{p.accuracy:.2f}", "cost": f"{p.cost:,.4g}", "by": dom.name,
                     "by_top1": f"{dom.accuracy:.2f}", "by_cost": f"{dom.cost:,.4g}", "clear": not noise,
                     "sentence": f"{name}: dominated by {dom.name} — {cost_word} and {acc} {where}{noise}"})
    return rows


def clearly_slower(a: CaseRecord, b: CaseRecord) -> bool:
    """Whether ``a``'s latency is above ``b``'s beyond the noise: ``a``'s 95% interval lies wholly above ``b``'s
    (False where either interval is missing)."""
    lo, hi = a.metric("ci_low_ms"), b.metric("ci_high_ms")
    return lo is not None and hi is not None and lo > hi


def frontier_figure(records: Sequence[CaseRecord], title: str = "") -> Figure:
    """Quoted top-1 against measured latency, counted MACs and measured throughput, one panel each, every model
    a point (labelled), the frontier drawn as a step line."""
    recs = frontier_records(records)
    fig = Figure(figsize=(15, 5.2))
    axes = fig.subplots(1, 3)
    for ax, (cost, (label, lower, _)) in zip(axes, COSTS.items()):
        pts = points(recs, cost)
        if not pts:
            ax.set_axis_off()
            ax.set_title(f"{label}: not measured")
            continue
        scale = 1e9 if cost == "macs" else 1.0
        f = pareto(pts, lower)
        front = {p.name for p in f.front}
        for p in pts:
            on = p.name in front
            ax.scatter(p.cost / scale, p.accuracy, s=28 if on else 16, color="#1f618d" if on else "#aab7b8",
                       zorder=3)
            ax.annotate(tex_safe(p.name), (p.cost / scale, p.accuracy), fontsize=6.5, xytext=(3, 2),
                        textcoords="offset points", color="#17202a" if on else "#7f8c8d")
        xs = [p.cost / scale for p in f.front]
        ys = [p.accuracy for p in f.front]
        ax.step(xs, ys, where="post" if lower else "pre", color="#1f618d", lw=1.4, label="Pareto frontier")
        set_log(ax, "x")
        ax.set_xlabel(label)
        ax.set_ylabel("ImageNet-1k top-1 (%), quoted")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(tex_safe(title or f"accuracy vs cost · {workload_text(recs)} · top-1 quoted, cost measured"),
                 fontsize=10)
    fig.tight_layout()
    return fig


def quoted_sources(records: Sequence[CaseRecord]) -> list[tuple[str, str]]:
    """(model, source of its quoted top-1) for every case with one."""
    return [(r.line, sources(r.message).get(TOP1, "source not recorded")) for r in frontier_records(records)]
