"""Energy in the reports (torch-free): per case the energy per call, per sample and per token beside the time,
the average power, the window and the counter's step; for a run that asked for energy (``--energy``) and got
none, the reasons the cases gave (e.g. "no energy counter on this machine") — never a 0.

The figures are :mod:`harness.instruments.energy`'s stored metrics: ``energy_j`` (per call), ``energy_per_sample_j``,
``energy_per_token_j``, ``avg_power_w``, ``energy_window_s``, ``energy_step_share`` and the independent
power-sample integral ``energy_power_integral_j`` (per call).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.records import CaseRecord

ENERGY_FIGURES = ("energy_per_sample_j", "energy_per_token_j")
"""Energy metrics drawn against the run's axis (J/image against batch, J/token against context)."""
NOT_MEASURED_PREFIX = "energy not measured: "


def asked(options: Mapping[str, Any]) -> bool:
    """Whether the run was asked to measure energy (``bench run --energy`` / ``--require-energy``)."""
    return bool(options.get("energy"))


def reasons(records: Sequence[CaseRecord]) -> list[str]:
    """The distinct reasons cases gave for having no energy figure, in order of first appearance."""
    out: dict[str, None] = {}
    for r in records:
        for part in r.message.split("; "):
            if part.startswith(NOT_MEASURED_PREFIX):
                out[part[len(NOT_MEASURED_PREFIX):].strip()] = None
    return list(out)


def _fmt(v: float | None, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def energy_rows(records: Sequence[CaseRecord], labels: Sequence[str]) -> list[dict[str, str]]:
    """One row per case that has an energy figure: J per call / sample / token, average W, the power-sample
    integral beside the counter's figure, the window and the counter step's share of the window's energy."""
    rows = []
    for r, label in zip(records, labels):
        e = r.metric("energy_j")
        if e is None:
            continue
        integral = r.metric("energy_power_integral_j")
        rows.append({"case": label, "median_ms": _fmt(r.metric("median_ms"), "{:,.3f}"),
                     "j_call": _fmt(e, "{:.4g}"), "j_sample": _fmt(r.metric("energy_per_sample_j"), "{:.4g}"),
                     "j_token": _fmt(r.metric("energy_per_token_j"), "{:.4g}"),
                     "power_w": _fmt(r.metric("avg_power_w"), "{:,.1f}"),
                     "integral": _fmt(integral, "{:.4g}") + (f" ({integral / e:.2f}×)" if integral and e else ""),
                     "window_s": _fmt(r.metric("energy_window_s"), "{:.2f}"),
                     "step_share": _fmt(r.metric("energy_step_share"), "{:.2%}")})
    return rows


def power_summary(records: Sequence[CaseRecord]) -> str:
    """The average power over the cases' energy windows: "median W (min – max W) over N cases", or ""."""
    watts = [w for r in records if (w := r.metric("avg_power_w")) is not None]
    if not watts:
        return ""
    n = len(watts)
    return (f"average power over the energy windows: median {statistics.median(watts):,.1f} W "
            f"({min(watts):,.1f} – {max(watts):,.1f} W) over {n} case{'s' if n != 1 else ''}")
