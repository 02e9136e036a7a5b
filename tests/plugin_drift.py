"""A test-only plug-in architecture (`drifty`) whose cost changes by environment variable, so a case keeps its
identity (its case key) while its code "changes" between a baseline and a check:

- ``BENCH_TEST_PAUSE_MS``: a busy-wait of that many milliseconds in forward (a slowdown no counter sees); with
  ``BENCH_TEST_PAUSE_ONLY_IN`` set, only in a process whose working directory is that one (`bench check
  --against` runs each version's workers in its own checkout: the candidate alone is slowed);
- ``BENCH_TEST_WIDEN``: the hidden layer this many times wider (MACs, parameters and memory change).

Its ``luck_ms`` (with ``luck_file``) gives each process its own luck: the k-th process to run a forward (counted in
that file) busy-waits ``k · luck_ms`` more on every call, so its processes' medians differ by design.

The forward busy-waits 2 ms on a wall-clock deadline besides its matmuls, so its time is set by the clock, not
by the machine's luck: the gate's tests stay deterministic on a noisy machine. Loaded by file path (--plugin).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from harness.contract.registry import register
from harness.contract.spec import ArchSpec, Workload


@dataclass(frozen=True)
class DriftyConfig:
    width: int = 64
    base_ms: float = 2.0
    luck_ms: float = 0.0
    luck_file: str = ""


_luck: list[int] = []       # this process's number among those that ran a lucky forward (claimed once)


def _process_luck(path: str) -> int:
    """The number of processes that claimed one before this one (a line appended to ``path`` per process)."""
    if not _luck:
        with open(path, "a+") as f:
            import fcntl
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            _luck.append(len(f.read().splitlines()))
            f.write(f"{os.getpid()}\n")
    return _luck[0]


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _pause_ms() -> float:
    only = os.environ.get("BENCH_TEST_PAUSE_ONLY_IN")
    if only and os.path.realpath(os.getcwd()) != os.path.realpath(only):
        return 0.0
    return float(os.environ.get("BENCH_TEST_PAUSE_MS", "0"))


class Drifty(nn.Module):
    def __init__(self, cfg: DriftyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hidden = int(cfg.width * float(os.environ.get("BENCH_TEST_WIDEN", "1")))
        self.up, self.down = nn.Linear(cfg.width, hidden), nn.Linear(hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, width) -> (B, width)
        if not is_fake(x):
            luck = self.cfg.luck_ms * _process_luck(self.cfg.luck_file) if self.cfg.luck_ms else 0.0
            _spin(self.cfg.base_ms + luck + _pause_ms())
        return self.down(torch.relu(self.up(x)))


def drifty_inputs(cfg: DriftyConfig, w: Workload, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (torch.randn(w.batch_size, cfg.width, device=device),)


register(ArchSpec("drifty", "test", DriftyConfig(), Drifty, drifty_inputs,
                  "test-only: a 2 ms busy-wait and an MLP whose pause and width change by environment variable"))
