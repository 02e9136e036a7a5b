"""The training step's view of a run (cases of mode ``train_step``, harness.engine.training): a table of rates, FLOPs and
memory by kind, tokens/s (and MFU where the device has a published dense peak) against model size, and memory by
kind as a stacked bar per case. Reads stored records only (no torch)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from harness.contract.records import CaseRecord
from reports.frames import is_number
from reports.labels import case_labels

MiB = 1024 * 1024

# The stacked bar's parts, bottom to top: (label, metric). "activations" is what the forward leaves for the
# backward; "other" the rest of the step's peak (gradients being made, temporaries, inputs).
MEMORY_KINDS: tuple[tuple[str, str], ...] = (
    ("weights", "weight_bytes"), ("gradients", "grad_bytes"), ("optimizer state", "optimizer_state_bytes"),
    ("activations", "activation_bytes"))
KIND_COLOURS = ("#2e86c1", "#28b463", "#f39c12", "#8e44ad", "#bdc3c7")


def training_records(records: Sequence[CaseRecord]) -> list[CaseRecord]:
    """The ok cases of mode train_step in one process (a case across ranks: reports.ranks_view)."""
    return [r for r in records if r.workload.get("mode") == "train_step" and r.status == "ok"
            and r.workload.get("parallel", "none") == "none"]


def _m(r: CaseRecord, name: str) -> float | None:
    v = r.metric(name)
    return float(v) if is_number(v) else None


def _fmt(v: float | None, scale: float = 1.0, fmt: str = "{:,.1f}") -> str:
    return "–" if v is None else fmt.format(v / scale)


def memory_parts(r: CaseRecord) -> list[tuple[str, float]]:
    """The case's peak split by kind: the analytic static parts, the measured activations, and "other" (the
    measured peak less those, never below 0). Empty without a memory measurement."""
    peak = _m(r, "peak_bytes")
    if peak is None:
        return []
    parts = [(label, _m(r, metric) or 0.0) for label, metric in MEMORY_KINDS]
    return [*parts, ("other", max(0.0, peak - sum(v for _, v in parts)))]


def training_rows(records: Sequence[CaseRecord]) -> list[dict[str, str]]:
    """One row per train_step case: rates, FLOPs (counted, model, 6·N·D estimate), MFU and memory by kind."""
    rows = []
    recs = training_records(records)
    for r, label in zip(recs, case_labels(recs, "batch_size")):
        mfu = _m(r, "mfu")
        rows.append({
            "case": label, "params": _fmt(_m(r, "params"), 1e6),
            "median": _fmt(_m(r, "median_ms"), 1.0, "{:,.2f}"),
            "samples": _fmt(_m(r, "samples_per_s"), 1.0, "{:,.2f}"), "tokens": _fmt(_m(r, "tokens_per_s"), 1.0, "{:,.0f}"),
            "flops": _fmt(_m(r, "flops"), 1e9, "{:,.2f}"), "model_flops": _fmt(_m(r, "model_flops"), 1e9, "{:,.2f}"),
            "est_6nd": _fmt(_m(r, "est_6nd_flops"), 1e9, "{:,.2f}"),
            "mfu": "no published peak" if mfu is None else f"{100 * mfu:.1f} %",
            **{label: _fmt(_m(r, metric), MiB) for label, metric in MEMORY_KINDS},
            "peak": _fmt(_m(r, "peak_bytes"), MiB),
        })
    return rows


def size_figure(records: Sequence[CaseRecord]) -> Figure | None:
    """Tokens/s (samples/s for image models) against parameters, one series per batch size and sequence length;
    a second panel with MFU when any case has one. None without train_step cases."""
    recs = [r for r in training_records(records) if _m(r, "params")]
    if not recs:
        return None
    with_mfu = any(_m(r, "mfu") is not None for r in recs)
    fig = Figure(figsize=(10 if with_mfu else 6, 4))
    axes = fig.subplots(1, 2 if with_mfu else 1, squeeze=False)[0]
    series: dict[str, list[CaseRecord]] = {}
    for r in recs:
        w = r.workload
        key = (f"T={w['seq_len']}" if w.get("seq_len") else f"{w.get('img_size') or ''}² images") + \
            f", b={w.get('batch_size')}" + (f", {w['compile']}" if w.get("compile", "none") != "none" else "") + \
            (", ckpt" if w.get("checkpointing", "none") != "none" else "")
        series.setdefault(key, []).append(r)
    for key, rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: _m(r, "params") or 0)
        rate = [(_m(r, "tokens_per_s") or _m(r, "samples_per_s")) for r in rs]
        axes[0].plot([_m(r, "params") for r in rs], rate, "o-", label=key)
        if with_mfu:
            axes[1].plot([_m(r, "params") for r in rs], [100 * (_m(r, "mfu") or float("nan")) for r in rs],
                         "o-", label=key)
    axes[0].set(xscale="log", yscale="log", xlabel="parameters", ylabel="tokens/s (images/s without tokens)",
                title="training throughput against size")
    if with_mfu:
        axes[1].set(xscale="log", xlabel="parameters", ylabel="MFU (% of the dense peak)", title="MFU against size")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def memory_figure(records: Sequence[CaseRecord]) -> Figure | None:
    """Memory by kind as a stacked horizontal bar per train_step case (MiB). None without a measured case."""
    recs = [r for r in training_records(records) if memory_parts(r)]
    if not recs:
        return None
    fig = Figure(figsize=(8, 0.9 + 0.35 * len(recs)))
    ax = fig.add_subplot()
    labels = case_labels(recs, "batch_size")
    left = [0.0] * len(recs)
    names = [label for label, _ in memory_parts(recs[0])]
    for i, name in enumerate(names):
        widths = [dict(memory_parts(r))[name] / MiB for r in recs]
        ax.barh(labels, widths, left=left, color=KIND_COLOURS[i % len(KIND_COLOURS)], label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set(xlabel="MiB (the bar's length: the measured peak)")
    ax.set_title("memory by kind in a training step", pad=22)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig
