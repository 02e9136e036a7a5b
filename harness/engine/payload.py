"""What a step's collectives carry, by kind: a plain record that the parent process reads without loading
torch.distributed's FSDP and DTensor (a second of CPU for every process that imports them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Payload:
    """The tensor bytes a step's collectives carry on each rank, by kind — derived (:func:`harness.engine.distributed.comm_payload`,
    :func:`harness.engine.tensor_parallel.payload`) or counted (:meth:`harness.engine.distributed.Counted.payload`): ``all_reduce`` (DDP: every
    gradient; TP: the row-parallel layers' activations), ``all_gather`` (FSDP: the parameters gathered whole, in the
    forward and again in the backward for the blocks resharded after their forward) and ``reduce_scatter`` (FSDP:
    every gradient, reduced to the rank's shard)."""

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
