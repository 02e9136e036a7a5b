"""Transformers in three layouts built from the shared layers; presets are data.

* ``decoder`` (GPT-like): causal self-attention, LM head; generated from through the generation protocol
  (a static KV cache: :mod:`harness.engine.generation` runs the one generation loop).
* ``encoder`` (BERT-like): bidirectional self-attention, [CLS] or mean pooling, class logits.
* ``encoder-decoder`` (the original Transformer, T5): the decoder's blocks add cross-attention
  to the encoder's output through the same ``Attention`` (``kind="cross"``).

Each layout has its own frozen config, a subclass of :class:`TransformerConfig` (the fields of one
stack, shared by all three; itself a :class:`LayerConfig`, the fields of one layer) that adds only what
that layout uses — no field is dead in any layout,
and the config's type says which model it builds. Analytic costs live in
:mod:`architectures.transformer_cost`.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from architectures import transformer_cost as cost
from architectures.inputs import seq2seq_inputs, token_inputs
from architectures.layers.attention import Attention, AttnImpl, HeadLayout
from architectures.layers.kv_cache import StaticKVCache, StaticKVState
from architectures.layers.efficient import SlidingWindowCore
from architectures.layers.blocks import MLP, RESIDUALS, Activation, Block, NormKind, make_norm
from architectures.layers.positions import PositionKind, make_positions
from architectures.layers.tensor_parallel import Reduce
from architectures.transformer_cost import kv_cache_bytes  # noqa: F401  (public here too)
from harness.api import ArchSpec, register


@dataclass(frozen=True)
class LayerConfig(HeadLayout):
    """One transformer layer's sizes and axes: attention + MLP, each in its residual wrapper."""

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None          # None: = n_heads (MHA); 1: MQA; else GQA
    d_ff: int | None = None                # None: 4 · d_model
    attn_impl: AttnImpl = "sdpa"
    norm: NormKind = "layernorm"
    norm_placement: Literal["pre", "post"] = "pre"
    activation: Activation = "gelu"
    dropout: float = 0.0                   # sublayer outputs and attention weights (and embeddings in a stack)
    bias: bool = True                      # in the attention and MLP linears
    norm_eps: float = 1e-5                 # every norm's epsilon (BERT: 1e-12)

    def __post_init__(self) -> None:
        self.check_heads()
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


@dataclass(frozen=True)
class TransformerConfig(LayerConfig):
    """One stack's sizes and axes, shared by every layout: a layer's fields plus vocabulary, depth and
    positions; invalid combinations fail at construction."""

    vocab_size: int = 8192
    n_layers: int = 6                      # per stack: an encoder-decoder has n_layers + n_layers
    positions: PositionKind = "sinusoidal"
    max_seq_len: int = 2048                # only bounds learned positions
    embed_norm: bool = False               # a norm on the embeddings, before the first block (BERT)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("vocab_size", "n_layers", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"rope needs an even head dim, got d_model/n_heads = {self.head_dim}")


@dataclass(frozen=True)
class DecoderConfig(TransformerConfig):
    """Decoder-only language model."""

    tie_embeddings: bool = False           # LM head = token embedding (GPT-2)
    window: int | None = None              # causal sliding window (Mistral-style): a token sees itself + `window` back

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window is not None and (isinstance(self.window, bool) or self.window <= 0):
            raise ValueError(f"window must be a positive integer or None, got {self.window}")


@dataclass(frozen=True)
class EncoderConfig(TransformerConfig):
    """Encoder-only classifier."""

    n_classes: int = 2
    # cls: the first token's output; cls_tanh: BERT's pooler, tanh(W·h_cls + b); mean: over tokens
    pool: Literal["cls", "cls_tanh", "mean"] = "cls"
    token_types: int = 0                   # BERT's segment embeddings (2); the inputs are all segment 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_classes <= 0:
            raise ValueError(f"n_classes must be positive, got {self.n_classes}")
        if self.token_types < 0:
            raise ValueError(f"token_types must be >= 0, got {self.token_types}")


