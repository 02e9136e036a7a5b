"""The one attention of the project, with a pluggable core.

:class:`Attention` owns everything a multi-head attention layer has in common — the fused ``qkv``
projection (d → d + 2·Hkv·hd; ``q`` and ``kv`` for cross-attention), the head split and merge, the
``out`` projection, the additive-bias hook (ALiBi, Swin's relative bias), the q/k-rotation hook (RoPE)
and the KV cache (:mod:`architectures.layers.kv_cache`). ``n_kv_heads`` covers MHA (== n_heads), GQA (divides n_heads) and MQA (1).

How q, k, v are *mixed* is its **core**, a small module injected once in ``__init__``:
:class:`ExactCore` here (softmax attention over every key, through :func:`eager_attention`, the
documents' formula kept as the reference, or :func:`sdpa_attention`, PyTorch's fused kernel), and the
long-sequence cores of :mod:`architectures.layers.efficient` (sliding window, BigBird, Linformer,
Performer). Every core keeps its forward-MAC formula (``macs``) next to its code.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from architectures.layers.kv_cache import StaticKVCache
from architectures.layers.tensor_parallel import Reduce, RowSplitLinear, keep_rows, share

AttnImpl = Literal["eager", "sdpa"]
Rotation = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]  # (q, k, offset) -> (q, k)
Kernel = Callable[..., Tensor]                                      # eager_attention or sdpa_attention


def causal_mask(t: int, s: int, device: torch.device, offset: int = 0) -> Tensor:
    """Boolean (t, s) mask, True where query ``offset+i`` may see key ``j`` (j <= offset+i)."""
    i = torch.arange(t, device=device).unsqueeze(1) + offset
    j = torch.arange(s, device=device).unsqueeze(0)
    return j <= i


def eager_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
                    dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
    """softmax(q kᵀ · scale + bias, masked) v, grouping query heads over shared k/v heads.

    q: (B, H, T, hd); k, v: (B, Hkv, S, hd) with H % Hkv == 0; bias broadcastable to (B, H, T, S);
    mask: bool broadcastable to (B, H, T, S), True = keep. Returns (B, H, T, hd).
    """
    b, h, t, hd = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.view(b, hkv, g, t, hd)                                    # (B, Hkv, G, T, hd)
    scores = (qg * scale) @ k.unsqueeze(2).transpose(-2, -1)        # (B, Hkv, G, T, S)
    scores = scores.view(b, h, t, s)                                 # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = weights.view(b, hkv, g, t, s) @ v.unsqueeze(2)            # (B, Hkv, G, T, hd)
    return out.view(b, h, t, hd)


GqaStrategy = Literal["native", "expand"]
FLASH_MAX_HEAD_DIM = 256
"""The widest head the flash kernel takes (torch's ``check_head_dim_size_flash``)."""


def gqa_strategy(device_type: str, dtype: torch.dtype, has_mask: bool, head_dim: int) -> GqaStrategy:
    """How SDPA gets k/v with fewer heads than q (GQA/MQA) so that a fused kernel runs: ``"native"`` passes
    them as they are with ``enable_gqa=True``; ``"expand"`` copies each k/v head to its query heads first
    (:func:`expand_kv`). The count of MACs is the same either way (the copy is data movement).

    The rule follows what each kernel accepts (measured on an H100, torch 2.11, n=8192, h=8, hd=64, causal;
    ``diagnose.log`` of the H100 evidence of 2026-11-22):

    * CUDA, fp32, or any dtype with an explicit ``attn_mask`` (or a head wider than flash's 256): only
      the memory-efficient kernel can run it, and it refuses ``enable_gqa=True``, so native GQA falls back
      to the O(n²) math kernel (12.0 ms, +5.2 GB); expanded k/v run the efficient kernel (2.59 ms,
      +304 MiB, beside MHA's 2.58 ms and +272 MiB): ``"expand"``.
    * CUDA, bf16/fp16, no mask: flash and cuDNN take ``enable_gqa=True`` (0.197 ms, MHA's memory; expanded:
      0.220 ms, +16 MiB), and the efficient kernel would refuse it anyway: ``"native"``. (A GPU without
      flash/cuDNN, before sm80, would fall to math here: not measured.)
    * CPU: the CPU flash kernel takes GQA natively, masks included: ``"native"``.
    * Other devices (MPS, XPU, ...): not measured; torch's own choice is kept: ``"native"``.
    """
    if device_type != "cuda":
        return "native"
    half = dtype in (torch.float16, torch.bfloat16)
    return "native" if half and not has_mask and head_dim <= FLASH_MAX_HEAD_DIM else "expand"


def expand_kv(x: Tensor, n_heads: int) -> Tensor:
    """(B, Hkv, S, hd) -> (B, H, S, hd): k/v head j serves query heads j·G … j·G+G-1 (G = H / Hkv), as
    ``enable_gqa`` and :func:`eager_attention` group them (``repeat_interleave`` on the heads): one copy, or
    for MQA (Hkv = 1) a stride-0 view, which the efficient kernel reads as it is."""
    b, hkv, s, hd = x.shape
    return x.unsqueeze(2).expand(b, hkv, n_heads // hkv, s, hd).reshape(b, n_heads, s, hd)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
                   dropout_p: float = 0.0, scale: float | None = None, is_causal: bool = False, *,
                   gqa: GqaStrategy | None = None) -> Tensor:
    """The same contract as :func:`eager_attention` through ``F.scaled_dot_product_attention``.

    With fewer k/v heads than query heads, ``gqa`` says how SDPA gets them (None: :func:`gqa_strategy`'s
    rule for this device, dtype, mask and head width).
    """
    attn_mask = None
    if bias is not None and mask is not None:
        attn_mask = bias.masked_fill(~mask, float("-inf"))
    elif bias is not None:
        attn_mask = bias
    elif mask is not None:
        attn_mask = mask
    h = q.shape[1]
    grouped = k.shape[1] != h
    if grouped and (gqa or gqa_strategy(q.device.type, q.dtype, attn_mask is not None, q.shape[-1])) == "expand":
        k, v = expand_kv(k, h), expand_kv(v, h)                         # (B, H, S, hd) each
        grouped = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal and attn_mask is None,
        scale=scale, enable_gqa=grouped)


