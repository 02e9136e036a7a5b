"""The one KV cache of the project: a preallocated static cache per layer (:class:`StaticKVCache`), a decoder's
generation state (:class:`StaticKVState`), and their analytic size (:func:`static_kv_bytes`).

The cache mixes a decode step's query through the attention's core (:class:`architectures.layers.attention.Core`:
``decode_window``, ``kernel``); :class:`architectures.layers.attention.Attention` writes into it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor, nn

__all__ = ["CacheCore", "StaticKVCache", "StaticKVState", "static_kv_bytes", "static_kv_slots"]


class CacheCore(Protocol):
    """What the cache needs of an attention core (:class:`architectures.layers.attention.Core` has it)."""

    kernel: Callable[..., Tensor]

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool, offset: int | Tensor,
                 dropout_p: float, scale: float | None) -> Tensor: ...

    def decode_window(self) -> int | None: ...


class StaticKVCache(nn.Module):
    """A preallocated KV cache for generation (gpt-fast's static cache): ``k``, ``v`` buffers of
    (B, Hkv, size, hd) written in place, never concatenated or reallocated, so a decode step has static shapes
    (what ``torch.compile`` and CUDA graphs need) and moves only the bytes it reads and the one slot it writes.

    * ``size = max_len`` for exact attention: slot j holds position j.
    * ``size = window + 1`` (when smaller than ``max_len``) for a sliding-window core (:meth:`CacheCore.decode_window`):
      a **ring buffer**, slot ``p % size`` holds position p; memory is bounded by the window, not the sequence.

    Two kinds of call (:meth:`mix`): a **prefill** of T > 1 prompt tokens into an empty cache (the core mixes the
    prompt's own k, v as without a cache, then the last ``min(T, size)`` positions are written), then **decode**
    calls of one token each: its k, v are written at its slot (``index_copy_``), and it attends over the whole
    buffer under a mask of the filled slots at most ``window`` positions back (``slot_pos``: the position each
    slot holds, -1 while empty). The position is the 0-d tensor ``pos``, advanced in place, so a compiled
    decode step never specialises on it. ``nbytes()`` is exactly :func:`static_kv_bytes`.
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, max_len: int, window: int | None = None, *,
                 like: Tensor) -> None:
        super().__init__()
        if max_len <= 0 or (window is not None and window <= 0):
            raise ValueError(f"need max_len > 0 and window > 0, got {max_len}, {window}")
        shape = (batch, n_kv_heads, static_kv_slots(max_len, window), head_dim)
        self._hold(like.new_zeros(shape), like.new_zeros(shape), max_len, window)     # (B, Hkv, size, hd) each

    def _hold(self, k: Tensor, v: Tensor, max_len: int, window: int | None) -> None:
        """Take ``k``, ``v`` (B, Hkv, size, hd) as the buffers, empty."""
        self.max_len, self.window = max_len, window
        self.size = k.shape[2]
        self.ring = self.size < max_len
        self.register_buffer("k", k, persistent=False)                                 # (B, Hkv, size, hd)
        self.register_buffer("v", v, persistent=False)                                 # (B, Hkv, size, hd)
        self.register_buffer("slot_pos", torch.full((self.size,), -1, dtype=torch.long, device=k.device),
                             persistent=False)                                         # (size,)
        self.register_buffer("pos", torch.zeros((), dtype=torch.long, device=k.device), persistent=False)
        self.prefilled = False
        self.start = 0                                    # the position :meth:`adopt` goes back to

    @classmethod
    def over(cls, k: Tensor, v: Tensor, length: int) -> StaticKVCache:
        """An exact-attention cache of ``length + 1`` slots taking ``k`` and ``v`` themselves (B, Hkv, length + 1, hd)
        as its buffers, no copy (:meth:`adopt`), holding positions 0 … length - 1 in slots 0 … length - 1 as a
        prefill of ``length`` tokens leaves them: the state one decode step finds, which writes the last slot."""
        if length <= 0:
            raise ValueError(f"need a context of at least one position, got {length}")
        if k.dim() != 4 or k.shape[2] != length + 1:
            raise ValueError(f"need k, v of shape (B, Hkv, {length} + 1, hd), got {tuple(k.shape)}")
        cache = cls.__new__(cls)
        nn.Module.__init__(cache)
        cache._hold(k, v, length + 1, None)
        cache.slot_pos[:length] = torch.arange(length, device=k.device)    # (size,): the last slot still empty
        cache.prefilled, cache.start = True, length
        cache.adopt(k, v)
        return cache

    def adopt(self, k: Tensor, v: Tensor) -> None:
        """Take ``k``, ``v`` (B, Hkv, size, hd) as the buffers (no copy; detached: the history of a step taken with
        grad is not kept) holding the positions :meth:`over` said, and go back to the position after them: the
        same decode step then runs again, writing the same slot."""
        if k.shape != v.shape or k.dim() != 4 or k.shape[2] != self.size:
            raise ValueError(f"need k, v of one shape (B, Hkv, {self.size}, hd), got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
        self._buffers["k"], self._buffers["v"] = k.detach(), v.detach()   # a step with grad writes its slot anew
        self.pos.fill_(self.start)

    def release(self) -> None:
        """Let go of the adopted buffers (until the next :meth:`adopt`)."""
        self._buffers["k"] = self._buffers["v"] = None

    def reset(self) -> None:
        """Empty the cache for a new sequence (the k/v contents are masked out, not cleared)."""
        self.pos.zero_()
        self.slot_pos.fill_(-1)
        self.prefilled = False

    def nbytes(self) -> int:
        """Bytes of the k and v buffers (the int64 bookkeeping, 8·(size + 1) bytes, is not KV cache)."""
        return self.k.nbytes + self.v.nbytes

    def span(self, t: int) -> tuple[int | Tensor, int]:
        """(position of the first of ``t`` new tokens, number of keys they attend over): (0, T) for a prefill,
        (``pos``, ``size``) for a decode step."""
        return (0, t) if t > 1 else (self.pos, self.size)

    def mix(self, core: CacheCore, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool,
            dropout_p: float, scale: float | None) -> Tensor:
        """Write k, v (B, Hkv, T, hd) into the cache and mix q (B, H, T, hd) with what it holds -> (B, H, T, hd)."""
        t = q.shape[2]
        if t > 1:
            if self.prefilled:
                raise ValueError("a static KV cache takes one prompt (T > 1) and then one token per call; "
                                 "call reset() before another prompt")
            y = core(q, k, v, bias, causal, 0, dropout_p, scale)
            keep = min(t, self.size)                                      # the ring keeps the last `size` positions
            positions = torch.arange(t - keep, t, device=k.device)        # (keep,)
            slots = positions % self.size
            self.k.index_copy_(2, slots, k[:, :, t - keep:])
            self.v.index_copy_(2, slots, v[:, :, t - keep:])
            self.slot_pos.index_copy_(0, slots, positions)
            self.pos.fill_(t)
            self.prefilled = True
            return y
        window = core.decode_window()
        if bias is not None and self.ring:
            raise ValueError("an additive position bias (ALiBi) cannot read a ring buffer (its slots are not "
                             "in position order)")
        slot = (self.pos % self.size).view(1)                            # (1,)
        self.k.index_copy_(2, slot, k)
        self.v.index_copy_(2, slot, v)
        self.slot_pos.index_copy_(0, slot, self.pos.view(1))
        keep = (self.slot_pos >= 0) & (self.slot_pos <= self.pos)       # (size,)
        if window is not None:
            keep = keep & (self.pos - self.slot_pos <= window)
        self.pos.add_(1)
        return core.kernel(q, self.k, self.v, bias, keep.view(1, 1, 1, -1), dropout_p, scale)

    def step_bytes(self, context: int) -> int:
        """Bytes a decode step after ``context`` positions must at least move here: the k/v of the (at most
        ``size - 1``) earlier positions it attends to, read, and its own slot, written."""
        slot = self.k[:, :, 0].nbytes + self.v[:, :, 0].nbytes
        return (min(context, self.size - 1) + 1) * slot

    def extra_repr(self) -> str:
        return f"size={self.size}, window={self.window}, ring={self.ring}"


class StaticKVState(nn.ModuleList):
    """A decoder's generation state: one :class:`StaticKVCache` per layer."""

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self)

    def step_bytes(self, context: int) -> int:
        return sum(c.step_bytes(context) for c in self)


def static_kv_slots(max_len: int, window: int | None = None) -> int:
    """Slots of a :class:`StaticKVCache`: ``max_len``, or ``window + 1`` when that is smaller (a ring buffer)."""
    return max_len if window is None else min(max_len, window + 1)


def static_kv_bytes(batch: int, n_kv_heads: int, head_dim: int, max_len: int, window: int | None,
                    itemsize: int) -> int:
    """Analytic bytes of one layer's :class:`StaticKVCache`: k and v, 2·B·Hkv·slots·hd·itemsize."""
    return 2 * batch * n_kv_heads * static_kv_slots(max_len, window) * head_dim * itemsize