@dataclass(frozen=True)
class EncoderDecoderConfig(TransformerConfig):
    """Encoder-decoder over one shared vocabulary; n_layers encoder blocks + n_layers decoder blocks.
    Each stack has its own position scheme instance (two tables if learned); RoPE/ALiBi act in
    self-attention only."""

    tie_embeddings: bool = True            # source embedding = target embedding = LM head (Vaswani §3.4, T5)


# ------------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------------

def make_block(cfg: LayerConfig, cross: bool = False) -> Block:
    """One layer of ``cfg``: self-attention [+ cross-attention] + MLP in the configured residuals."""
    window = getattr(cfg, "window", None)                  # DecoderConfig only

    def attention(kind: Literal["self", "cross"]) -> Attention:
        core = SlidingWindowCore(window, cfg.attn_impl) if window and kind == "self" else cfg.attn_impl
        return Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, core=core, kind=kind,
                         dropout=cfg.dropout, bias=cfg.bias)

    def residual() -> nn.Module:
        return RESIDUALS[cfg.norm_placement](make_norm(cfg.norm, cfg.d_model, cfg.norm_eps), cfg.dropout)

    mlp = MLP(cfg.d_model, cfg.ff_dim, cfg.activation, cfg.dropout, cfg.bias)
    return Block(attention("self"), mlp, residual, attention("cross") if cross else None)


