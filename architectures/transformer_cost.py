"""Analytic cost of the transformer layouts: exact parameter counts, forward MACs, KV-cache bytes.

MACs follow :func:`harness.instruments.flops.count_model` (eval, no_grad): only matmuls count — every linear
(bias adds are free), QKᵀ and AV over the *full* T×S score matrix even when causal, with the
query heads (H·hd = d_model) under GQA/MQA, and the LM or classification head. Embedding lookups,
positions (sinusoidal, learned, RoPE, ALiBi), norms, softmax, activations and pooling count 0.
Checked against the counter on fake tensors and against ``count_params`` by tests/test_transformer.py.

Functions take any config with the fields of ``architectures.transformer.TransformerConfig`` (the
per-layer ones, of its base ``LayerConfig``) — duck-typed, so this module needs nothing from it.
"""
from __future__ import annotations

from typing import Any

from architectures.inputs import need_seq_len
from architectures.layers.attention import exact_mix_macs
from harness.api import Workload


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _widths(cfg: Any) -> tuple[int, int, int]:
    """d_model, the fused k+v projection width 2·Hkv·hd, and the MLP's first-layer width."""
    up = cfg.ff_dim * (2 if cfg.activation == "swiglu" else 1)
    return cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, up


def norm_params(cfg: Any) -> int:
    return 2 * cfg.d_model if cfg.norm == "layernorm" else cfg.d_model


def attention_params(cfg: Any) -> int:
    """Self- and cross-attention alike: q (d→d), k and v (d→Hkv·hd each), out (d→d). Reads only d_model,
    n_heads/kv_heads/head_dim and bias."""
    d, kv = cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim
    return _linear(d, d + kv, cfg.bias) + _linear(d, d, cfg.bias)


def attention_linear_macs(cfg: Any, tokens: int) -> int:
    """The q/k/v and out projections of self-attention on ``tokens`` tokens (the core's mixing excluded)."""
    d, kv = cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim
    return tokens * (d * (d + kv) + d * d)


def mlp_params(cfg: Any) -> int:
    d, _, up = _widths(cfg)
    return _linear(d, up, cfg.bias) + _linear(cfg.ff_dim, d, cfg.bias)


def mlp_macs(cfg: Any, tokens: int) -> int:
    d, _, up = _widths(cfg)
    return tokens * (d * up + cfg.ff_dim * d)


def block_params(cfg: Any, cross: bool = False) -> int:
    """One layer: self-attention [+ cross-attention] + MLP, each sublayer with its norm."""
    return attention_params(cfg) * (2 if cross else 1) + mlp_params(cfg) + norm_params(cfg) * (3 if cross else 2)


def block_macs(cfg: Any, batch: int, t: int, s_context: int | None = None, kv_len: int | None = None) -> int:
    """Forward MACs of one layer on (batch, t) tokens; ``s_context``: the encoder length for cross-attention;
    ``kv_len``: the keys each query attends to (default t; a cached decode step attends to cache + new)."""
    d, kv, _ = _widths(cfg)
    macs = attention_linear_macs(cfg, batch * t) + mlp_macs(cfg, batch * t)
    macs += exact_mix_macs(batch, t, cfg.n_heads, cfg.head_dim, kv_len)   # QKᵀ and AV, all query heads
    if s_context is not None:
        macs += batch * t * 2 * d * d + batch * s_context * d * kv         # cross q/out; k/v of the context
        macs += exact_mix_macs(batch, t, cfg.n_heads, cfg.head_dim, s_context)   # cross QKᵀ and AV
    return macs


def stack_params(cfg: Any, cross: bool = False) -> int:
    """Positions + embedding norm (if any) + n_layers blocks + final norm (pre-norm)."""
    positions = cfg.max_seq_len * cfg.d_model if cfg.positions == "learned" else 0
    final = norm_params(cfg) if cfg.norm_placement == "pre" else 0
    embed = norm_params(cfg) if getattr(cfg, "embed_norm", False) else 0
    return positions + embed + cfg.n_layers * block_params(cfg, cross) + final


def stack_macs(cfg: Any, batch: int, t: int, s_context: int | None = None, kv_len: int | None = None) -> int:
    """Forward MACs of one stack on (batch, t) tokens: n_layers × :func:`block_macs`."""
    return cfg.n_layers * block_macs(cfg, batch, t, s_context, kv_len)


def kv_cache_bytes(cfg: Any, batch: int, seq_len: int, dtype_bytes: int) -> int:
    """Bytes of a decoder's self-attention KV cache holding ``seq_len`` positions:
    2 (K and V) · n_layers · batch · seq_len · n_kv_heads · head_dim · dtype_bytes."""
    return 2 * cfg.n_layers * batch * seq_len * cfg.kv_heads * cfg.head_dim * dtype_bytes


def decoder_params(cfg: Any) -> int:
    head = 0 if cfg.tie_embeddings else cfg.d_model * cfg.vocab_size
    return cfg.vocab_size * cfg.d_model + stack_params(cfg) + head


def encoder_params(cfg: Any) -> int:
    """Token (+ segment) embeddings, the stack, the pooler (``cls_tanh``) and the class head."""
    pooler = _linear(cfg.d_model, cfg.d_model, True) if cfg.pool == "cls_tanh" else 0
    return ((cfg.vocab_size + cfg.token_types) * cfg.d_model + stack_params(cfg) + pooler
            + _linear(cfg.d_model, cfg.n_classes, True))


def encoder_decoder_params(cfg: Any) -> int:
    embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 3)   # src, tgt, LM head
    return embeddings + stack_params(cfg) + stack_params(cfg, cross=True)


def decoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    t = need_seq_len(w)
    macs = stack_macs(cfg, w.batch_size, t) + w.batch_size * t * cfg.d_model * cfg.vocab_size
    return {"params": decoder_params(cfg), "macs": macs,
            "kv_cache_bytes": kv_cache_bytes(cfg, w.batch_size, t, w.itemsize)}


def encoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    pooler = w.batch_size * cfg.d_model * cfg.d_model if cfg.pool == "cls_tanh" else 0
    macs = stack_macs(cfg, w.batch_size, need_seq_len(w)) + pooler + w.batch_size * cfg.d_model * cfg.n_classes
    return {"params": encoder_params(cfg), "macs": macs}


def encoder_decoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    """Source and target both of ``seq_len`` tokens (as ``seq2seq_inputs`` makes them)."""
    t = need_seq_len(w)
    macs = (stack_macs(cfg, w.batch_size, t) + stack_macs(cfg, w.batch_size, t, s_context=t)
            + w.batch_size * t * cfg.d_model * cfg.vocab_size)
    return {"params": encoder_decoder_params(cfg), "macs": macs}
