"""Quoted figures: published numbers attached to a case beside its measurements, always with their source.

A quoted figure (e.g. ImageNet-1k top-1 of a model's published weights) is *not* measured by this harness: it
goes into a case's metrics under a name starting with ``quoted_`` and its source goes into the case's note as
``"quoted_top1 = 80.858 from SOURCE"`` (one ``; ``-separated part of the message), so every view can label it
"quoted" and name where it came from. Torch-free (the reports read it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PREFIX = "quoted_"
_NOTE = re.compile(r"^(?P<metric>quoted_\w+) = (?P<value>\S+) from (?P<source>.+)$")


@dataclass(frozen=True)
class Quoted:
    """One published figure: ``metric`` (starting with ``quoted_``), its value and where it was published."""

    metric: str
    value: float
    source: str
    when: tuple[tuple[str, Any], ...] = ()   # config fields the figure holds for (e.g. num_classes = 1000)

    def __post_init__(self) -> None:
        if not self.metric.startswith(PREFIX) or not re.fullmatch(r"\w+", self.metric):
            raise ValueError(f"a quoted metric's name starts with {PREFIX!r}: {self.metric!r}")
        if not self.source or "; " in self.source:
            raise ValueError("a quoted figure needs a source (without '; ')")

    def applies(self, config: Any) -> bool:
        """Whether the figure holds for ``config``: each field of ``when`` at its value (a model overridden to
        10 classes has no ImageNet-1k top-1)."""
        return all(getattr(config, k, None) == v for k, v in self.when)

    def note(self) -> str:
        return f"{self.metric} = {self.value:g} from {self.source}"


def sources(message: str) -> dict[str, str]:
    """The quoted metrics' sources named in a case's message: ``{"quoted_top1": SOURCE, ...}``."""
    out = {}
    for part in message.split("; "):
        m = _NOTE.match(part.strip())
        if m:
            out[m["metric"]] = m["source"]
    return out


def is_quoted(metric: str) -> bool:
    return metric.startswith(PREFIX)