class Stack(nn.Module):
    """Embedded tokens → positions → n_layers blocks → final norm (pre-norm only): (B, T, d) → (B, T, d).

    The position scheme's hooks are evaluated once per forward and handed to every block:
    ``bias`` (ALiBi) and ``rotate`` (RoPE) go to self-attention only, never to cross-attention.
    """

    def __init__(self, cfg: TransformerConfig, *, causal: bool, cross: bool = False) -> None:
        super().__init__()
        self.causal = self.masked_by_design = causal      # counterfactual() may switch ``causal`` off
        self.pos = make_positions(cfg.positions, cfg.d_model, cfg.max_seq_len, cfg.n_heads)
        self.embed_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.embed_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(make_block(cfg, cross) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_placement == "pre" else nn.Identity()

    def forward(self, x: Tensor, context: Tensor | None = None,
                caches: list[StaticKVCache] | None = None) -> Tensor:
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one StaticKVCache per layer ({len(self.blocks)}), got {len(caches)}")
        t = x.shape[1]
        offset, s = caches[0].span(t) if caches else (0, t)               # s: the keys each query attends over
        x = self.pos.embed(x, offset)                                     # (B, T, d)
        x = self.drop(x if self.embed_norm is None else self.embed_norm(x))
        bias = self.pos.bias(t, s, offset, x.device, x.dtype)             # (H, T, S) or None
        for block, cache in zip(self.blocks, caches or repeat(None)):
            x = block(x, context, causal=self.causal, bias=bias, rotate=self.pos.rotate, cache=cache)
        return self.norm(x)                                               # (B, T, d)


def counterfactual(model: nn.Module, *, causal: bool | None = None, attn_scale: float | None | str = "keep"
                   ) -> nn.Module:
    """Switch a built model into a claim's counterfactual, from outside its config (the config describes
    the architecture; these are experiments on it). ``causal=False``: every decoder stack drops its causal
    mask, so a position sees the future (C18); ``True`` restores it (encoder stacks are never masked).
    ``attn_scale=1.0``: every attention, whatever its core, multiplies q·kᵀ by 1 instead of 1/√d_head
    (C07); ``None`` restores 1/√d_head. Parameters are untouched. Returns ``model``."""
    for module in model.modules():
        if causal is not None and isinstance(module, Stack) and module.masked_by_design:
            module.causal = causal
        if attn_scale != "keep" and isinstance(module, Attention):
            module.scale = attn_scale
    return model


def lm_logits(h: Tensor, tok: nn.Embedding, head: nn.Linear | None) -> Tensor:
    """(B, T, d) -> (B, T, vocab), through the token embedding itself when tied (``head is None``).

    Tying is done here rather than by sharing a Parameter between two modules, which fake/meta
    placement (``Module._apply``) would split into two.
    """
    return F.linear(h, tok.weight) if head is None else head(h)


class Decoder(nn.Module):
    """GPT-like language model: tokens (B, T) -> logits (B, T, vocab)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.stack = Stack(cfg, causal=True)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        return lm_logits(self.stack(self.tok(tokens)), self.tok, self.head)

    # The generation protocol (harness.engine.generation): a state made once, a prefill, then one token per decode call.
    @staticmethod
    def cannot_generate(cfg: DecoderConfig) -> str | None:
        """Why ``cfg`` cannot generate, or None."""
        if cfg.window is not None and cfg.positions == "alibi":
            return "a sliding window takes no additive position bias (ALiBi)"
        return None

    def generation_state(self, batch: int, max_len: int) -> StaticKVState:
        """One :class:`StaticKVCache` per layer for sequences of at most ``max_len`` positions (a ring of
        window + 1 slots with a sliding window), on the device and in the dtype of the weights."""
        cfg = self.cfg
        if cfg.positions == "learned" and max_len > cfg.max_seq_len:
            raise ValueError(f"learned positions cover {cfg.max_seq_len} tokens; a generation state of {max_len} "
                             f"positions would pass them (raise max_seq_len or use sinusoidal/rope/alibi positions)")
        return StaticKVState(StaticKVCache(batch, block.attn.n_kv_heads, block.attn.head_dim, max_len, cfg.window,
                                           like=self.tok.weight) for block in self.stack.blocks)   # its own heads

    # Tensor parallelism (harness.engine.tensor_parallel): every block keeps its share of the heads and MLP width.
    @staticmethod
    def cannot_split_heads(cfg: DecoderConfig, world: int) -> str | None:
        """Why ``cfg`` cannot split over ``world`` ranks (Megatron's head and MLP split), or None."""
        for what, n in (("query heads", cfg.n_heads), ("k/v heads", cfg.kv_heads), ("d_ff", cfg.ff_dim)):
            if n % world:
                return f"{world} ranks do not divide its {n} {what}"
        if cfg.positions == "alibi":
            return "ALiBi's bias is made for all the heads at once, not one rank's share"
        return None

    def split_heads(self, rank: int, world: int, reduce: Reduce) -> None:
        """Keep rank ``rank``'s share of every block, in place (:meth:`architectures.layers.blocks.Block.split_heads`);
        the embeddings, norms and LM head stay whole on every rank."""
        reason = self.cannot_split_heads(self.cfg, world)
        if reason:
            raise ValueError(reason)
        for block in self.stack.blocks:
            block.split_heads(rank, world, reduce)

    def prefill(self, tokens: Tensor, state: StaticKVState) -> Tensor:
        """Empty ``state`` and run the prompt (B, T) into it -> logits of its last position (B, vocab)."""
        for cache in state:
            cache.reset()
        h = self.stack(self.tok(tokens), caches=list(state))              # (B, T, d)
        return lm_logits(h[:, -1], self.tok, self.head)                   # (B, vocab): the last position only

    def decode(self, token: Tensor, state: StaticKVState) -> Tensor:
        """One token (B, 1) after those in ``state`` (written into it) -> its logits (B, vocab)."""
        h = self.stack(self.tok(token), caches=list(state))               # (B, 1, d)
        return lm_logits(h[:, -1], self.tok, self.head)                   # (B, vocab)


class Encoder(nn.Module):
    """BERT-like classifier: tokens (B, T) -> class logits (B, n_classes)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.segments = nn.Embedding(cfg.token_types, cfg.d_model) if cfg.token_types else None
        self.stack = Stack(cfg, causal=False)
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if cfg.pool == "cls_tanh" else None
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def features(self, tokens: Tensor) -> Tensor:                         # (B, T) -> (B, T, d)
        x = self.tok(tokens)                                              # (B, T, d)
        if self.segments is not None:
            x = x + self.segments.weight[0]                               # every token in segment 0
        return self.stack(x)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.features(tokens)                                         # (B, T, d)
        pooled = h.mean(dim=1) if self.cfg.pool == "mean" else h[:, 0]    # (B, d)
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))                      # (B, d)
        return self.head(pooled)                                          # (B, n_classes)


class EncoderDecoder(nn.Module):
    """The original Transformer: (src (B, S), tgt (B, T)) -> logits (B, T, vocab)."""

    def __init__(self, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)              # source (and, tied, target)
        self.tgt_tok = None if cfg.tie_embeddings else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, causal=False)
        self.decoder = Stack(cfg, causal=True, cross=True)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def encode(self, src: Tensor) -> Tensor:                              # (B, S) -> (B, S, d)
        return self.encoder(self.tok(src))

    def decode(self, tgt: Tensor, memory: Tensor, caches: list[StaticKVCache] | None = None) -> Tensor:
        """tgt (B, T), memory (B, S, d) -> logits (B, T, vocab); with ``caches`` (one per decoder layer), a prompt
        and then one token per call, as a generation's prefill and decode steps feed them."""
        tok = self.tok if self.tgt_tok is None else self.tgt_tok
        return lm_logits(self.decoder(tok(tgt), memory, caches), tok, self.head)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src))


