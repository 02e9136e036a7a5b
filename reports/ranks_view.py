"""The view of cases across ranks (workload ``parallel`` set: harness.engine.ranks): a table per case — the step's
time and each rank's median, tokens/s in total and per rank (a generation's output tokens/s), each rank's memory by
kind (the largest rank's and every rank's peak, never a sum), the bytes a rank sends per step (counted, and derived
beside them) and the correctness check (gradients under DDP and FSDP, logits under TP) — and a figure of tokens/s
and per-rank peak memory against the world size. Reads stored records only (no torch)."""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from harness.contract.records import CaseRecord
from reports.frames import is_number
from reports.labels import case_labels

MiB = 1024 * 1024
KINDS: tuple[tuple[str, str], ...] = (("weights", "weight_bytes"), ("gradients", "grad_bytes"),
                                      ("optimizer state", "optimizer_state_bytes"), ("activations", "activation_bytes"))
"""A rank's memory by kind, as the table shows it: (header, the per-rank metric's suffix)."""


def is_ranked(r: CaseRecord) -> bool:
    """A case across ranks (its workload names a ``parallel`` split)."""
    return r.workload.get("parallel", "none") != "none"


def ranked_records(records: Sequence[CaseRecord]) -> list[CaseRecord]:
    """The ok cases across ranks."""
    return [r for r in records if is_ranked(r) and r.status == "ok"]


def world(r: CaseRecord) -> int:
    return int(r.workload.get("world_size", 1))


def _m(r: CaseRecord, name: str) -> float | None:
    v = r.metric(name)
    return float(v) if is_number(v) else None


def _fmt(v: float | None, scale: float = 1.0, fmt: str = "{:,.1f}") -> str:
    return "–" if v is None else fmt.format(v / scale)


def _per_rank(r: CaseRecord, suffix: str, scale: float, fmt: str) -> str:
    """Every rank's figure, in rank order ("a / b / …")."""
    return " / ".join(_fmt(_m(r, f"rank{i}_{suffix}"), scale, fmt) for i in range(world(r)))


def _largest(r: CaseRecord, suffix: str) -> float | None:
    """The largest rank's figure (None where no rank has it)."""
    values = [v for i in range(world(r)) if (v := _m(r, f"rank{i}_{suffix}")) is not None]
    return max(values) if values else None


RATES: dict[str, str] = {"tokens_per_s": "tokens/s", "output_tokens_per_s": "output tokens/s",
                         "samples_per_s": "samples/s"}
"""The rate a row shows, the first a case has: metric -> its unit."""
CHECKS: tuple[tuple[str, str], ...] = (("grad_max_rel_err", "gradients"), ("logit_max_rel_err", "logits"))


def _check(r: CaseRecord) -> str:
    """What the case checked against one process, and the largest relative difference ("–" where none)."""
    return next((f"{what} {v:.1e}" for name, what in CHECKS if (v := _m(r, name)) is not None), "–")


def rank_rows(records: Sequence[CaseRecord]) -> list[dict[str, str]]:
    """One row per case across ranks (see the module docstring)."""
    recs = ranked_records(records)
    rows = []
    for r, label in zip(recs, case_labels(recs, "world_size")):
        rate = next((n for n in RATES if _m(r, n) is not None), "samples_per_s")
        rows.append({
            "case": label, "parallel": str(r.workload.get("parallel")), "ranks": str(world(r)),
            "median": _fmt(_m(r, "median_ms"), 1.0, "{:,.1f}"),
            "rank_medians": _per_rank(r, "median_ms", 1.0, "{:,.1f}"),
            "unit": RATES[rate],
            "rate": _fmt(_m(r, rate), 1.0, "{:,.3g}"), "rate_per_rank": _fmt(_m(r, f"{rate}_per_rank"), 1.0, "{:,.3g}"),
            **{header: _fmt(_largest(r, suffix), MiB) for header, suffix in KINDS},
            "peaks": _per_rank(r, "peak_bytes", MiB, "{:,.1f}"),
            "comm": _fmt(_m(r, "comm_counted_bytes_per_rank"), MiB, "{:,.3f}"),
            "comm_derived": _fmt(_m(r, "comm_bytes_per_rank"), MiB, "{:,.3f}"),
            "comm_share": _fmt(_m(r, "comm_share"), 0.01, "{:.0f} %"),
            "check": _check(r),
        })
    return rows


def scaling_figure(records: Sequence[CaseRecord]) -> Figure | None:
    """Tokens/s (a generation's output tokens/s; samples/s without tokens) in total and per rank, and the largest rank's peak memory, against the
    world size: one series per line. None without cases across ranks."""
    recs = ranked_records(records)
    if not recs:
        return None
    fig = Figure(figsize=(10, 4))
    rate_ax, mem_ax = fig.subplots(1, 2)
    series: dict[str, list[CaseRecord]] = {}
    for r in recs:
        series.setdefault(r.line, []).append(r)
    for line, rs in sorted(series.items()):
        rs = sorted(rs, key=world)
        xs = [world(r) for r in rs]
        total = [next((v for n in RATES if (v := _m(r, n)) is not None), None) for r in rs]
        each = [next((v for n in RATES if (v := _m(r, f"{n}_per_rank")) is not None), None) for r in rs]
        (mark,) = rate_ax.plot(xs, total, "o-", label=f"{line} (all ranks)")
        rate_ax.plot(xs, each, "o--", color=mark.get_color(), label=f"{line} (per rank)")
        mem_ax.plot(xs, [(_m(r, "peak_bytes") or float("nan")) / MiB for r in rs], "o-", label=line)
    rate_ax.set(xlabel="world size (ranks)", ylabel="tokens/s (generation: output; samples/s without tokens)",
                title="throughput against world size")
    mem_ax.set(xlabel="world size (ranks)", ylabel="MiB (the largest rank's peak)", title="per-rank peak memory")
    for ax in (rate_ax, mem_ax):
        ax.set_xticks(sorted({world(r) for r in recs}))
    rate_ax.legend(fontsize=7)
    mem_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
