"""The executor interface: run cases, yield one Record per case as each finishes; how cases are grouped when a
run times them side by side (``RunOptions.interleave``); and which failures cost a worker its life."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from harness.engine.runner import RunOptions
from harness.contract.records import CaseRecord
from harness.contract.spec import Case

MAX_GROUP = 16
"""At most this many cases are built and timed side by side in one worker."""


POISONING_ERRORS: tuple[str, ...] = (
    "illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
    "illegal instruction", "an illegal", "launch timed out", "uncorrectable ecc", "hardware stack error",
    "cuda error: unknown error", "cublas_status_execution_failed", "cudnn_status_execution_failed",
    "cudaerrorlaunchfailure", "cuda error: operation not permitted when stream is capturing",
)
"""Errors after which the process's CUDA context is unusable (sticky errors): every later CUDA call fails."""


def poisons_worker(message: str) -> bool:
    """Whether a case that failed with ``message`` (``"Type: first line"``) leaves its worker unusable: a sticky
    CUDA error (illegal memory access, device-side assert, launch failure, ...). A Python exception, a
    caught out-of-memory (CUDA's included: the allocator recovers) or a skip leaves the worker as it was."""
    text = message.lower()
    return any(marker in text for marker in POISONING_ERRORS)


class Executor(Protocol):
    startup_s: float      # seconds spent starting workers (harness.engine.overhead)
    starts: int           # how many workers were started

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