# ------------------------------------------------------------------------------------------------
# Presets: data, named by their axes; `small` shrinks every one for tests and smoke runs
# ------------------------------------------------------------------------------------------------

_D_SMALL = dict(d_model=512, n_layers=6, n_heads=8)

DECODERS: dict[str, DecoderConfig] = {
    "decoder-tiny": DecoderConfig(vocab_size=1024, d_model=128, n_layers=2, n_heads=4),
    "decoder-small": DecoderConfig(**_D_SMALL),
    "decoder-gqa2-small": DecoderConfig(**_D_SMALL, n_kv_heads=2),
    "decoder-mqa-small": DecoderConfig(**_D_SMALL, n_kv_heads=1),
    "decoder-rope-small": DecoderConfig(**_D_SMALL, positions="rope"),
    "decoder-alibi-small": DecoderConfig(**_D_SMALL, positions="alibi"),
    # LLaMA's axes at decoder-small size: RoPE, RMSNorm, SwiGLU (d_ff: 8/3·d rounded up to a multiple
    # of 256, as LLaMA does), GQA, no biases, untied head.
    "decoder-llama-small": DecoderConfig(**_D_SMALL, n_kv_heads=2, positions="rope", norm="rmsnorm",
                                         activation="swiglu", d_ff=1536, bias=False),
    "decoder-base": DecoderConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12),
    # GPT-2 small: 124,439,808 parameters, exactly as released; GELU in its tanh approximation (GPT-2's
    # "gelu_new"). Weight for weight the same model as transformers' GPT2LMHeadModel (tests/test_hf_vs_ours.py).
    "gpt2-small": DecoderConfig(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, positions="learned",
                                max_seq_len=1024, tie_embeddings=True, activation="gelu_tanh"),
}

