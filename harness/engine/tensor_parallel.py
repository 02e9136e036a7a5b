"""Tensor parallelism (``parallel = "tp"``): a decoder's attention heads and MLP width split over the ranks,
Megatron style, for a forward (``mode = "fwd"``) or a generation (``"generate"``) of one batch the ranks share.

A model takes part through a small protocol on its class (:data:`SPLIT_PROTOCOL`, what
:class:`architectures.transformer.Decoder` implements): ``cannot_split_heads(config, world)`` (a reason, or None)
and ``split_heads(rank, world, reduce)``, which keeps the rank's share of every layer in place — the column share of
the fused qkv projection per head group and of the MLP's up projection, the row share of the attention's output
projection and of the MLP's down projection, each followed by one all-reduce (``reduce``: :func:`all_reduce_sum`,
through ``torch.distributed.all_reduce``, so the bytes are counted: :func:`harness.engine.distributed.counting`).
Embeddings, norms and the LM head stay whole on every rank.

Why by hand and not ``torch.distributed.tensor.parallel``: its ``ColwiseParallel`` shards a linear's output
features in contiguous chunks, which cuts our fused qkv projection (H query heads, then Hkv key heads, then Hkv
value heads) across the q/k/v boundaries, and the attention's head counts would still have to be changed from
outside; the layers know their own layouts, so they split themselves.

Correctness first (:func:`outputs`): rank 0 runs the model whole before it is split, and the split model's
logits (a forward's; a generation's prefill and its first decode step's) must equal them within
:data:`LOGIT_TOLERANCE`, else the case is an error.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from harness.contract.errors import BenchInputError
from harness.contract.spec import ArchSpec, Workload
from harness.engine.payload import Payload
from harness.instruments.outputs import first_tensor

SPLIT_PROTOCOL: tuple[str, ...] = ("cannot_split_heads", "split_heads")
"""What a model class implements to be split over ranks by ``parallel = "tp"``."""

LOGIT_TOLERANCE: dict[str, float] = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-2}
"""The largest relative logit difference from one process that rounding explains (max|Δ| / max|logit|), by the
workload's dtype: fp32 partial sums added in another order differ by ~1e-7 of the largest; half precision ~1e-3."""


class LogitMismatch(RuntimeError):
    """The split model's logits are not one process's on the same batch: the case is wrong, not slow."""


def check_split(spec: ArchSpec, w: Workload) -> None:
    """Refuse, before anything runs, a ``tp`` case whose model cannot be split over ``w.world_size`` ranks: a model
    without :data:`SPLIT_PROTOCOL` (not a decoder), or heads, k/v heads or MLP width the ranks do not divide."""
    if w.parallel != "tp":
        return
    missing = [m for m in SPLIT_PROTOCOL if not callable(getattr(spec.build, m, None))]
    if missing:
        raise BenchInputError(f"{spec.name} ({spec.family}) cannot split over ranks: parallel \"tp\" splits a "
                              "decoder's heads and MLP width", where="parallel")
    reason = spec.build.cannot_split_heads(spec.config, w.world_size)
    if reason:
        raise BenchInputError(f"{spec.name} cannot split over {w.world_size} ranks: {reason}", where="world_size")


def all_reduce_sum(t: Tensor) -> Tensor:
    """``t`` summed over the ranks, in place (the row-parallel layers' reduction); returns it."""
    dist.all_reduce(t)
    return t


def split(model: nn.Module, rank: int, world: int) -> nn.Module:
    """``model`` with only rank ``rank``'s share of its heads and MLP width, in place; returns it."""
    model.split_heads(rank, world, all_reduce_sum)
    return model


@torch.no_grad()
def outputs(model: nn.Module, inputs: tuple, w: Workload) -> dict[str, Tensor]:
    """The logits a ``tp`` case checks: a forward's (B, T, vocab), or a generation's prefill (B, vocab) and its first
    decode step's (B, vocab), fed the prefill's argmax, in a fresh generation state."""
    model.eval()
    if w.mode != "generate":
        return {"logits": first_tensor(model(*inputs)).detach().clone()}
    prompt = inputs[0]                                                   # (B, P)
    state = model.generation_state(prompt.shape[0], prompt.shape[1] + 1)
    prefill = model.prefill(prompt, state)                              # (B, vocab)
    decode = model.decode(prefill.argmax(dim=-1, keepdim=True), state)  # (B, vocab)
    return {"prefill": prefill.clone(), "decode": decode.clone()}


def payload(config: object, w: Workload) -> Payload:
    """The all-reduce bytes of one step, derived from the config: two per layer (after the attention and after the
    MLP) of the (B, tokens, d_model) activations, where a generation's call runs P prompt tokens and N − 1 decode
    tokens."""
    tokens = w.seq_len if w.mode != "generate" else w.prompt_len + w.new_tokens - 1
    per_layer = 2 * w.batch_size * tokens * config.d_model * w.itemsize    # type: ignore[attr-defined]
    return Payload(all_reduce=per_layer * config.n_layers)                 # type: ignore[attr-defined]