def core_fn(impl: AttnImpl) -> Kernel:
    """The softmax kernel for ``impl`` (:func:`eager_attention` or :func:`sdpa_attention`); a clear error otherwise."""
    if impl not in ("eager", "sdpa"):
        raise ValueError(f"unknown attention impl {impl!r}")
    return eager_attention if impl == "eager" else sdpa_attention


def head_counts(d_model: int, n_heads: int, n_kv_heads: int | None) -> int:
    """Validate the head layout; returns the number of k/v heads (``None`` means MHA)."""
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if d_model % n_heads:
        raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model})")
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
    return n_kv_heads


class HeadLayout:
    """For a frozen config with ``d_model``, ``n_heads`` and ``n_kv_heads`` (None: MHA): the head layout
    derived from them, and its check, written once."""

    def check_heads(self) -> None:
        """Raise ValueError unless both sizes are positive and the heads divide as :func:`head_counts` needs."""
        for name in ("d_model", "n_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        head_counts(self.d_model, self.n_heads, self.n_kv_heads)

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class Heads:
    """The head layout a core mixes: ``n_heads`` query heads over ``n_kv_heads`` k/v heads of width ``head_dim``."""

    n_heads: int
    n_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, d_model: int, n_heads: int, n_kv_heads: int | None = None) -> Heads:
        return cls(n_heads, head_counts(d_model, n_heads, n_kv_heads), d_model // n_heads)


def exact_mix_macs(batch: int, t: int, n_heads: int, head_dim: int, s: int | None = None) -> int:
    """QKᵀ and AV of full attention of t queries over s (default t) keys; causal is counted full too."""
    return 2 * batch * n_heads * t * (t if s is None else s) * head_dim


class Core(nn.Module):
    """How an :class:`Attention` mixes q (B, H, T, hd) with k, v (B, Hkv, S, hd) into (B, H, T, hd).

    ``forward(q, k, v, bias=None, causal=False, offset=0, dropout_p=0.0, scale=None)``: ``bias`` is an
    additive score bias broadcastable to (B, H, T, S); ``causal`` restricts query ``offset+i`` to keys
    ``j <= offset+i`` (``offset``: the KV-cache length before this call); ``scale`` multiplies q·kᵀ (None:
    1/√hd). A core that cannot honour one of these raises ``ValueError`` rather than ignore it.
    """

    def validate(self, heads: Heads) -> None:
        """Raise ``ValueError`` if this core cannot mix ``heads`` (called once by ``Attention.__init__``)."""

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        """Forward MACs of one call on t queries and s (default t) keys, as :mod:`harness.instruments.flops` counts them."""
        raise NotImplementedError

    def decode_window(self) -> int | None:
        """How a :class:`StaticKVCache` decodes one token for this core: None = exact attention over every
        cached key, w = only the keys at most w positions back (a ring buffer of w + 1 slots holds them); the
        one token is then mixed by ``self.kernel`` under the cache's mask. A core that cannot decode from a
        cache (Linformer, Performer, BigBird, ...) raises ``ValueError``."""
        raise ValueError(f"{type(self).__name__} cannot decode one token from a static KV cache")


class ExactCore(Core):
    """softmax(q·kᵀ·scale + bias)·v over every (visible) key, through the kernel chosen once here.

    ``impl="eager"`` materialises the (B, H, T, S) scores (the reference); ``"sdpa"`` is PyTorch's fused
    kernel, which also takes its own causal flag where no bias or cache offset is in play.
    """

    def __init__(self, impl: AttnImpl = "sdpa") -> None:
        super().__init__()
        self.kernel, self.impl = core_fn(impl), impl
        self.fused_causal = impl == "sdpa"

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        t = q.shape[2]
        if not causal or t == 1:                          # one query at the end of the cache sees every key
            return self.kernel(q, k, v, bias, None, dropout_p, scale)
        if self.fused_causal and offset == 0 and bias is None:   # SDPA's causal flag is top-left aligned
            return sdpa_attention(q, k, v, None, None, dropout_p, scale, is_causal=True)
        return self.kernel(q, k, v, bias, causal_mask(t, k.shape[2], q.device, offset), dropout_p, scale)

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        return exact_mix_macs(batch, t, heads.n_heads, heads.head_dim, s)

    def decode_window(self) -> int | None:
        return None

    def extra_repr(self) -> str:
        return f"impl={self.impl!r}"


class Attention(nn.Module):
    """Multi-head attention with ``n_kv_heads`` key/value heads (MHA, GQA or MQA) and an injected core.

    ``core``: a :class:`Core`, or ``"eager"``/``"sdpa"`` for :class:`ExactCore` with that kernel.
    ``kind="self"`` projects q, k, v from ``x`` with one fused matmul; ``kind="cross"`` takes k, v from
    ``context`` (of width ``context_dim``, default d_model). ``scale`` multiplies q·kᵀ: None is
    1/√head_dim (Vaswani); 1.0 switches the scaling off. ``dropout`` acts on the attention weights.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *,
                 core: Core | AttnImpl = "sdpa", kind: Literal["self", "cross"] = "self",
                 dropout: float = 0.0, bias: bool = True, context_dim: int | None = None,
                 scale: float | None = None) -> None:
        super().__init__()
        self.heads = Heads.of(d_model, n_heads, n_kv_heads)
        self.n_heads, self.n_kv_heads, self.head_dim = self.heads.n_heads, self.heads.n_kv_heads, self.heads.head_dim
        self.core = ExactCore(core) if isinstance(core, str) else core
        self.core.validate(self.heads)
        self.kind, self.dropout, self.scale = kind, dropout, scale
        kv_width = 2 * self.n_kv_heads * self.head_dim
        if kind == "self":
            self.qkv = nn.Linear(d_model, d_model + kv_width, bias=bias)
        elif kind == "cross":
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.kv = nn.Linear(context_dim or d_model, kv_width, bias=bias)
        else:
            raise ValueError(f"unknown attention kind {kind!r}")
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, context: Tensor | None = None, *, causal: bool = False,
                bias: Tensor | None = None, rotate: Rotation | None = None,
                cache: StaticKVCache | None = None) -> Tensor:
        """x: (B, T, d_model); context: (B, S, context_dim) for cross-attention. Returns (B, T, d_model)."""
        b, t, d = x.shape
        hd, h, hkv = self.head_dim, self.n_heads, self.n_kv_heads
        if self.kind == "self":                                           # qkv columns: H, Hkv, Hkv heads
            qkv = self.qkv(x).view(b, t, h + 2 * hkv, hd).transpose(1, 2)   # (B, H+2·Hkv, T, hd)
            q, k, v = qkv.split([h, hkv, hkv], dim=1)                     # (B, H, T, hd), 2 × (B, Hkv, T, hd)
        elif context is None:
            raise ValueError("cross-attention needs a context")
        else:
            q = self.q(x).view(b, t, h, hd).transpose(1, 2)               # (B, H, T, hd)
            kv = self.kv(context).view(b, -1, 2 * hkv, hd).transpose(1, 2)   # (B, 2·Hkv, S, hd)
            k, v = kv.split(hkv, dim=1)                                   # 2 × (B, Hkv, S, hd)
        if rotate is not None:
            offset = cache.span(t)[0] if cache is not None else 0         # an int, or a static cache's 0-d tensor
            q, k = rotate(q, k, offset)
        dropout = self.dropout if self.training else 0.0
        if cache is not None:
            y = cache.mix(self.core, q, k, v, bias, causal, dropout, self.scale)   # (B, H, T, hd)
        else:
            y = self.core(q, k, v, bias, causal, 0, dropout, self.scale)          # (B, H, T, hd)
        return self.out(y.transpose(1, 2).reshape(b, t, h * hd))          # (B, H, T, hd) -> (B, T, d)

    def split_heads(self, rank: int, world: int, reduce: Reduce) -> None:
        """Keep rank ``rank``'s share of the heads, in place (tensor parallelism,
        :mod:`architectures.layers.tensor_parallel`): of the fused ``qkv`` columns (H query heads, then Hkv key heads,
        then Hkv value heads) its H/N query heads and the Hkv/N k/v heads they are grouped over, and of ``out`` the
        input features of its query heads, summed over the ranks by ``reduce``. ``world`` must divide H and Hkv."""
        if self.kind != "self":
            raise ValueError("only self-attention splits its heads over ranks")
        h, hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if h % world or hkv % world:
            raise ValueError(f"{world} ranks do not split {h} query heads and {hkv} k/v heads evenly")
        device = self.qkv.weight.device
        q = share(h * hd, rank, world, device)                            # (H/N·hd,): its query heads' features
        kv = share(hkv * hd, rank, world, device)                         # (Hkv/N·hd,)
        self.qkv = keep_rows(self.qkv, torch.cat([q, h * hd + kv, (h + hkv) * hd + kv]))
        self.out = RowSplitLinear(self.out, q, reduce)
        self.heads = Heads(h // world, hkv // world, hd)
        self.n_heads, self.n_kv_heads = self.heads.n_heads, self.heads.n_kv_heads

    def mix_macs(self, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        """Forward MACs of the core alone (projections excluded) on t queries and s (default t) keys."""
        return self.core.macs(self.heads, batch, t, s, causal)
