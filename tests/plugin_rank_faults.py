"""Test-only plug-in architectures that misbehave on one rank of a multi-rank case: `rank-faulty`, whose forward
dies, hangs or skews, and `decoder-tp-skewed`, a decoder whose tensor-parallel split is wrong on rank 1.

Loaded by file path (``RunOptions(plugins=...)``) into the worker and rank processes only, never into the test
runner: ``tests/test_ranks.py`` runs its cases through the process executor. The fault fires only on real tensors
inside a process group, on rank ``cfg.rank``: ``sigkill`` (the rank dies), ``hang`` (it sleeps past the case's
timeout) or ``skew`` (its output is scaled, so the ranks' gradients are not one process's).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from architectures.inputs import token_inputs
from architectures.transformer import Decoder, DecoderConfig
from harness.contract.registry import register
from harness.contract.spec import ArchSpec, Workload

Behavior = Literal["ok", "sigkill", "hang", "skew"]


@dataclass(frozen=True)
class RankFaultyConfig:
    behavior: Behavior = "ok"
    rank: int = 1
    width: int = 16


class RankFaulty(nn.Module):
    def __init__(self, cfg: RankFaultyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, width) -> (B, width)
        out = self.proj(x)
        if is_fake(x) or not dist.is_initialized() or dist.get_rank() != self.cfg.rank:
            return out
        if self.cfg.behavior == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.cfg.behavior == "hang":
            time.sleep(600)
        elif self.cfg.behavior == "skew":
            return 1.5 * out
        return out


def rank_faulty_inputs(cfg: RankFaultyConfig, w: Workload, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (torch.randn(w.batch_size, cfg.width, device=device),)


register(ArchSpec("rank-faulty", "test", RankFaultyConfig(), RankFaulty, rank_faulty_inputs,
                  "test-only: a linear layer whose forward dies, hangs or skews on one rank"))


class SkewedSplitDecoder(Decoder):
    """A decoder whose split keeps rank 1's first output projection scaled by 1.5 (a wrong shard)."""

    def split_heads(self, rank: int, world: int, reduce) -> None:
        super().split_heads(rank, world, reduce)
        if rank == 1:
            with torch.no_grad():
                self.stack.blocks[0].attn.out.weight.mul_(1.5)


register(ArchSpec("decoder-tp-skewed", "test", DecoderConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2),
                  SkewedSplitDecoder, token_inputs, "test-only: a decoder whose tensor-parallel split is wrong"))
