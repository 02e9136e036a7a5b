"""Position information behind one small interface.

A scheme may add to the token embeddings (``embed``), give an additive attention bias
(``bias``: ALiBi) or rotate q/k (``rotate``: RoPE); the model hands the last two to the one
attention's hooks. Every hook takes the position ``offset`` of the first token (an int, or a 0-d tensor
when a static KV cache decodes: a compiled decode step then never specialises on it), so the schemes
work with a KV cache (the cached keys were embedded/rotated at their own positions).

=============  =========  =======================  ======================
scheme         ``embed``  ``bias(t, s, offset)``   ``rotate(q, k, offset)``
=============  =========  =======================  ======================
none           identity   None                     None
learned        + table    None                     None
sinusoidal     + sin/cos  None                     None
rope           identity   None                     rotates q, k
alibi          identity   -m_h·|i - j|             None
=============  =========  =======================  ======================
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from architectures.layers.attention import Rotation

PositionKind = Literal["none", "learned", "sinusoidal", "rope", "alibi"]
POSITION_KINDS: tuple[str, ...] = ("none", "learned", "sinusoidal", "rope", "alibi")


def _positions(t: int, offset: int | Tensor, device: torch.device | None, dtype: torch.dtype) -> Tensor:
    """Positions offset … offset+t-1 (T,): ``offset`` an int, or a static KV cache's 0-d tensor."""
    if isinstance(offset, Tensor):
        return torch.arange(t, device=device, dtype=dtype) + offset
    return torch.arange(offset, offset + t, device=device, dtype=dtype)


class Positions(nn.Module):
    """Base and ``"none"``: no position information (self-attention stays permutation-equivariant)."""

    rotate: Rotation | None = None      # a method on schemes that rotate q/k

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:     # (B, T, d) -> (B, T, d)
        return x

    def bias(self, t: int, s: int, offset: int = 0, device: torch.device | None = None,
             dtype: torch.dtype = torch.float32) -> Tensor | None:
        """Additive attention bias (H, T, S) for queries at offset … offset+T-1 and keys 0 … S-1, or None."""
        return None


class LearnedPositions(Positions):
    """A trained table of ``max_len`` vectors; positions past it are an error, never garbage."""

    def __init__(self, max_len: int, d: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[1]
        if isinstance(offset, Tensor):                          # a static cache's position (generation)
            return x + self.table(offset + torch.arange(t, device=x.device))   # (T, d) broadcast over B
        if offset + t > self.max_len:
            raise ValueError(f"learned positions cover {self.max_len} tokens; got position {offset + t - 1}"
                             f" (raise max_seq_len or use sinusoidal/rope/alibi positions)")
        return x + self.table.weight[offset:offset + t]        # (T, d) broadcast over B


class SinusoidalPositions(Positions):
    """Vaswani et al.: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    Computed in fp32 (fp64 if asked for) whatever the model's dtype: frequencies and angles held in
    bf16/fp16 would be off by radians at a few hundred positions.
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def table(self, t: int, offset: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        work = torch.float64 if dtype == torch.float64 else torch.float32
        inv_freq = torch.exp(torch.arange(0, self.d, 2, device=device, dtype=work) * (-math.log(10000.0) / self.d))
        pos = _positions(t, offset, device, work)                  # (T,)
        angles = pos[:, None] * inv_freq[None, :]               # (T, d/2)
        pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, d/2, 2)
        return pe.flatten(1)[:, : self.d].to(dtype)              # (T, d)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.table(x.shape[1], offset, x.device, x.dtype)


class RotaryPositions(Positions):
    """RoPE (Su et al.): rotate each (x_i, x_{i+hd/2}) pair of q and k by pos·θ_i, θ_i = base^(-2i/hd).

    The "rotate-half" pairing of GPT-NeoX / Hugging Face LLaMA. q·k then depends on positions only
    through their difference. Applied to self-attention only; keys are cached already rotated.
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dim, got {head_dim}")
        self.head_dim, self.base = head_dim, base

    def rotate(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        """q: (B, H, T, hd), k: (B, Hkv, T, hd), both at positions offset … offset+T-1.
        Angles in fp32 whatever the dtype of q and k."""
        t, hd = q.shape[-2], self.head_dim
        inv_freq = self.base ** (-torch.arange(0, hd, 2, device=q.device, dtype=torch.float32) / hd)   # (hd/2,)
        pos = _positions(t, offset, q.device, torch.float32)            # (T,)
        angles = pos[:, None] * inv_freq[None, :]                        # (T, hd/2)
        angles = torch.cat([angles, angles], dim=-1)                     # (T, hd)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)                                          # 2 × (..., T, hd/2)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin                  # (..., T, hd)


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al.'s head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), … for n a power of 2;
    otherwise those of the nearest lower power of 2, then every other slope of the next one up."""
    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class AlibiPositions(Positions):
    """ALiBi (Press et al.): scores += -m_h · |i - j|, query i at ``offset + row``, key j.

    For causal attention this is the paper's m_h·(j - i) on every visible key; a bidirectional
    encoder gets the symmetric distance. No parameters and no buffers: the slopes are made on the
    device, in fp32, from their exponents (:func:`alibi_slopes` is the reference).
    """

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def slopes(self, device: torch.device | None = None) -> Tensor:
        """(H,) fp32: 2^(-8(i+1)/c) for the c = 2^⌊log2 H⌋ first heads, then 2^(-4(2j+1)/c)."""
        n, c = self.n_heads, 2 ** math.floor(math.log2(self.n_heads))
        exps = torch.cat([8.0 * torch.arange(1, c + 1, device=device, dtype=torch.float32) / c,
                          4.0 * (2 * torch.arange(n - c, device=device, dtype=torch.float32) + 1) / c])
        return torch.exp2(-exps)

    def bias(self, t: int, s: int, offset: int = 0, device: torch.device | None = None,
             dtype: torch.dtype = torch.float32) -> Tensor:
        i = _positions(t, offset, device, torch.long)[:, None]          # (T, 1)
        j = torch.arange(s, device=device)[None, :]
        distance = (i - j).abs().float()                                 # (T, S)
        return (-self.slopes(device)[:, None, None] * distance).to(dtype)   # (H, T, S)


def make_positions(kind: PositionKind, d: int, max_len: int, n_heads: int = 1) -> Positions:
    """The scheme ``kind`` for width ``d`` (RoPE rotates heads of width d // n_heads)."""
    if kind == "none":
        return Positions()
    if kind == "learned":
        return LearnedPositions(max_len, d)
    if kind == "sinusoidal":
        return SinusoidalPositions(d)
    if kind == "rope":
        return RotaryPositions(d // n_heads)
    if kind == "alibi":
        return AlibiPositions(n_heads)
    raise ValueError(f"unknown positions {kind!r}")
