"""Activation checkpointing: each block of a model recomputes its activations in the backward instead of keeping
them (``checkpointing = "block"``), applied to the built model from outside (:func:`apply_checkpointing`, by the one
model build), never inside a model's code.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.contract.errors import BenchInputError

__all__ = ["Checkpointed", "apply_checkpointing", "block_lists"]


class Checkpointed(nn.Module):
    """One block whose activations are recomputed in the backward (``torch.utils.checkpoint``, non-reentrant):
    only the block's inputs are kept from the forward. Without grad (eval) it is the block itself."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.block(*args, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def block_lists(model: nn.Module) -> list[nn.ModuleList]:
    """The model's blocks: every ``nn.ModuleList`` not inside another one that holds at least two modules with
    parameters (a decoder's layers; an encoder-decoder's encoder and decoder layers; a Swin's stages)."""
    found: list[nn.ModuleList] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if isinstance(module, nn.ModuleList) and sum(
                1 for m in module if any(True for _ in m.parameters())) >= 2:
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def apply_checkpointing(model: nn.Module, checkpointing: str) -> nn.Module:
    """``model`` with each block of :func:`block_lists` wrapped in :class:`Checkpointed` (in place; returns
    ``model``). ``"none"``: ``model`` untouched. A model without such blocks raises BenchInputError."""
    if checkpointing == "none":
        return model
    lists = block_lists(model)
    if not lists:
        raise BenchInputError(f"checkpointing = {checkpointing!r} needs blocks in an nn.ModuleList; "
                              f"{type(model).__name__} has none", where="checkpointing")
    for blocks in lists:
        for i, block in enumerate(blocks):
            if not isinstance(block, Checkpointed):
                blocks[i] = Checkpointed(block)
    return model