ENCODERS: dict[str, EncoderConfig] = {
    "encoder-small": EncoderConfig(**_D_SMALL, positions="learned", max_seq_len=512, norm_placement="post"),
    # BERT-base sizes (Devlin et al.): 108,890,114 parameters vs BertModel's 109,482,240 — we have no
    # token-type embeddings (1,536), embedding LayerNorm (1,536) or tanh pooler (590,592); + a 2-class head.
    "encoder-base": EncoderConfig(vocab_size=30522, d_model=768, n_layers=12, n_heads=12, positions="learned",
                                  max_seq_len=512, norm_placement="post"),
    # BERT-base as released, with a 2-class head: segment embeddings, embedding LayerNorm, tanh pooler,
    # LayerNorm eps 1e-12 — 109,483,778 parameters = transformers' BertForSequenceClassification (BertModel's
    # 109,482,240 + 1,538), and weight for weight the same model (tests/test_hf_vs_ours.py).
    "bert-base": EncoderConfig(vocab_size=30522, d_model=768, n_layers=12, n_heads=12, positions="learned",
                               max_seq_len=512, norm_placement="post", norm_eps=1e-12, embed_norm=True,
                               token_types=2, pool="cls_tanh"),
}

ENCODER_DECODERS: dict[str, EncoderDecoderConfig] = {
    # T5-small's sizes and axes (vocab 32128, 6+6 layers, d_ff 2048, RMSNorm, pre-norm, ReLU, no biases,
    # tied): 60,506,112 parameters vs T5-small's 60,506,624 — T5's two learned relative-position bias
    # tables (32 buckets × 8 heads each) are the 512 missing; ALiBi is the parameter-free additive bias here.
    "encdec-small": EncoderDecoderConfig(vocab_size=32128, d_model=512, n_layers=6, n_heads=8, d_ff=2048,
                                         positions="alibi", norm="rmsnorm", activation="relu", bias=False),
    # "Attention Is All You Need" (Vaswani et al. 2017, Table 3): shared 37000-token BPE vocabulary,
    # post-norm, sinusoidal, ReLU, P_drop 0.1 / 0.3 (EN-DE big), embeddings tied 3 ways (§3.4).
    # 63,082,496 / 214,245,376 parameters vs the paper's 65M / 213M (untied output projection:
    # 82.0M / 252.1M). Not modelled (no parameters): the √d_model embedding scale, label smoothing.
    "aiayn-base": EncoderDecoderConfig(vocab_size=37000, d_model=512, n_layers=6, n_heads=8, d_ff=2048,
                                       norm_placement="post", activation="relu", dropout=0.1),
    "aiayn-big": EncoderDecoderConfig(vocab_size=37000, d_model=1024, n_layers=6, n_heads=16, d_ff=4096,
                                      norm_placement="post", activation="relu", dropout=0.3),
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2), ("n_heads", 4))


def _small(cfg: TransformerConfig) -> tuple[tuple[str, object], ...]:
    extra = (("n_kv_heads", min(cfg.kv_heads, 2)),) if cfg.n_kv_heads is not None else ()
    return SMALL + extra + ((("d_ff", 64),) if cfg.d_ff is not None else ())


def learned_max_len(cfg: TransformerConfig) -> int | None:
    """The longest sequence a config can take: ``max_seq_len`` with learned positions, unbounded otherwise."""
    return cfg.max_seq_len if cfg.positions == "learned" else None


def _describe(cfg: TransformerConfig) -> str:
    return (f"d={cfg.d_model}, L={cfg.n_layers}, h={cfg.n_heads}, kv={cfg.kv_heads}, "
            f"d_ff={cfg.ff_dim}, {cfg.positions}, {cfg.norm_placement}-{cfg.norm}, {cfg.activation}")


def _register() -> None:
    families = [("decoder", DECODERS, Decoder, token_inputs, cost.decoder_cost),
                ("encoder", ENCODERS, Encoder, token_inputs, cost.encoder_cost),
                ("encoder-decoder", ENCODER_DECODERS, EncoderDecoder, seq2seq_inputs, cost.encoder_decoder_cost)]
    for layout, presets, model, inputs, cost_fn in families:
        for name, cfg in presets.items():
            register(ArchSpec(name, layout, cfg, model, inputs, _describe(cfg), small=_small(cfg),
                              cost=cost_fn, max_len=learned_max_len))


PRESETS: dict[str, TransformerConfig] = {**DECODERS, **ENCODERS, **ENCODER_DECODERS}
_register()
