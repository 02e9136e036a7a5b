"""The skeleton every claims experiment runs through, written once.

An experiment is an :class:`Experiment`: its claim, its QUICK/FULL presets (frozen dataclasses) and a
``measure(setup, seeds)`` that returns its result fields and its scale fields. :meth:`Experiment.run`
picks the preset, times the whole run and assembles the record every experiment returns::

    {"claim", "setup", "seeds", **fields, "scale": {**scale, "wall_seconds"}}

:func:`sweep` runs one trial per variant × seed and gives, per variant, each measured value as a list
over seeds (:func:`per_seed`), the shape the probes turn into means with 95% intervals.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

Seeds = tuple[int, ...]
S = TypeVar("S")
V = TypeVar("V")

Fields = dict[str, Any]


@dataclass(frozen=True)
class Experiment(Generic[S]):
    """One claims experiment as data: what it decides, its presets, and what it measures."""

    claim: str
    quick: S
    full: S
    measure: Callable[[S, Seeds], tuple[Fields, Fields]]      # (setup, seeds) -> (result fields, scale)

    def run(self, quick: bool = True, seeds: Iterable[int] = (0, 1, 2), setup: S | None = None) -> Fields:
        """The experiment at ``setup`` (default: the QUICK or FULL preset) over ``seeds``, as JSON-safe data."""
        setup = setup if setup is not None else self.quick if quick else self.full
        seeds = tuple(int(s) for s in seeds)
        if not seeds:
            raise ValueError("an experiment needs at least one seed")
        t0 = time.perf_counter()
        fields, scale = self.measure(setup, seeds)
        return {"claim": self.claim, "setup": asdict(setup), "seeds": list(seeds), **fields,
                "scale": {**scale, "wall_seconds": time.perf_counter() - t0}}


def per_seed(records: list[Fields]) -> Fields:
    """Per-seed records (one dict per seed, the same keys) as one dict of lists over seeds; nested dicts
    are transposed the same way, any other value (a loss curve, None) becomes one list entry."""
    first = records[0]
    return {key: per_seed([r[key] for r in records]) if isinstance(first[key], dict) else [r[key] for r in records]
            for key in first}


def sweep(variants: Mapping[str, V], seeds: Seeds, trial: Callable[[V, int], Fields]) -> dict[str, Fields]:
    """``trial(variant, seed)`` for every variant and seed; per variant name, :func:`per_seed` of its trials."""
    return {name: per_seed([trial(variant, seed) for seed in seeds]) for name, variant in variants.items()}


def timed(fn: Callable[..., V], *args: Any) -> tuple[V, float]:
    """``fn(*args)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def finite_or_none(x: float) -> float | None:
    """JSON has no inf/NaN: non-finite values are reported as None."""
    return x if math.isfinite(x) else None


def relative(a: float, b: float) -> float:
    """a / b − 1 (NaN when b is 0)."""
    return a / b - 1 if b else float("nan")
