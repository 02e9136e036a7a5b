"""A test-only plug-in architecture (`faulty`) whose forward misbehaves on demand.

Loaded by file path (``RunOptions(plugins=...)`` / ``bench run --plugin``), never imported as
``tests.plugin_faulty``, so the pytest process's registry stays free of it: the faults are meant
to happen in worker processes (or in a ``bench`` subprocess), never in the test runner.

The fault fires only on real tensors, i.e. in the measured passes after the fake (meta) pass
has already succeeded, which is where real crashes, hangs and OOMs happen.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from harness.contract.registry import register
from harness.contract.spec import ArchSpec, Workload

Behavior = Literal["ok", "hang", "sigkill", "exit3", "boom", "torch_oom", "memory_error"]


@dataclass(frozen=True)
class FaultyConfig:
    behavior: Behavior = "ok"
    width: int = 16
    pid_file: str = ""      # if set, every model built appends "<pid> <width>" (who built which case)


class Faulty(nn.Module):
    def __init__(self, cfg: FaultyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(cfg.width, cfg.width)
        if cfg.pid_file:
            with open(cfg.pid_file, "a") as f:
                f.write(f"{os.getpid()} {cfg.width}\n")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, width) -> (B, width)
        if not is_fake(x):
            b = self.cfg.behavior
            if b == "hang":
                time.sleep(60)
            elif b == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif b == "exit3":
                os._exit(3)
            elif b == "boom":
                raise RuntimeError("boom")
            elif b == "torch_oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 PiB (simulated)")
            elif b == "memory_error":
                raise MemoryError("simulated host allocation failure")
        return self.proj(x)


def faulty_inputs(cfg: FaultyConfig, w: Workload, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (torch.randn(w.batch_size, cfg.width, device=device),)


register(ArchSpec("faulty", "test", FaultyConfig(), Faulty, faulty_inputs,
                  "test-only: a linear layer whose forward hangs, crashes or raises on demand"))
