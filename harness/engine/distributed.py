"""What one rank of a multi-rank case does with its model (run inside a rank: :mod:`harness.engine.rank_worker`).

* :func:`wrap` — the model split across the ranks: ``ddp`` (``DistributedDataParallel``, gradients as views of
  its all-reduce buckets, so they are not held twice) or ``fsdp`` (FSDP2 ``fully_shard`` on each block of the
  model's main ``ModuleList``, then on the root: parameters, gradients and optimizer state sharded).
* :func:`gradient_error` — correctness first: the gradients of one step on every rank's batch, against those of
  one process on the same batches (the mean of the ranks' losses), as the largest relative difference.
* :func:`comm_payload` — the bytes the step's collectives carry, derived from the parameter sizes (not counted).
* :func:`time_collectives` — those collectives timed alone, with no compute to overlap.
* :func:`barrier_samples` — the one timing loop of a multi-rank step: a barrier before each sample. It is apart
  from :class:`harness.instruments.timing.Sampler` because every rank must make the same number of calls (a
  step's collectives pair up across ranks): rank 0 decides when to stop and the others follow.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from harness.engine.training import block_lists
from harness.instruments.timing import TimingConfig

GRAD_TOLERANCE: dict[str, float] = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""The largest relative gradient difference from one process that rounding explains, by the step's precision:
fp32 sums of the same terms in another order differ by ~1e-7 of the largest; half precision by ~1e-3."""


def wrap(model: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """``model`` split across the process group's ranks as ``parallel`` says (see the module docstring); FSDP
    shards ``model`` in place and returns it, DDP returns its wrapper."""
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
    if parallel == "fsdp":
        for blocks in block_lists(model):
            for block in blocks:
                fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"unknown parallel {parallel!r}")


def full(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it), else ``t``."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def gathered_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter's gradient, whole, by name (collective for FSDP)."""
    return {n: full(p.grad).detach().clone() for n, p in model.named_parameters()
            if p.requires_grad and p.grad is not None}


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest, over parameters, of max|got − want| / max|want| (a gradient missing on one side: inf)."""
    if got.keys() != want.keys():
        return float("inf")
    worst = 0.0
    for name, ref in want.items():
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((got[name].float() - ref.float()).abs().max()) / scale)
    return worst


def gradient_error(grads: dict[str, torch.Tensor], reference: Callable[[], dict[str, torch.Tensor]],
                   device: torch.device) -> float:
    """Rank 0 compares ``grads`` with ``reference()`` (one process's gradients on the same batches); every rank
    gets the result (a broadcast), so all of them go on or stop together."""
    err = torch.zeros(1, dtype=torch.float64, device=device)
    if dist.get_rank() == 0:
        err.fill_(relative_error(grads, reference()))
    dist.broadcast(err, src=0)
    return float(err.item())


@dataclass(frozen=True)
class Payload:
    """The tensor bytes a step's collectives carry on each rank (derived from the parameters, not counted):
    ``all_reduce`` (DDP: every gradient), ``all_gather`` (FSDP: the parameters gathered whole, in the forward and
    again in the backward for the blocks resharded after their forward) and ``reduce_scatter`` (FSDP: every
    gradient, reduced to the rank's shard)."""

    all_reduce: int = 0
    all_gather: int = 0
    reduce_scatter: int = 0

    @property
    def total(self) -> int:
        return self.all_reduce + self.all_gather + self.reduce_scatter

    def sent_per_rank(self, world: int) -> float:
        """Bytes one rank sends per step with ring collectives: an all-reduce 2(N−1)/N of its payload, an
        all-gather or a reduce-scatter (N−1)/N."""
        share = (world - 1) / world
        return 2 * share * self.all_reduce + share * (self.all_gather + self.reduce_scatter)


def _bytes(params: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() * p.element_size() for p in params if p.requires_grad)   # DTensor: the whole's numel


def comm_payload(model: nn.Module, parallel: str) -> Payload:
    """The step's collectives' payload for ``model`` as :func:`wrap` split it (see :class:`Payload`). FSDP's root
    keeps its own parameters (embeddings, head) gathered from the forward to the backward; its blocks gather
    twice."""
    everything = _bytes(model.parameters())
    if parallel == "ddp":
        return Payload(all_reduce=everything)
    blocks = sum(_bytes(b.parameters()) for lst in block_lists(model) for b in lst)
    return Payload(all_gather=everything + blocks, reduce_scatter=everything)


def time_collectives(payload: Payload, device: torch.device, dtype: torch.dtype, repeats: int = 3) -> float:
    """Seconds the payload's collectives take alone (median of ``repeats``, a barrier before each): an
    all-reduce of the all-reduce bytes, an all-gather and a reduce-scatter of theirs, on flat buffers."""
    world = dist.get_world_size()
    item = torch.tensor([], dtype=dtype).element_size()

    def flat(nbytes: int) -> torch.Tensor:
        n = -(-nbytes // (item * world)) * world                 # a multiple of the world size
        return torch.ones(n, dtype=dtype, device=device)

    ar = flat(payload.all_reduce) if payload.all_reduce else None
    ag = flat(payload.all_gather) if payload.all_gather else None
    rs = flat(payload.reduce_scatter) if payload.reduce_scatter else None
    shard_ag = ag.chunk(world)[0].clone() if ag is not None else None
    shard_rs = torch.empty(rs.numel() // world, dtype=dtype, device=device) if rs is not None else None
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        if ar is not None:
            dist.all_reduce(ar)
        if ag is not None:
            dist.all_gather_into_tensor(ag, shard_ag)
        if rs is not None:
            dist.reduce_scatter_tensor(shard_rs, rs)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class RankTiming:
    """One rank's timed calls: the first alone (``cold_s``), then ``samples_s``, the i-th of every rank taken
    after the same barrier (so the step's time of sample i is the largest of the ranks')."""

    cold_s: float
    samples_s: tuple[float, ...]
    warmup_calls: int
    total_s: float


def barrier_samples(fn: Callable[[], object], config: TimingConfig, device: torch.device) -> RankTiming:
    """Time ``fn`` on every rank of the group alike: a cold call, ``config.warmup_calls`` warm-up calls (at least
    one), then samples of one call each, each after a barrier that also carries rank 0's decision to go on
    (an all-reduce of a flag: every rank waits for every other). Rank 0 stops once it holds ``min_samples`` and
    ``min_time_s`` of sampling, or ``max_time_s`` is spent with at least 3 samples."""
    flag = torch.ones(1, dtype=torch.int32, device=device)
    leader = dist.get_rank() == 0
    t_start = time.perf_counter()
    dist.barrier()
    c0 = time.perf_counter()
    fn()
    _sync(device)
    cold = time.perf_counter() - c0
    warm = max(1, config.warmup_calls)
    for _ in range(warm):
        dist.barrier()
        fn()
        _sync(device)
    samples: list[float] = []
    s_start = time.perf_counter()
    while True:
        now = time.perf_counter()
        more = (len(samples) < config.min_samples or now - s_start < config.min_time_s) and not (
            len(samples) >= 3 and now - t_start >= config.max_time_s)
        flag.fill_(1 if (more or not leader) else 0)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)          # the barrier before the sample, and rank 0's word
        if int(flag.item()) == 0:
            break
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return RankTiming(cold, tuple(samples), warm, time.perf_counter() - t_start)
