"""The attention operation alone, softmax(q·kᵀ/√d_k)·v, with no projections: what the source documents call
"self-attention" when they say it costs O(n²·d) and stores n² scores.

``forward(q, k, v)`` takes (B, H, n, d_head) tensors and runs the exact core every model here uses
(:class:`~architectures.layers.attention.ExactCore`: :func:`~architectures.layers.attention.eager_attention`,
which materialises the (B, H, n, n) scores, or :func:`~architectures.layers.attention.sdpa_attention`,
PyTorch's fused kernel), so its MACs, latency and memory are exactly the n²-part of a real layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from architectures.inputs import need_seq_len
from architectures.layers.attention import AttnImpl, ExactCore, HeadLayout, Heads, core_fn
from harness.api import ArchSpec, Workload, register


@dataclass(frozen=True)
class AttentionCoreConfig(HeadLayout):
    """Width and heads of the q/k/v tensors (d_head = d_model / n_heads) and the kernel."""

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None          # None: MHA; fewer: GQA/MQA (k, v have n_kv_heads heads)
    attn_impl: AttnImpl = "eager"

    def __post_init__(self) -> None:
        self.check_heads()
        core_fn(self.attn_impl)                                          # validates attn_impl


class AttentionCore(nn.Module):
    """(q (B, H, n, hd), k (B, Hkv, n, hd), v (B, Hkv, n, hd)) -> (B, H, n, hd). No parameters."""

    def __init__(self, cfg: AttentionCoreConfig) -> None:
        super().__init__()
        self.cfg, self.core = cfg, ExactCore(cfg.attn_impl)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.training and torch.is_grad_enabled() and not q.requires_grad:
            # In a real layer q, k, v come out of projections; here they are the leaves the backward
            # pass reaches, so forward+backward times the attention's own backward (dq, dk, dv).
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        return self.core(q, k, v)


def core_inputs(cfg: AttentionCoreConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Reproducible unit-variance q, k, v of shape (B, H or Hkv, seq_len, d_head)."""
    g = torch.Generator().manual_seed(0)
    b, n, hd = w.batch_size, need_seq_len(w), cfg.head_dim
    q = torch.randn(b, cfg.n_heads, n, hd, generator=g)
    k, v = (torch.randn(b, cfg.kv_heads, n, hd, generator=g) for _ in range(2))
    return tuple(t.to(device) for t in (q, k, v))


def core_cost(cfg: AttentionCoreConfig, w: Workload) -> dict[str, int]:
    """q·kᵀ and p·v: B·H·n²·d_head MACs each (softmax counts no MACs); no parameters."""
    heads = Heads.of(cfg.d_model, cfg.n_heads, cfg.n_kv_heads)
    return {"params": 0, "macs": ExactCore(cfg.attn_impl).macs(heads, w.batch_size, need_seq_len(w))}


register(ArchSpec("attention-core", "attention", AttentionCoreConfig(), AttentionCore, core_inputs,
                  "softmax(q·kᵀ/√d_k)·v alone (no projections), d=512, h=8",
                  small=(("d_model", 32), ("n_heads", 2)), cost=core_cost))
