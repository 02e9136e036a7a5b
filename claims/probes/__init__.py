"""Probes: each turns suite runs, experiments or direct computations into the named figures its claims'
rules test. ``@probe(name, figures=...)`` registers one and declares the figures it can produce."""
from __future__ import annotations

import importlib
import math
from typing import Any, Callable

from harness.claims.evidence import Context
from harness.claims.model import Chart, Evidence, Figure, mean_ci
from harness.stats import fit_loglog

ProbeFn = Callable[[Context], Evidence]
PROBES: dict[str, tuple[ProbeFn, tuple[str, ...]]] = {}
MODULES = ("cost", "variants", "vision", "training", "blocks")


def probe(name: str, figures: tuple[str, ...]) -> Callable[[ProbeFn], ProbeFn]:
    def deco(fn: ProbeFn) -> ProbeFn:
        if name in PROBES:
            raise ValueError(f"probe {name!r} registered twice")
        PROBES[name] = (fn, figures)
        return fn
    return deco


def load_all() -> dict[str, tuple[ProbeFn, tuple[str, ...]]]:
    for m in MODULES:
        importlib.import_module(f"{__name__}.{m}")
    return PROBES


# -- helpers over stored rows -------------------------------------------------------------
def field(row: dict[str, Any], key: str) -> Any:
    """A case's own column (arch, line), else its workload field, else config field, else None."""
    from reports.frames import value
    return row[key] if key in ("arch", "line") else value(row, key)


def select(rows: list[dict[str, Any]], **conds: Any) -> list[dict[str, Any]]:
    """The ok rows whose workload/config fields equal ``conds``."""
    return [r for r in rows if r["status"] == "ok" and all(field(r, k) == v for k, v in conds.items())]


def exponent(rows: list[dict[str, Any]], x: str, metric: str, top: int | None = None, unit: str = "",
             span: float | None = None) -> Figure:
    """The log-log exponent of ``metric`` vs ``x`` with its 95% interval: over the ``top`` largest x if
    given, or over x ≥ max(x)/``span`` (the asymptotic end, where fixed per-call costs no longer count)."""
    pts = sorted((field(r, x), r["metrics"][metric]) for r in rows if metric in r["metrics"])
    if top:
        pts = pts[-top:]
    if span and pts:
        pts = [p for p in pts if p[0] * span >= pts[-1][0]]
    fit = fit_loglog([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 2 else None
    if fit is None:
        return Figure(float("nan"), note=f"fewer than 2 points of {metric}")
    span = f"{x} {pts[0][0]}…{pts[-1][0]}, {len(pts)} points"
    lo, hi = (None, None) if math.isnan(fit.ci_low) else (fit.ci_low, fit.ci_high)
    return Figure(fit.exponent, lo, hi, unit, f"log-log fit of {metric} over {span}", len(pts))


def at(rows: list[dict[str, Any]], metric: str, **conds: Any) -> float | None:
    hits = select(rows, **conds)
    return hits[0]["metrics"].get(metric) if hits else None


def ratio_figure(num: float | None, den: float | None, unit: str = "×", note: str = "") -> Figure:
    if num is None or den is None or den == 0:
        return Figure(float("nan"), unit=unit, note=note or "missing a case")
    return Figure(num / den, unit=unit, note=note)


def median_ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, note: str = "") -> Figure:
    """median(a)/median(b) latency with a bootstrap 95% interval from the raw samples."""
    from harness.stats import compare
    if not a or not b or not a.get("samples_s") or not b.get("samples_s"):
        return Figure(float("nan"), unit="×", note="missing a case")
    c = compare(b["samples_s"], a["samples_s"])     # ratio = median(a)/median(b)
    return Figure(c["ratio"], c["ci_low"], c["ci_high"], "×", note)


def series(rows: list[dict[str, Any]], x: str, metric: str, scale: float = 1.0
           ) -> dict[str, list[tuple[Any, float, None, None]]]:
    """Per line, (x, metric·scale) points of the ok rows, for a chart."""
    out: dict[str, list[tuple[Any, float, None, None]]] = {}
    for r in rows:
        if r["status"] == "ok" and metric in r["metrics"]:
            out.setdefault(r["line"], []).append((field(r, x), r["metrics"][metric] * scale, None, None))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def mean_chart(series: dict[str, dict[Any, list[float | None]]], title: str, x: str, y: str,
               x_log: bool = False, y_log: bool = False) -> Chart:
    """A chart of per-seed values: per line, per x, the mean with its 95% interval (x with no finite value
    left out)."""
    out = {}
    for name, by_x in series.items():
        pts = []
        for k, vals in sorted(by_x.items(), key=lambda kv: float(kv[0])):
            f = mean_ci(vals or [])
            if f.value == f.value:
                pts.append((float(k), f.value, f.lo, f.hi))
        out[name] = pts
    return Chart(title, x, y, out, x_log=x_log, y_log=y_log)


def analytic_params(preset: str, **overrides: Any) -> int:
    """A preset's exact parameter count from its architecture's cost function (no model is built)."""
    from harness.registry import resolve
    from harness.spec import Workload
    spec = resolve(preset, **overrides)
    return int(spec.cost(spec.config, Workload(seq_len=1))["params"])
