"""Analytic cost of the transformer layouts: exact parameter counts, forward MACs, KV-cache bytes.

MACs follow :func:`harness.flops.count_model` (eval, no_grad): only matmuls count — every linear
(bias adds are free), QKᵀ and AV over the *full* T×S score matrix even when causal, with the
query heads (H·hd = d_model) under GQA/MQA, and the LM or classification head. Embedding lookups,
positions (sinusoidal, learned, RoPE, ALiBi), norms, softmax, activations and pooling count 0.
Checked against the counter on fake tensors and against ``count_params`` by tests/test_transformer.py.

Functions take any config with the fields of ``architectures.transformer.TransformerConfig``
(duck-typed, so this module needs nothing from it).
"""
from __future__ import annotations

from typing import Any

from harness.spec import Workload


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _widths(cfg: Any) -> tuple[int, int, int]:
    """d_model, the fused k+v projection width 2·Hkv·hd, and the MLP's first-layer width."""
    up = cfg.ff_dim * (2 if cfg.activation == "swiglu" else 1)
    return cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, up


def norm_params(cfg: Any) -> int:
    return 2 * cfg.d_model if cfg.norm == "layernorm" else cfg.d_model


def attention_params(cfg: Any) -> int:
    """Self- and cross-attention alike: q (d→d), k and v (d→Hkv·hd each), out (d→d)."""
    d, kv, _ = _widths(cfg)
    return _linear(d, d + kv, cfg.bias) + _linear(d, d, cfg.bias)


def mlp_params(cfg: Any) -> int:
    d, _, up = _widths(cfg)
    return _linear(d, up, cfg.bias) + _linear(cfg.ff_dim, d, cfg.bias)


def stack_params(cfg: Any, cross: bool = False) -> int:
    """Positions + n_layers blocks (2 or 3 residual sublayers, each with its norm) + final norm (pre-norm)."""
    block = attention_params(cfg) * (2 if cross else 1) + mlp_params(cfg) + norm_params(cfg) * (3 if cross else 2)
    positions = cfg.max_seq_len * cfg.d_model if cfg.positions == "learned" else 0
    final = norm_params(cfg) if cfg.norm_placement == "pre" else 0
    return positions + cfg.n_layers * block + final


def stack_macs(cfg: Any, batch: int, t: int, s_context: int | None = None, kv_len: int | None = None) -> int:
    """Forward MACs of one stack on (batch, t) tokens; ``s_context``: the encoder length for cross-attention;
    ``kv_len``: the keys each query attends to (default t; a cached decode step attends to cache + new)."""
    d, kv, up = _widths(cfg)
    tokens = batch * t
    block = tokens * (d * (d + kv) + d * d)                 # self-attention projections
    block += 2 * batch * t * (t if kv_len is None else kv_len) * d   # QKᵀ and AV, all query heads
    block += tokens * (d * up + cfg.ff_dim * d)             # MLP
    if s_context is not None:
        block += tokens * 2 * d * d + batch * s_context * d * kv   # cross q/out; k/v of the context
        block += 2 * batch * t * s_context * d                     # cross QKᵀ and AV
    return cfg.n_layers * block


def kv_cache_bytes(cfg: Any, batch: int, seq_len: int, dtype_bytes: int) -> int:
    """Bytes of a decoder's self-attention KV cache holding ``seq_len`` positions:
    2 (K and V) · n_layers · batch · seq_len · n_kv_heads · head_dim · dtype_bytes."""
    return 2 * cfg.n_layers * batch * seq_len * cfg.kv_heads * cfg.head_dim * dtype_bytes


def _seq(w: Workload) -> int:
    if w.seq_len is None:
        raise ValueError("a transformer workload needs seq_len")
    return w.seq_len


def decoder_params(cfg: Any) -> int:
    head = 0 if cfg.tie_embeddings else cfg.d_model * cfg.vocab_size
    return cfg.vocab_size * cfg.d_model + stack_params(cfg) + head


def encoder_params(cfg: Any) -> int:
    return cfg.vocab_size * cfg.d_model + stack_params(cfg) + _linear(cfg.d_model, cfg.n_classes, True)


def encoder_decoder_params(cfg: Any) -> int:
    embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 3)   # src, tgt, LM head
    return embeddings + stack_params(cfg) + stack_params(cfg, cross=True)


def decoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    t = _seq(w)
    macs = stack_macs(cfg, w.batch_size, t) + w.batch_size * t * cfg.d_model * cfg.vocab_size
    return {"params": decoder_params(cfg), "macs": macs,
            "kv_cache_bytes": kv_cache_bytes(cfg, w.batch_size, t, w.torch_dtype.itemsize)}


def encoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    macs = stack_macs(cfg, w.batch_size, _seq(w)) + w.batch_size * cfg.d_model * cfg.n_classes
    return {"params": encoder_params(cfg), "macs": macs}


def encoder_decoder_cost(cfg: Any, w: Workload) -> dict[str, int]:
    """Source and target both of ``seq_len`` tokens (as ``seq2seq_inputs`` makes them)."""
    t = _seq(w)
    macs = (stack_macs(cfg, w.batch_size, t) + stack_macs(cfg, w.batch_size, t, s_context=t)
            + w.batch_size * t * cfg.d_model * cfg.vocab_size)
    return {"params": encoder_decoder_params(cfg), "macs": macs}
