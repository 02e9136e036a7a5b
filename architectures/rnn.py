"""Sequence baselines beside self-attention: LSTM, GRU, vanilla RNN and a 1-D convolution stack.

Same interface as the attention stacks: tokens (B, T) → embedding → n_layers of the layer at
width d → per-token logits (B, T, vocab). Per-layer forward cost (claims C04/C05): recurrent
O(n·d²) with n sequential steps; convolution O(k·n·d²) with O(1) sequential steps; self-attention
O(n²·d + n·d²) with O(1). The sequential steps are measured, not computed here: the dependency depth
of a forward's dispatched ops (:func:`harness.instruments.flops.dependency_trace`, claim C04).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from architectures.inputs import need_seq_len, token_inputs
from harness.api import ArchSpec, Workload, register

SeqKind = Literal["lstm", "gru", "rnn", "conv1d"]
RECURRENT: dict[str, type[nn.RNNBase]] = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
GATES: dict[str, int] = {"lstm": 4, "gru": 3, "rnn": 1}     # weight blocks per recurrent layer


@dataclass(frozen=True)
class SeqBaselineConfig:
    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    kind: SeqKind = "lstm"
    kernel_size: int = 3                      # conv1d only
    activation: Literal["gelu", "relu"] = "gelu"   # conv1d only (the vanilla RNN uses tanh)
    dropout: float = 0.0                      # between layers
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "kernel_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class ConvStack(nn.Module):
    """n_layers × [Conv1d(d, d, k, padding='same'), activation, dropout] on (B, T, d)."""

    def __init__(self, cfg: SeqBaselineConfig) -> None:
        super().__init__()
        act = {"gelu": nn.GELU, "relu": nn.ReLU}[cfg.activation]
        self.layers = nn.Sequential(*(
            m for _ in range(cfg.n_layers)
            for m in (nn.Conv1d(cfg.d_model, cfg.d_model, cfg.kernel_size, padding="same", bias=cfg.bias),
                      act(), nn.Dropout(cfg.dropout))))

    def forward(self, x: Tensor) -> Tensor:                              # (B, T, d) -> (B, T, d)
        return self.layers(x.transpose(1, 2)).transpose(1, 2)            # convolve over (B, d, T)


class Recurrent(nn.Module):
    """torch.nn's LSTM / GRU / RNN (batch_first, n_layers stacked), returning the outputs only."""

    def __init__(self, cfg: SeqBaselineConfig) -> None:
        super().__init__()
        self.rnn = RECURRENT[cfg.kind](cfg.d_model, cfg.d_model, num_layers=cfg.n_layers, bias=cfg.bias,
                                       batch_first=True, dropout=cfg.dropout if cfg.n_layers > 1 else 0.0)

    def forward(self, x: Tensor) -> Tensor:                              # (B, T, d) -> (B, T, d)
        return self.rnn(x)[0]


class SeqBaseline(nn.Module):
    """Tokens (B, T) -> per-token logits (B, T, vocab); the layer stack is chosen by ``kind``."""

    def __init__(self, cfg: SeqBaselineConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.stack = ConvStack(cfg) if cfg.kind == "conv1d" else Recurrent(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.stack(self.tok(tokens)))                   # (B, T, d) -> (B, T, vocab)


def layer_cost(cfg: SeqBaselineConfig) -> tuple[int, int]:
    """(params, MACs per token) of one layer at width d."""
    d = cfg.d_model
    if cfg.kind == "conv1d":
        weights = cfg.kernel_size * d * d
        return weights + (d if cfg.bias else 0), weights
    gates = GATES[cfg.kind]
    weights = gates * 2 * d * d                                          # W_ih and W_hh, each (gates·d, d)
    return weights + (2 * gates * d if cfg.bias else 0), weights         # b_ih and b_hh


def cost(cfg: SeqBaselineConfig, w: Workload) -> dict[str, int]:
    """Exact params and forward MACs as harness.instruments.flops counts them on CPU: LSTM's fused
    ``mkldnn_rnn_layer`` (x·W_ihᵀ + h·W_hhᵀ per token), GRU/RNN's addmm/mm per step, conv1d."""
    layer_params, layer_macs = layer_cost(cfg)
    d, v = cfg.d_model, cfg.vocab_size
    tokens = w.batch_size * need_seq_len(w)
    return {"params": 2 * v * d + cfg.n_layers * layer_params,
            "macs": tokens * (cfg.n_layers * layer_macs + d * v)}


PRESETS: dict[str, SeqBaselineConfig] = {
    "lstm-small": SeqBaselineConfig(kind="lstm"),
    "gru-small": SeqBaselineConfig(kind="gru"),
    "rnn-small": SeqBaselineConfig(kind="rnn"),
    "conv1d-small": SeqBaselineConfig(kind="conv1d", kernel_size=3),
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2))

for _name, _cfg in PRESETS.items():
    _layer = (f"Conv1d k={_cfg.kernel_size} + {_cfg.activation}" if _cfg.kind == "conv1d"
              else f"nn.{RECURRENT[_cfg.kind].__name__}")
    register(ArchSpec(_name, "sequence-baseline", _cfg, SeqBaseline, token_inputs,
                      f"{_layer} stack, d={_cfg.d_model}, L={_cfg.n_layers}, vocab={_cfg.vocab_size}",
                      small=SMALL, cost=cost))
