"""Which metrics the gate compares and how: exact (deterministic) or within a tolerance; a metric that moved
is a :class:`MetricFinding` (pure, torch-free)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from harness.contract.records import CaseRecord
from harness.contract.metrics import GATE_EQUAL

DETERMINISTIC: tuple[str, ...] = GATE_EQUAL
"""Metrics compared exactly (with the torch version unchanged), plus every metric named ``analytic_*``."""
ANALYTIC_PREFIX = "analytic_"

CUDA_PEAK_METRICS = ("peak_bytes", "activation_peak_bytes")
CUDA_PEAK_TOLERANCE = 0.10
"""On CUDA cases the peaks in :data:`CUDA_PEAK_METRICS` come from the caching allocator: relative tolerance."""

TOLERANT: dict[str, float] = {"rss_hwm_bytes": 0.50, "cuda_reserved_bytes": 0.10, "cuda_max_reserved_bytes": 0.10,
                              "cuda_max_allocated_bytes": 0.10}
"""Metrics that vary from run to run, each with the relative change that counts (``|new/old - 1| > tol``). RSS is
the worker's whole resident set — torch's libraries and the allocator's arenas besides the tensors — and moved
from 0.81 to 1.16 GB (+43 %) between runs of the same small suite on one machine, so only a change beyond 50 %
counts (a leak, not noise); the exact tensor peak (``peak_bytes``) is the memory gate."""


def is_deterministic(metric: str) -> bool:
    return metric in DETERMINISTIC or metric.startswith(ANALYTIC_PREFIX)


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_split(r: CaseRecord) -> tuple[dict[str, float], dict[str, float]]:
    """A record's deterministic and tolerant metrics (finite ones), as a baseline stores them."""
    det = {k: float(v) for k, v in r.metrics.items() if is_deterministic(k) and finite(v)}
    tol = {k: float(v) for k, v in r.metrics.items() if k in TOLERANT and finite(v)}
    return det, tol


def _fmt_value(v: float, other: float) -> str:
    """``v`` with as few significant digits (3 at least) as tell it from ``other``: ``4.09e9``, ``1234``."""
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    for digits in range(3, 17):
        a, b = f"{v:.{digits}g}", f"{other:.{digits}g}"
        if a != b or digits == 16:
            break
    if "e" in a:
        mant, exp = a.split("e")
        a = f"{mant}e{int(exp)}"
    return a


@dataclass(frozen=True)
class MetricFinding:
    """A metric that moved: exact ones (``tolerance`` 0) by any amount, tolerant ones beyond their tolerance.
    ``gated``: it fails the case (False: only a warning, e.g. another torch version)."""

    metric: str
    old: float
    new: float
    tolerance: float
    gated: bool

    @property
    def rel_change(self) -> float | None:
        return self.new / self.old - 1.0 if self.old else None

    @property
    def text(self) -> str:
        """``macs 4.09e9 → 4.5e9 (+10.0%)``."""
        rel = self.rel_change
        change = f"{100 * rel:+.1f}%" if rel is not None else "from 0"
        tol = f", tolerance {100 * self.tolerance:.0f}%" if self.tolerance else ""
        return f"{self.metric} {_fmt_value(self.old, self.new)} → {_fmt_value(self.new, self.old)} ({change}{tol})"


def _on_cuda(workload: Mapping[str, Any]) -> bool:
    return str(workload.get("device", "cpu")).startswith("cuda")


class StoredMetrics(Protocol):
    """What the gate compares a case against (a :class:`reports.check.baseline.BaselineCase`)."""

    @property
    def status(self) -> str: ...
    @property
    def workload(self) -> Mapping[str, Any]: ...
    @property
    def deterministic(self) -> Mapping[str, float]: ...
    @property
    def tolerant(self) -> Mapping[str, float]: ...


def metric_findings(base: StoredMetrics, cand: CaseRecord, *, exact_gated: bool,
                    tolerant_gated: bool) -> tuple[list[MetricFinding], list[str]]:
    """The deterministic and tolerant metrics of a case that moved, and notes on metrics only one side has."""
    det, tol = metric_split(cand)
    cuda = _on_cuda(cand.workload) or _on_cuda(base.workload)
    found, notes = [], []
    for name in sorted(base.deterministic.keys() | det.keys()):
        old, new = base.deterministic.get(name), det.get(name)
        if old is None or new is None:
            if cand.ok and base.status == "ok":
                notes.append(f"{name} {'only in the baseline' if new is None else 'new'}")
            continue
        if cuda and name in CUDA_PEAK_METRICS:
            if abs(new - old) > CUDA_PEAK_TOLERANCE * abs(old):
                found.append(MetricFinding(name, old, new, CUDA_PEAK_TOLERANCE, tolerant_gated))
        elif new != old:
            found.append(MetricFinding(name, old, new, 0.0, exact_gated))
    for name in sorted(base.tolerant.keys() & tol.keys()):
        old, new = base.tolerant[name], tol[name]
        if abs(new - old) > TOLERANT[name] * abs(old):
            found.append(MetricFinding(name, old, new, TOLERANT[name], tolerant_gated))
    return found, notes
