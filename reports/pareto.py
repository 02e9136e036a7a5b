"""The Pareto frontier of accuracy against cost: a pure computation on points (no plotting, no records).

A model is *dominated* when another is at least as accurate and at least as cheap, and strictly better in one;
the frontier is the rest. Shared by the report's frontier view (:mod:`reports.frontier`) and the claims that read
the trade-off (C28, :mod:`claims.probes.vision`), which may not import the report's plotting modules.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    """One model: its name, accuracy (higher is better) and cost."""

    name: str
    accuracy: float
    cost: float


@dataclass(frozen=True)
class Frontier:
    """The Pareto frontier (sorted by cost, best first) and each dominated model with the model named as
    dominating it (the most accurate model that dominates it; ties: the cheaper)."""

    front: tuple[Point, ...]
    dominated: dict[str, Point] = field(default_factory=dict)


def dominates(a: Point, b: Point, lower_is_better: bool = True) -> bool:
    """Whether ``a`` is at least as accurate and at least as cheap as ``b``, and strictly better in one."""
    cheaper_or_same = a.cost <= b.cost if lower_is_better else a.cost >= b.cost
    strictly = a.accuracy > b.accuracy or (a.cost < b.cost if lower_is_better else a.cost > b.cost)
    return a.accuracy >= b.accuracy and cheaper_or_same and strictly


def pareto(points: Sequence[Point], lower_is_better: bool = True) -> Frontier:
    """The frontier of ``points`` (O(n²): a zoo has tens of models). Points with equal accuracy and cost do not
    dominate each other: both stay on the frontier."""
    dominated: dict[str, Point] = {}
    for p in points:
        better = [q for q in points if q is not p and dominates(q, p, lower_is_better)]
        if better:
            dominated[p.name] = max(better, key=lambda q: (q.accuracy, -q.cost if lower_is_better else q.cost))
    front = sorted((p for p in points if p.name not in dominated), key=lambda p: p.cost,
                   reverse=not lower_is_better)
    return Frontier(tuple(front), dominated)
