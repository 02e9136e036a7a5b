"""The input makers every family shares: token ids, token pairs, hidden states, images.

Each is ``make_inputs(cfg, workload, device) -> tuple of tensors`` (``ArchSpec.make_inputs``): random,
reproducible (a fixed seed per input), drawn on the CPU and moved to ``device``, so a case's inputs are
the same on every machine. They read only the config fields they name (duck-typed).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.api import Workload


def need_seq_len(w: Workload) -> int:
    """The workload's sequence length; a clear error if it has none."""
    if w.seq_len is None:
        raise ValueError("a sequence workload needs seq_len")
    return w.seq_len


def _tokens(vocab_size: int, w: Workload, device: torch.device, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (w.batch_size, need_seq_len(w)), generator=g).to(device)


def token_inputs(cfg: Any, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Random token ids (B, T) below ``cfg.vocab_size``."""
    return (_tokens(cfg.vocab_size, w, device, 0),)


def seq2seq_inputs(cfg: Any, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Source and target token ids, both (B, seq_len) — a translation pair of equal lengths."""
    return _tokens(cfg.vocab_size, w, device, 0), _tokens(cfg.vocab_size, w, device, 1)


def hidden_inputs(cfg: Any, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Unit-variance hidden states (B, T, ``cfg.d_model``): the input of one layer."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(w.batch_size, need_seq_len(w), cfg.d_model, generator=g).to(device),)


TILE = 512
"""Positions drawn on the CPU per long random input (:func:`tiled_randn`); the rest repeats them on the device."""


def tiled_randn(shape: tuple[int, ...], dim: int, device: torch.device, generator: torch.Generator) -> Tensor:
    """A standard normal tensor of ``shape`` whose first :data:`TILE` positions along ``dim`` are drawn on the CPU
    (the same on every machine) and repeated along ``dim`` on ``device``: a 1.6 G-value KV cache is drawn in
    1/64 of the time (the CPU generator is single-threaded, ~5–10 ns a value: it was a third of a GPU
    kv_cache run). Dense kernels do the same work whatever the values."""
    n = shape[dim]
    block_shape = list(shape)
    block_shape[dim] = min(n, TILE)
    block = torch.randn(block_shape, generator=generator).to(device)
    if n <= TILE:
        return block
    reps = [1] * len(shape)
    reps[dim] = -(-n // TILE)                                       # ceil(n / TILE) copies along dim
    return block.repeat(reps).narrow(dim, 0, n).contiguous()        # (…, n, …) on device


def image_inputs(cfg: Any, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """A batch of images (B, 3, S, S), S the workload's ``img_size`` or else ``cfg.img_size``."""
    side = w.img_size or cfg.img_size
    g = torch.Generator().manual_seed(0)
    return (torch.randn(w.batch_size, 3, side, side, generator=g).to(device),)
