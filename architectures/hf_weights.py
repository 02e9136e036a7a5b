"""Hugging Face ``transformers`` models' weights into ours, and their configs into ours: GPT-2, BERT, LLaMA/Mistral.

:func:`ours_config` says which of our configs is the same architecture as a transformers config (GPT-2 →
``DecoderConfig`` with learned positions, GELU-tanh and a tied head; BERT → ``EncoderConfig`` post-norm with
segment embeddings, an embedding LayerNorm and the tanh pooler; LLaMA/Mistral → ``DecoderConfig`` with RoPE,
RMSNorm, SwiGLU, GQA, no biases — Mistral's sliding window included); :func:`ours_state_dict` maps a
transformers state dict onto our parameter names, and :func:`load_hf_weights` loads it, strictly: every one of our
tensors is filled and every transformers parameter is used (tests/test_hf_vs_ours.py then holds the logits and the
greedy tokens of the two equal).

The layouts differ only in packing: our attention has one fused ``qkv`` linear (rows: the query heads, then the
k heads, then the v heads) where transformers has ``q_proj``/``k_proj``/``v_proj`` (BERT: ``query``/``key``/
``value``); our SwiGLU MLP one ``up`` linear whose first half is the gate (``gate_proj``) and second the up
projection (``up_proj``); GPT-2's ``Conv1D`` stores its weights as (in, out), the transpose of a ``Linear``'s.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from architectures.transformer import DecoderConfig, EncoderConfig, TransformerConfig

StateDict = dict[str, Tensor]


def _cat(*tensors: Tensor) -> Tensor:
    return torch.cat(tensors, dim=0)


def _layers(sd: Mapping[str, Tensor], pattern: str) -> int:
    found = {int(m.group(1)) for k in sd if (m := re.match(pattern, k))}
    return max(found) + 1 if found else 0


def _gpt2(sd: Mapping[str, Tensor]) -> StateDict:
    """GPT2LMHeadModel / GPT2Model → our tied ``Decoder`` (Conv1D weights transposed)."""
    p = "transformer." if "transformer.wte.weight" in sd else ""
    out = {"tok.weight": sd[f"{p}wte.weight"], "stack.pos.table.weight": sd[f"{p}wpe.weight"],
           "stack.norm.weight": sd[f"{p}ln_f.weight"], "stack.norm.bias": sd[f"{p}ln_f.bias"]}
    for i in range(_layers(sd, rf"{re.escape(p)}h\.(\d+)\.")):
        h, b = f"{p}h.{i}.", f"stack.blocks.{i}."
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("mlp.up", "mlp.c_fc"),
                             ("mlp.down", "mlp.c_proj")):
            out[f"{b}{ours}.weight"] = sd[f"{h}{theirs}.weight"].t()                # Conv1D: (in, out)
            out[f"{b}{ours}.bias"] = sd[f"{h}{theirs}.bias"]
        for ours, theirs in (("res_attn.norm", "ln_1"), ("res_mlp.norm", "ln_2")):
            out[f"{b}{ours}.weight"], out[f"{b}{ours}.bias"] = sd[f"{h}{theirs}.weight"], sd[f"{h}{theirs}.bias"]
    return out


def _bert(sd: Mapping[str, Tensor]) -> StateDict:
    """BertForSequenceClassification → our ``Encoder`` with segments, embedding norm, tanh pooler and head."""
    p = "bert." if "bert.embeddings.word_embeddings.weight" in sd else ""
    e = f"{p}embeddings."
    out = {"tok.weight": sd[f"{e}word_embeddings.weight"], "segments.weight": sd[f"{e}token_type_embeddings.weight"],
           "stack.pos.table.weight": sd[f"{e}position_embeddings.weight"],
           "stack.embed_norm.weight": sd[f"{e}LayerNorm.weight"], "stack.embed_norm.bias": sd[f"{e}LayerNorm.bias"],
           "pooler.weight": sd[f"{p}pooler.dense.weight"], "pooler.bias": sd[f"{p}pooler.dense.bias"],
           "head.weight": sd["classifier.weight"], "head.bias": sd["classifier.bias"]}
    for i in range(_layers(sd, rf"{re.escape(p)}encoder\.layer\.(\d+)\.")):
        h, b = f"{p}encoder.layer.{i}.", f"stack.blocks.{i}."
        a = f"{h}attention."
        for kind in ("weight", "bias"):
            out[f"{b}attn.qkv.{kind}"] = _cat(*(sd[f"{a}self.{x}.{kind}"] for x in ("query", "key", "value")))
            out[f"{b}attn.out.{kind}"] = sd[f"{a}output.dense.{kind}"]
            out[f"{b}res_attn.norm.{kind}"] = sd[f"{a}output.LayerNorm.{kind}"]
            out[f"{b}mlp.up.{kind}"] = sd[f"{h}intermediate.dense.{kind}"]
            out[f"{b}mlp.down.{kind}"] = sd[f"{h}output.dense.{kind}"]
            out[f"{b}res_mlp.norm.{kind}"] = sd[f"{h}output.LayerNorm.{kind}"]
    return out


def _llama(sd: Mapping[str, Tensor]) -> StateDict:
    """LlamaForCausalLM / MistralForCausalLM → our untied ``Decoder`` (q|k|v and gate|up concatenated)."""
    out = {"tok.weight": sd["model.embed_tokens.weight"], "stack.norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and sd["lm_head.weight"].data_ptr() != out["tok.weight"].data_ptr():
        out["head.weight"] = sd["lm_head.weight"]                                 # untied (tied: no head of ours)
    for i in range(_layers(sd, r"model\.layers\.(\d+)\.")):
        h, b = f"model.layers.{i}.", f"stack.blocks.{i}."
        out[f"{b}attn.qkv.weight"] = _cat(*(sd[f"{h}self_attn.{x}_proj.weight"] for x in "qkv"))
        out[f"{b}attn.out.weight"] = sd[f"{h}self_attn.o_proj.weight"]
        out[f"{b}mlp.up.weight"] = _cat(sd[f"{h}mlp.gate_proj.weight"], sd[f"{h}mlp.up_proj.weight"])
        out[f"{b}mlp.down.weight"] = sd[f"{h}mlp.down_proj.weight"]
        out[f"{b}res_attn.norm.weight"] = sd[f"{h}input_layernorm.weight"]
        out[f"{b}res_mlp.norm.weight"] = sd[f"{h}post_attention_layernorm.weight"]
    return out


MAPPINGS: dict[str, Callable[[Mapping[str, Tensor]], StateDict]] = {
    "gpt2": _gpt2, "bert": _bert, "llama": _llama, "mistral": _llama}
"""transformers model type → the mapping of its state dict onto ours."""


def ours_state_dict(model_type: str, sd: Mapping[str, Tensor]) -> StateDict:
    """``sd`` (a transformers state dict of ``model_type``) under our parameter names; KeyError for a type with no
    mapping, naming those that have one."""
    if model_type not in MAPPINGS:
        raise KeyError(f"no weight mapping for {model_type!r}; mapped: {', '.join(MAPPINGS)}")
    return MAPPINGS[model_type](sd)


class _Reads(dict):
    """A state dict that remembers which keys were read."""

    def __init__(self, sd: Mapping[str, Tensor]) -> None:
        super().__init__(sd)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Tensor:
        self.read.add(key)
        return super().__getitem__(key)


def load_hf_weights(ours: nn.Module, theirs: nn.Module, model_type: str) -> nn.Module:
    """Copy the weights of the transformers model ``theirs`` into ``ours`` (strict: every tensor of ours is
    filled); a ValueError names any parameter of theirs the mapping left unused. Returns ``ours``."""
    sd = _Reads(theirs.state_dict())
    mapped = ours_state_dict(model_type, sd)
    unused = [name for name, _ in theirs.named_parameters() if name not in sd.read]
    if unused:
        raise ValueError(f"the {model_type} mapping leaves parameters of theirs unused: {', '.join(unused[:5])}")
    ours.load_state_dict({k: v.detach().clone() for k, v in mapped.items()}, strict=True)
    return ours


def ours_config(hf_config: Any) -> TransformerConfig:
    """Our config of the same architecture as the transformers config ``hf_config`` (GPT-2, BERT with a
    sequence-classification head, LLaMA, Mistral); ValueError for another model type or a variant we do not build
    (GPT-2 with another activation, biased LLaMA attention, RoPE scaling, …)."""
    c, kind = hf_config, hf_config.model_type
    if kind == "gpt2":
        if c.activation_function != "gelu_new" or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
            raise ValueError("only GPT-2 as released (gelu_new, plain 1/sqrt(d) scaling) has our counterpart")
        return DecoderConfig(vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
                             d_ff=c.n_inner, positions="learned", max_seq_len=c.n_positions, tie_embeddings=True,
                             activation="gelu_tanh", norm_eps=c.layer_norm_epsilon, dropout=0.0)
    if kind == "bert":
        if c.hidden_act != "gelu" or getattr(c, "position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with exact GELU and absolute positions has our counterpart")
        return EncoderConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                             n_heads=c.num_attention_heads, d_ff=c.intermediate_size, positions="learned",
                             max_seq_len=c.max_position_embeddings, norm_placement="post", norm_eps=c.layer_norm_eps,
                             embed_norm=True, token_types=c.type_vocab_size, pool="cls_tanh",
                             n_classes=c.num_labels, dropout=0.0)
    if kind in ("llama", "mistral"):
        rope = dict(c.rope_parameters or {})
        if rope.get("rope_type", "default") != "default" or rope.get("rope_theta", 10000.0) != 10000.0:
            raise ValueError(f"only RoPE with base 10000 and no scaling has our counterpart, got {rope}")
        if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False) or c.hidden_act != "silu":
            raise ValueError("only LLaMA without biases and with SwiGLU has our counterpart")
        if c.head_dim * c.num_attention_heads != c.hidden_size:
            raise ValueError(f"our heads are hidden_size / num_attention_heads wide; head_dim is {c.head_dim}")
        window = getattr(c, "sliding_window", None)     # theirs: a query sees `sliding_window` keys, itself
        window = None if window is None else window - 1  # included; ours: itself + `window` back
        return DecoderConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                             n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                             d_ff=c.intermediate_size, positions="rope", norm="rmsnorm", activation="swiglu",
                             bias=False, norm_eps=c.rms_norm_eps, tie_embeddings=c.tie_word_embeddings,
                             window=window, max_seq_len=c.max_position_embeddings, dropout=0.0)
    raise ValueError(f"no counterpart of ours for transformers model type {kind!r}; mapped: {', '.join(MAPPINGS)}")
