"""One layer as a model, hidden states (B, T, d) -> (B, T, d): our encoder layer and our attention alone.

``encoder-layer`` is one layer of :mod:`architectures.transformer` (the shared ``Block``: attention +
MLP in the configured residual wrappers), ``attention-layer`` the one :class:`Attention` with the exact
core. Their defaults are the sizes of PyTorch's ``nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention``
defaults, registered beside them as ``torch-encoder-layer`` / ``torch-mha``
(:mod:`architectures.torch_reference`, same field names), so a suite puts "ours" and "torch's" on lines
side by side at equal work (suites/ours_vs_torch.toml).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from architectures import transformer_cost as tc
from architectures.inputs import hidden_inputs, need_seq_len
from architectures.layers.attention import Attention, AttnImpl, ExactCore, HeadLayout, Heads, core_fn
from architectures.transformer import LayerConfig, make_block
from harness.api import ArchSpec, Workload, register


@dataclass(frozen=True)
class AttentionLayerConfig(HeadLayout):
    """Self-attention alone: width, heads, k/v heads, kernel, dropout on the weights, biases."""

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None          # None: MHA; fewer: GQA/MQA
    attn_impl: AttnImpl = "sdpa"
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        self.check_heads()
        core_fn(self.attn_impl)                                          # validates attn_impl
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def attention_layer(cfg: AttentionLayerConfig) -> Attention:
    """Bidirectional self-attention, x (B, T, d) -> (B, T, d)."""
    return Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, core=cfg.attn_impl, dropout=cfg.dropout, bias=cfg.bias)


def attention_layer_cost(cfg: AttentionLayerConfig, w: Workload) -> dict[str, int]:
    """Exact parameters; forward MACs of the projections and the exact core."""
    b, t = w.batch_size, need_seq_len(w)
    mix = ExactCore(cfg.attn_impl).macs(Heads.of(cfg.d_model, cfg.n_heads, cfg.n_kv_heads), b, t)
    return {"params": tc.attention_params(cfg), "macs": tc.attention_linear_macs(cfg, b * t) + mix}


_TORCH_NAMES = (("self_attn.", "attn."), ("in_proj_weight", "qkv.weight"), ("in_proj_bias", "qkv.bias"),
                ("out_proj.", "out."), ("linear1.", "mlp.up."), ("linear2.", "mlp.down."),
                ("norm1.", "res_attn.norm."), ("norm2.", "res_mlp.norm."))


def from_torch(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a ``torch-encoder-layer`` / ``torch-mha`` state dict to ``encoder-layer`` / ``attention-layer``
    names: nn.MultiheadAttention's ``in_proj`` rows are [q; k; v], the layout of ``Attention.qkv``."""
    out = {}
    for key, value in state.items():
        key = key.split(".", 1)[1]                                       # the wrapper's "layer." / "mha."
        for old, new in _TORCH_NAMES:
            key = key.replace(old, new)
        out[key] = value
    return out


def encoder_layer_cost(cfg: LayerConfig, w: Workload) -> dict[str, int]:
    """Exact parameters and forward MACs of one bidirectional layer."""
    return {"params": tc.block_params(cfg), "macs": tc.block_macs(cfg, w.batch_size, need_seq_len(w))}


# PyTorch's defaults: nn.TransformerEncoderLayer(512, 8) has d_ff 2048, ReLU, post-norm; dropout 0 here
# (torch's default 0.1 would make training steps unequal work).
ENCODER_LAYER = LayerConfig(d_model=512, n_heads=8, d_ff=2048, activation="relu", norm_placement="post")
SMALL = (("d_model", 32), ("n_heads", 4))

register(ArchSpec("encoder-layer", "layer", ENCODER_LAYER, make_block, hidden_inputs,
                  "one encoder layer (ours), d=512, h=8, d_ff=2048, ReLU, post-norm; input (B, T, d)",
                  small=SMALL + (("d_ff", 64),), cost=encoder_layer_cost))
register(ArchSpec("attention-layer", "layer", AttentionLayerConfig(), attention_layer, hidden_inputs,
                  "self-attention alone (ours: the one Attention, exact core), d=512, h=8; input (B, T, d)",
                  small=SMALL, cost=attention_layer_cost))
