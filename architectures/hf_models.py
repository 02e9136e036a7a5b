"""``hf:<model_type>`` — any Hugging Face ``transformers`` architecture, built from its config class alone.

``transformers`` is an optional extra (``pip install -c constraints.txt -e '.[hf]'``): this module imports without
it, and only resolving or building an ``hf:`` name imports it (``hf:llama`` without it is one-line bad input).

**Nothing is downloaded.** ``hf:llama`` is ``AutoConfig.for_model("llama", **fields)`` and
``AutoModelForCausalLM.from_config(config)``: local code, random weights (drawn cheaply by the harness like any
model's). A name that would need the Hub (``hf:meta-llama/Llama-2-7b``: an ``owner/name``) is refused, saying
how to give the shape instead.

**The config.** Each model type gets a frozen dataclass (:func:`config_class`) whose fields are its transformers
config class's own fields with scalar defaults (``hidden_size``, ``num_hidden_layers``, ``num_key_value_heads``,
``rope_theta``-like floats, activation names, dropouts …), so ``--set`` and suite keys reach them as they reach
any architecture's config, plus ``head`` (:data:`HEADS`: which ``AutoModel…`` class is built). A field the
class does not have, or a shape its validators refuse (hidden size not divisible by the heads), is one line of
bad input when the case is resolved, before anything runs or is stored. Fields left at their default are not
passed, so derived fields (``head_dim`` from ``hidden_size``) follow the ones set.

**Presets** (:data:`PRESETS`) name a released checkpoint only where the model type's default config *is* its
shape, counted (tests/test_hf_models.py): ``hf:gpt2``, ``hf:bert-base-uncased``, ``hf:llama-2-7b``,
``hf:mistral-7b-v0.1``. Any other model type is reached by its name (``hf:qwen2``, ``hf:opt``) and its default
config, whatever size that is.

**Modes.** The module (:class:`HFModel`) returns one tensor: the logits of a language model or classifier,
else the last hidden state; forward passes run without a KV cache (``use_cache=False``). A causal LM implements
the generation protocol (:data:`harness.contract.spec.GENERATION_PROTOCOL`) over transformers' own
``StaticCache`` (:class:`HFStaticState`): prefill the prompt with its logits at the last position only
(``logits_to_keep=1``), then one token per decode call; the cache advances its position itself.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from dataclasses import dataclass
from functools import cache
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from architectures.inputs import image_inputs, seq2seq_inputs, token_inputs
from harness.api import ArchSpec, BenchInputError, Workload, register_namespace

HF_MISSING = "transformers is not installed: pip install -c constraints.txt -e '.[hf]'"
Head = Literal["auto", "causal-lm", "base", "sequence-classification", "seq2seq-lm"]
HEADS: tuple[str, ...] = typing.get_args(Head)
"""Which model is built: ``auto`` (a causal LM where transformers has one and the type is no masked-LM encoder;
a seq2seq LM for an encoder-decoder; else the base model), or one named (``AutoModelForCausalLM``, ``AutoModel``,
``AutoModelForSequenceClassification`` with the config's labels (2 by default), ``AutoModelForSeq2SeqLM``)."""


@dataclass(frozen=True)
class Preset:
    """A released checkpoint whose shape is a model type's default config."""

    model_type: str
    head: str
    released: str          # the Hub name of the release, for the description only (never fetched)
    params: int            # its parameter count, as released (tests count the built model against it)
    fields: tuple[tuple[str, Any], ...] = ()   # the release's values where the default config's differ (no size)


PRESETS: dict[str, Preset] = {
    "gpt2": Preset("gpt2", "causal-lm", "openai-community/gpt2", 124_439_808),
    "bert-base-uncased": Preset("bert", "base", "google-bert/bert-base-uncased", 109_482_240),
    # LlamaConfig() is LLaMA-1's 7B: the same sizes; Llama-2 has 4096 positions and RMSNorm eps 1e-5.
    "llama-2-7b": Preset("llama", "causal-lm", "meta-llama/Llama-2-7b-hf", 6_738_415_616,
                         (("max_position_embeddings", 4096), ("rms_norm_eps", 1e-5))),
    # MistralConfig() is v0.1's shape with 131072 positions; v0.1 declares 32768.
    "mistral-7b-v0.1": Preset("mistral", "causal-lm", "mistralai/Mistral-7B-v0.1", 7_241_732_096,
                              (("max_position_embeddings", 32768),)),
}


def _transformers() -> ModuleType:
    """transformers, imported on first use (its own warnings silenced: a default config's token ids past a
    shrunk vocabulary are no concern of a benchmark); a BenchInputError saying how to install it when missing."""
    try:
        import transformers          # noqa: PLC0415 — an optional extra (see the module's docstring)
    except ImportError:
        raise BenchInputError(HF_MISSING, where="arch") from None
    transformers.logging.set_verbosity_error()
    return transformers


def _auto() -> ModuleType:
    return _transformers().models.auto.modeling_auto


@dataclass(frozen=True)
class HFConfig:
    """The base of every ``hf:`` config (:func:`config_class` adds the model type's own fields)."""

    model_type: ClassVar[str] = ""
    head: Head = "auto"

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        self.hf_config()                                    # the config class's own validation, now
        heads, kv = (getattr(self.hf_config(), k, None) for k in ("num_attention_heads", "num_key_value_heads"))
        if isinstance(heads, int) and isinstance(kv, int) and (kv <= 0 or heads % kv):
            raise ValueError(f"num_key_value_heads ({kv}) must divide num_attention_heads ({heads})")
        if self.built_head() not in _heads_of(self.model_type):
            raise ValueError(f"transformers has no {self.head} model for {self.model_type!r}; heads: "
                             f"{', '.join(_heads_of(self.model_type))}")

    def changed(self) -> dict[str, Any]:
        """The transformers fields set away from their default (what is passed to the config class)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "head" and getattr(self, f.name) != f.default}

    def hf_config(self) -> Any:
        """The transformers config (``AutoConfig.for_model``); ValueError in one line if the class refuses it."""
        return _hf_config(self.model_type, tuple(sorted(self.changed().items(), key=lambda kv: kv[0])))

    def built_head(self) -> str:
        """``head``, with ``auto`` resolved (see :data:`HEADS`)."""
        return default_head(self.model_type) if self.head == "auto" else self.head

    @property
    def max_seq_len(self) -> int | None:
        """The longest generation (prompt + new tokens) of a model with a learned position table, None for one
        without (what :func:`harness.contract.spec.check_workload` reads); a model type with a ``max_seq_len`` field
        of its own shadows it."""
        return _max_len(self)


@cache
def _hf_config(model_type: str, fields: tuple[tuple[str, Any], ...]) -> Any:
    try:
        return _transformers().AutoConfig.for_model(model_type, **dict(fields))
    except BenchInputError:
        raise
    except Exception as exc:  # noqa: BLE001 — transformers' validators raise several types; each is one line here
        first = next((line.strip() for line in reversed(str(exc).splitlines()) if line.strip()), type(exc).__name__)
        raise ValueError(f"transformers' {model_type} config refuses it: {first}") from None


@cache
def _heads_of(model_type: str) -> tuple[str, ...]:
    auto = _auto()
    maps = {"causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "base": auto.MODEL_MAPPING_NAMES,
            "sequence-classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
            "seq2seq-lm": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}
    return tuple(h for h, names in maps.items() if model_type in names)


def default_head(model_type: str) -> str:
    """``auto``'s choice for ``model_type``: a seq2seq LM (encoder-decoders), else a causal LM unless the type is a
    masked-LM encoder (BERT's ``BertLMHeadModel`` is a decoder made of an encoder), else the base model."""
    heads = _heads_of(model_type)
    if "seq2seq-lm" in heads:
        return "seq2seq-lm"
    if "causal-lm" in heads and model_type not in _auto().MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "causal-lm"
    return "base"


_SCALARS = (int, float, bool, str, type(None))


def _hint(annotation: Any) -> Any:
    """A config field's annotation as a type the registry's checks read (strings and the like: ``Any``)."""
    if isinstance(annotation, type) or isinstance(annotation, types.UnionType):
        return annotation
    return Any


@cache
def config_class(model_type: str) -> type[HFConfig]:
    """The frozen config dataclass of ``hf:<model_type>``: the transformers class's own fields (those the
    generic ``PreTrainedConfig`` does not have) whose defaults are scalars, each with its default."""
    transformers = _transformers()
    cls = transformers.CONFIG_MAPPING[model_type]
    base = {f.name for f in dataclasses.fields(transformers.PreTrainedConfig)}
    own = [f for f in dataclasses.fields(cls)
           if f.init and f.name not in base and isinstance(f.default, _SCALARS) and not f.name.startswith("_")]
    fields = [(f.name, _hint(f.type), dataclasses.field(default=f.default)) for f in own]
    name = "HF" + "".join(part.title() for part in model_type.replace("-", "_").split("_")) + "Config"
    return dataclasses.make_dataclass(name, fields, bases=(HFConfig,), frozen=True,
                                      namespace={"model_type": model_type, "__module__": __name__})


# -- the model ----------------------------------------------------------------------------------------------
def _model_class(cfg: HFConfig) -> Any:
    auto = _transformers()
    return {"causal-lm": auto.AutoModelForCausalLM, "base": auto.AutoModel,
            "sequence-classification": auto.AutoModelForSequenceClassification,
            "seq2seq-lm": auto.AutoModelForSeq2SeqLM}[cfg.built_head()]


class HFStaticState(nn.Module):
    """A transformers ``StaticCache`` as a generation state: it reports the bytes it holds (``nbytes``) and those a
    decode step must move at least (``step_bytes``), as :class:`architectures.layers.kv_cache.StaticKVState` does.
    The cache allocates its layers on the first prefill (transformers' lazy initialisation, on the weights'
    device and dtype)."""

    def __init__(self, cache: Any) -> None:
        super().__init__()
        self.cache = cache

    def _layers(self) -> list[Any]:
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self._layers())

    def step_bytes(self, context: int) -> int:
        """Per layer: the k/v of the (at most ``slots - 1``) earlier positions read, and the new one written."""
        total = 0
        for layer in self._layers():
            slot = layer.keys[:, :, 0].nbytes + layer.values[:, :, 0].nbytes
            total += (min(context, layer.keys.shape[2] - 1) + 1) * slot
        return total


class HFModel(nn.Module):
    """A transformers model behind the harness's plain interface: ``forward(*inputs)`` -> one tensor (the logits,
    else the last hidden state); token ids (B, T), a (source, target) pair for an encoder-decoder, or images."""

    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.cfg = cfg
        config = cfg.hf_config()
        self.model = _model_class(cfg).from_config(config)
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        accepted = inspect.signature(self.model.forward).parameters
        self.kwargs = {"use_cache": False} if "use_cache" in accepted else {}
        self.keeps_logits = "logits_to_keep" in accepted

    def forward(self, *inputs: Tensor) -> Tensor:
        x = inputs[0]
        if x.is_floating_point():
            out = self.model(pixel_values=x, **self.kwargs)                       # images (B, C, S, S)
        elif self.encoder_decoder:
            out = self.model(input_ids=x, decoder_input_ids=inputs[1], **self.kwargs)   # (B, S), (B, T)
        else:
            out = self.model(input_ids=x, **self.kwargs)                          # (B, T)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state          # (B, T, V) / (B, C) / (B, T, d)

    # The generation protocol (harness.engine.generation), for a causal LM.
    @staticmethod
    def cannot_generate(cfg: HFConfig) -> str | None:
        """Why ``cfg`` cannot generate here, or None."""
        head = cfg.built_head()
        return None if head == "causal-lm" else f"its {head} model is no causal LM (set head = \"causal-lm\")"

    def generation_state(self, batch: int, max_len: int) -> HFStaticState:
        """A ``StaticCache`` of ``max_len`` positions (sliding-window layers keep their window)."""
        return HFStaticState(_transformers().StaticCache(config=self.model.config, max_cache_len=max_len))

    def _step(self, tokens: Tensor, state: HFStaticState) -> Tensor:
        keep = {"logits_to_keep": 1} if self.keeps_logits else {}
        out = self.model(input_ids=tokens, cache=state.cache, use_cache=True, **keep)
        return out.logits[:, -1]                                                  # (B, vocab)

    def prefill(self, tokens: Tensor, state: HFStaticState) -> Tensor:
        """Empty ``state`` and run the prompt (B, T) into it -> logits of its last position (B, vocab)."""
        state.cache.reset()
        return self._step(tokens, state)

    def decode(self, token: Tensor, state: HFStaticState) -> Tensor:
        """One token (B, 1) after those in ``state`` (written into it) -> its logits (B, vocab)."""
        return self._step(token, state)


# -- inputs, bounds, names ---------------------------------------------------------------------------------
def make_inputs(cfg: HFConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """Token ids below the vocabulary (a source/target pair for an encoder-decoder), or images of the config's
    ``image_size`` and ``num_channels`` (a workload's ``img_size`` overrides the side)."""
    config = cfg.hf_config()
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        pair = bool(getattr(config, "is_encoder_decoder", False))
        return (seq2seq_inputs if pair else token_inputs)(SimpleNamespace(vocab_size=vocab), w, device)
    side = getattr(config, "image_size", None)
    if isinstance(side, int):
        images = image_inputs(SimpleNamespace(img_size=side), w, device)[0]            # (B, 3, S, S)
        channels = getattr(config, "num_channels", 3)
        return (images[:, :1].expand(-1, channels, -1, -1).contiguous() if channels != 3 else images,)
    raise BenchInputError(f"hf:{cfg.model_type} takes neither token ids (no vocab_size) nor images (no "
                          "image_size): bench cannot make its inputs", where="arch")


def learned_positions(cfg: HFConfig) -> int | None:
    """The positions a model with a learned position table can take (GPT-2's ``n_positions``, BERT's
    ``max_position_embeddings``), None for RoPE and other schemes without one: found as an embedding table of
    that many rows in the model built on the meta device."""
    config = cfg.hf_config()
    limit = next((getattr(config, k) for k in ("n_positions", "max_position_embeddings")
                  if isinstance(getattr(config, k, None), int)), None)
    if limit is None:
        return None
    with torch.device("meta"):
        model = _model_class(cfg).from_config(config)
    tables = (m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding))
    return limit if limit in tables else None


def _max_len(cfg: HFConfig) -> int | None:
    return _positions_cached(type(cfg), tuple(sorted(cfg.changed().items())), cfg.head)


@cache
def _positions_cached(cls: type[HFConfig], changed: tuple, head: str) -> int | None:
    return learned_positions(cls(head=head, **dict(changed)))


def _refuse_hub_name(name: str) -> None:
    owner, _, model = name.partition("/")
    raise BenchInputError(
        f"hf:{name} names a Hub checkpoint, and bench never downloads: give its shape instead, as the model "
        f"type and its config fields (e.g. arch = \"hf:llama\" with --set hidden_size=4096 --set "
        f"num_hidden_layers=32 …), or a preset from `bench list archs 'hf:*'`", where="arch")


def resolve(name: str) -> ArchSpec:
    """The ArchSpec of ``hf:NAME`` (a preset or a model type); BenchInputError for a Hub name, an unknown type, or
    transformers missing."""
    if "/" in name:
        _refuse_hub_name(name)
    transformers = _transformers()
    preset = PRESETS.get(name)
    model_type = preset.model_type if preset else name
    if model_type not in transformers.CONFIG_MAPPING:
        known = [*PRESETS, *transformers.CONFIG_MAPPING.keys()]
        close = difflib.get_close_matches(name, known, n=3) if name else []
        hint = f"; did you mean {', '.join(close)}?" if close else "; see transformers.CONFIG_MAPPING"
        raise BenchInputError(f"transformers has no model type {name!r}{hint}", where="arch")
    try:
        config = config_class(model_type)(head=preset.head, **dict(preset.fields)) if preset \
            else config_class(model_type)()
    except ValueError as exc:
        raise BenchInputError(str(exc), where="arch") from None
    what = (f"{preset.released}'s shape ({preset.params:,} parameters)" if preset
            else f"transformers {type(config.hf_config()).__name__}() defaults")
    return ArchSpec(f"hf:{name}", "hf", config, HFModel, make_inputs, _describe(config.built_head(), what),
                    max_len=_max_len)


def preset_descriptions() -> dict[str, str]:
    """The named presets, ``hf:NAME`` → what a listing says of them (plain data: transformers is not imported)."""
    return {f"hf:{name}": _describe(p.head, f"{p.released}'s shape ({p.params:,} parameters)")
            for name, p in PRESETS.items()}


def _describe(head: str, what: str) -> str:
    return f"{head} {what}, random weights, nothing downloaded"


register_namespace("hf", resolve, preset_descriptions)
