"""The executor interface: run cases, yield one Record per case as each finishes; and how cases are grouped
when a run times them side by side (``RunOptions.interleave``)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from harness.runner import RunOptions
from harness.records import CaseRecord
from harness.spec import Case

MAX_GROUP = 16
"""At most this many cases are built and timed side by side in one worker."""


class Executor(Protocol):
    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]: ...

    def close(self) -> None: ...


def interleave_groups(cases: Sequence[Case]) -> list[list[Case]]:
    """The groups of cases timed side by side: with several lines, the cases at one sweep point (the lines a
    suite compares, e.g. ViT-B/16 and ResNet-50 at batch 1); with one line, the whole sweep (e.g. 1 head vs 8
    heads); never two devices in one group. Suite order is kept; a group larger than :data:`MAX_GROUP` is split."""
    lines = {c.line for c in cases}
    by: dict[object, list[Case]] = {}
    for c in cases:
        by.setdefault((c.point if len(lines) > 1 else 0, c.workload.device), []).append(c)
    return [g[i:i + MAX_GROUP] for g in by.values() for i in range(0, len(g), MAX_GROUP)]
