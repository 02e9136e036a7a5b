"""What one rank of a multi-rank case does with its model (run inside a rank: :mod:`harness.engine.rank_worker`).

* :func:`wrap` — the model split across the ranks: ``ddp`` (``DistributedDataParallel``, gradients as views of
  its all-reduce buckets, so they are not held twice; its buckets all-reduced by torch's own Python
  ``allreduce_hook``, which does what DDP does without a hook, through ``torch.distributed.all_reduce``, so that
  :func:`counting` sees them) or ``fsdp`` (FSDP2 ``fully_shard`` on each block of the model's main ``ModuleList``,
  then on the root: parameters, gradients and optimizer state sharded). ``tp``: :mod:`harness.engine.tensor_parallel`.
* :func:`rank0_error` — correctness first: rank 0 compares what the ranks computed (one step's gradients, or the
  logits) with one process's on the same batches, as the largest relative difference; every rank gets it.
* :func:`comm_payload` — the bytes the step's collectives carry, derived from the parameter sizes.
* :func:`counting` — the bytes the step's collectives carry, counted: every collective called through
  ``torch.distributed`` within the block (the one place that patches it), with its size, so that
  :func:`time_calls` can replay them alone, with no compute to overlap.
* :func:`agreement` — how the ranks time a step together through the one timing loop
  (:func:`harness.instruments.timing.measure`): every rank makes the same calls, rank 0 decides, and each sample
  starts after a barrier.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from harness.engine.checkpointing import block_lists
from harness.engine.payload import Payload
from harness.instruments.timing import Agree, TimingConfig, measure

GRAD_TOLERANCE: dict[str, float] = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""The largest relative gradient difference from one process that rounding explains, by the step's precision:
fp32 sums of the same terms in another order differ by ~1e-7 of the largest; half precision by ~1e-3."""


def wrap(model: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """``model`` split across the process group's ranks as ``parallel`` says (see the module docstring); FSDP
    shards ``model`` in place and returns it, DDP returns its wrapper."""
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, allreduce_hook)      # DDP's own averaging, through the counted all_reduce
        return ddp
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


def rank0_error(got: dict[str, torch.Tensor], reference: Callable[[], dict[str, torch.Tensor]],
                device: torch.device) -> float:
    """Rank 0 compares ``got`` with ``reference()`` (one process's gradients, or logits, on the same batches) by
    :func:`relative_error`; every rank gets the result (a broadcast), so all of them go on or stop together."""
    err = torch.zeros(1, dtype=torch.float64, device=device)
    if dist.get_rank() == 0:
        err.fill_(relative_error(got, reference()))
    dist.broadcast(err, src=0)
    return float(err.item())


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


WHOLE: dict[str, tuple[int, str]] = {"all_reduce": (0, "tensor"), "broadcast": (0, "tensor"),
                                     "all_gather_into_tensor": (0, "output_tensor"),
                                     "all_gather_single": (0, "output_tensor"),
                                     "reduce_scatter_tensor": (1, "input"), "reduce_scatter_single": (1, "input")}
"""The collectives :func:`counting` sees, each with the argument (position, name) that is the whole tensor it
carries, as :class:`Payload` counts it: an all-reduce's or a broadcast's tensor, an all-gather's gathered output, a
reduce-scatter's input before it is scattered."""


@dataclass(frozen=True)
class Call:
    """One collective as called: its name (a key of :data:`WHOLE`), the whole tensor's elements and dtype."""

    op: str
    numel: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * torch.tensor([], dtype=self.dtype).element_size()


@dataclass
class Counted:
    """The collectives called within a :func:`counting` block, in order."""

    calls: list[Call] = field(default_factory=list)

    def payload(self) -> Payload:
        """The counted bytes as a :class:`Payload` (all-reduces and broadcasts together as ``all_reduce``)."""
        kind = {"all_reduce": "all_reduce", "broadcast": "all_reduce", "all_gather_into_tensor": "all_gather",
                "all_gather_single": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
                "reduce_scatter_single": "reduce_scatter"}
        sums = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}
        for c in self.calls:
            sums[kind[c.op]] += c.nbytes
        return Payload(**sums)


@contextlib.contextmanager
def counting() -> Iterator[Counted]:
    """Count every collective of :data:`WHOLE` called through ``torch.distributed`` within the block (DDP's hook,
    FSDP2 and the tensor-parallel layers call them there); the functions are restored on leaving."""
    counted = Counted()
    originals = {name: getattr(dist, name) for name in WHOLE}

    def counter(name: str, fn: Callable) -> Callable:
        pos, key = WHOLE[name]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            t = kwargs[key] if key in kwargs else args[pos]
            counted.calls.append(Call(name, t.numel(), t.dtype))
            return fn(*args, **kwargs)
        return call

    try:
        for name, fn in originals.items():
            setattr(dist, name, counter(name, fn))
        yield counted
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


REPLAY = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, min_sample_s=0.0, rounds=1)
"""How :func:`time_calls` times the replay: one warm-up call, then 3 samples of one replay each."""


def time_calls(calls: list[Call], device: torch.device) -> float:
    """Seconds the counted ``calls`` take replayed alone, the same collectives of the same sizes in the same order,
    with no compute to overlap: the median of :data:`REPLAY`'s samples, timed by the one timing loop with the ranks'
    :func:`agreement` (a barrier before each sample). 0 for no calls."""
    if not calls:
        return 0.0
    world = dist.get_world_size()
    buffers = []
    for c in calls:
        n = -(-c.numel // world) * world                                  # a multiple of the world size
        whole = torch.ones(n, dtype=c.dtype, device=device)
        buffers.append((c.op, whole, torch.ones(n // world, dtype=c.dtype, device=device)))

    def replay() -> None:
        for op, whole, shard in buffers:
            if op == "all_reduce":
                dist.all_reduce(whole)
            elif op == "broadcast":
                dist.broadcast(whole, src=0)
            elif op.startswith("all_gather"):
                dist.all_gather_single(whole, shard)
            else:
                dist.reduce_scatter_single(shard, whole)
    return statistics.median(measure(replay, REPLAY, device, agree=agreement(device)).samples_s)


def agreement(device: torch.device) -> Agree:
    """The ranks' :data:`harness.instruments.timing.Agree`: rank 0's value, on every rank once all have offered
    theirs (an all-reduce of the minimum, the others offering the largest int64), so each agreement is a barrier
    too. :func:`harness.instruments.timing.measure` with it is the one timing of a multi-rank step: every rank
    makes the same calls (a step's collectives pair up across ranks), rank 0's stop rule decides when to stop,
    and sample i of every rank starts after the same barrier (the step's sample i is the largest of the ranks')."""
    flag = torch.zeros(1, dtype=torch.int64, device=device)
    leader = dist.get_rank() == 0

    def agree(value: int) -> int:
        flag.fill_(value if leader else torch.iinfo(torch.int64).max)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return int(flag.item())
    return agree
