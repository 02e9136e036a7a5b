"""State-space language models beside attention: S4D and Mamba stacks, and their one-token decode step.

Same interface as the other sequence families: tokens (B, T) → embedding → n_layers pre-norm residual
blocks (:mod:`architectures.layers.ssm`: ``S4DBlock`` or ``MambaBlock``) → final norm → untied LM head →
per-token logits (B, T, vocab). Causal by default (``bidirectional`` adds a second, reversed mixer per block,
an encoder). Per layer and token the work is O(d·N) for the scan plus the projections, whatever T: linear
in the sequence length; a decode step is O(1) in the context (a fixed-size state, no KV cache).

* ``s4d-lm-*`` / ``mamba-lm-*``: the LMs (tiny: d=128, 2 layers, beside ``decoder-tiny``; small: d=256,
  4 layers, the width and depth of ``lra-exact`` / ``lra-window``).
* ``s4d-small`` / ``mamba-small``: the same small models as the ssm_vs_attention suite's lines (causal,
  which the suite's per-token work and time do not depend on).
* ``ssm-decode-step-{tiny,small}``: forward = ONE token step, ``forward(token (B, 1), *states)`` with each
  layer's state passed in as tensors (S4D: h (B, D, N); Mamba: h (B, E, N) and the conv window
  (B, E, d_conv-1)), output logits (B, 1, vocab). ``kind`` picks S4D or Mamba (Mamba by default).

``cost`` gives exact parameters and forward MACs as harness.instruments.flops counts them (the scan op's convention:
3 MACs per (batch, position, channel, state), see :mod:`architectures.layers.scan`); ``step_cost`` adds
``state_bytes``, the bytes of the state tensors a step reads (independent of the context length).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from architectures.inputs import need_seq_len, token_inputs
from architectures.layers.blocks import NormKind, make_norm
from architectures.layers.scan import FWD_MACS_PER_STATE
from architectures.layers.ssm import MambaBlock, S4DBlock, SSMBlock
from harness.api import ArchSpec, Workload, register

SSMKind = Literal["s4d", "mamba"]


@dataclass(frozen=True)
class SSMConfig:
    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    kind: SSMKind = "mamba"
    d_state: int = 16                      # N per channel (S4D's default is 64)
    expand: int = 2                        # mamba only: E = expand·d_model channels in the scan
    d_conv: int = 4                        # mamba only: causal depthwise conv width
    dt_rank: int = 0                       # mamba only: 0 = ceil(d_model/16)
    norm: NormKind = "rmsnorm"
    bidirectional: bool = False            # a second mixer on the reversed sequence, summed (an encoder)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "expand", "d_conv"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.dt_rank < 0:
            raise ValueError(f"dt_rank must be >= 0 (0: ceil(d_model/16)), got {self.dt_rank}")
        if self.kind not in ("s4d", "mamba"):
            raise ValueError(f"kind must be 's4d' or 'mamba', got {self.kind!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")

    @property
    def rank(self) -> int:
        """Mamba's dt_rank, resolved."""
        return self.dt_rank or math.ceil(self.d_model / 16)

    @property
    def channels(self) -> int:
        """D of the scan: d_model for S4D, expand·d_model for Mamba."""
        return self.d_model if self.kind == "s4d" else self.expand * self.d_model


def make_block(cfg: SSMConfig) -> SSMBlock:
    if cfg.kind == "s4d":
        return S4DBlock(cfg.d_model, cfg.d_state, cfg.norm, cfg.bidirectional)
    return MambaBlock(cfg.d_model, cfg.d_state, cfg.expand, cfg.d_conv, cfg.rank, cfg.norm, cfg.bidirectional)


class SSMLM(nn.Module):
    """Tokens (B, T) -> logits (B, T, vocab); ``step`` decodes one token from per-layer states."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)   # untied

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tok(tokens)                                              # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))                                    # (B, T, vocab)

    def new_states(self, batch: int) -> list[tuple[Tensor, ...]]:
        """Zero states, one tuple per layer (the state before the first token)."""
        like = self.head.weight
        return [block.mixer.new_state(batch, like) for block in self.blocks]

    def step(self, token: Tensor, states: list[tuple[Tensor, ...]]) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
        """token (B, 1) and the states after the context -> (logits (B, 1, vocab), the states after it)."""
        x = self.tok(token)                                               # (B, 1, d)
        new = []
        for block, state in zip(self.blocks, states, strict=True):
            x, s = block.step(x, state)
            new.append(s)
        return self.head(self.norm(x)), new

    # The generation protocol (harness.engine.generation), as the decoders implement it.
    @staticmethod
    def cannot_generate(cfg: SSMConfig) -> str | None:
        """Why ``cfg`` cannot generate, or None: only causal Mamba has a parallel prefill here."""
        if cfg.bidirectional:
            return "a bidirectional SSM is not causal"
        return None if cfg.kind == "mamba" else f"{cfg.kind} has no prefill (only Mamba's is written)"
    def generation_state(self, batch: int, max_len: int) -> SSMState:
        """The constant-size state (``max_len`` does not change it)."""
        return SSMState(self.new_states(batch))

    def prefill(self, tokens: Tensor, state: SSMState) -> Tensor:
        """The prompt (B, T) in parallel (Mamba's scan), its final state written into ``state`` -> (B, vocab)."""
        x = self.tok(tokens)                                              # (B, T, d)
        new = []
        for block in self.blocks:
            x, s = block.prefill(x)
            new.append(s)
        state.write(new)
        return self.head(self.norm(x[:, -1]))                             # (B, vocab): the last position only

    def decode(self, token: Tensor, state: SSMState) -> Tensor:
        """One token (B, 1) -> its logits (B, vocab), ``state`` advanced in place."""
        logits, new = self.step(token, state.layers())
        state.write(new)
        return logits[:, -1]                                              # (B, vocab)


class SSMState(nn.Module):
    """Every layer's recurrent state as buffers, overwritten in place after each call (its size is constant:
    it never grows with the context). ``layers()`` gives the per-layer tuples ``SSMLM.step`` takes."""

    def __init__(self, layers: list[tuple[Tensor, ...]]) -> None:
        super().__init__()
        self.per = len(layers[0])
        for i, t in enumerate(x for layer in layers for x in layer):
            self.register_buffer(f"s{i}", t, persistent=False)

    def layers(self) -> list[tuple[Tensor, ...]]:
        flat = list(self.buffers())
        return [tuple(flat[i:i + self.per]) for i in range(0, len(flat), self.per)]

    def write(self, layers: list[tuple[Tensor, ...]]) -> None:
        for old, new in zip(self.buffers(), (x for layer in layers for x in layer), strict=True):
            old.copy_(new)

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers())

    def step_bytes(self, context: int) -> int:
        """A step reads the whole state and writes it back, whatever the context."""
        return 2 * self.nbytes()


def state_shapes(cfg: SSMConfig, batch: int) -> list[tuple[int, ...]]:
    """Shapes of one layer's state tensors: h (B, D, N), and Mamba's conv window (B, E, d_conv-1)."""
    shapes = [(batch, cfg.channels, cfg.d_state)]
    if cfg.kind == "mamba":
        shapes.append((batch, cfg.channels, cfg.d_conv - 1))
    return shapes


class SSMDecodeStep(nn.Module):
    """``forward(token (B, 1), *states)`` -> logits (B, 1, vocab): one step of greedy generation after a
    context whose state the inputs carry (each layer's tensors in :func:`state_shapes` order)."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        if cfg.bidirectional:
            raise ValueError("a bidirectional SSM cannot decode one token at a time")
        self.cfg = cfg
        self.lm = SSMLM(cfg)

    def forward(self, token: Tensor, *states: Tensor) -> Tensor:
        per = len(state_shapes(self.cfg, 1))
        if len(states) != per * self.cfg.n_layers:
            raise ValueError(f"need {per} state tensors for each of {self.cfg.n_layers} layers, got {len(states)}")
        layers = [tuple(states[i:i + per]) for i in range(0, len(states), per)]
        return self.lm.step(token, layers)[0]


def mixer_cost(cfg: SSMConfig) -> tuple[int, int]:
    """(params, forward MACs per token) of one layer's mixer (one direction)."""
    d, n = cfg.d_model, cfg.d_state
    if cfg.kind == "s4d":                                                 # log_dt, A_log, C, D, out linear
        return 2 * d + 2 * d * n + d * d + d, FWD_MACS_PER_STATE * d * n + d * d
    e, r = cfg.channels, cfg.rank
    weights = d * 2 * e + e * cfg.d_conv + e * (r + 2 * n) + r * e + e * d   # in, conv, x, dt, out projections
    params = weights + e + e + e * n + e                                  # conv bias, dt bias, A_log, D
    return params, weights + FWD_MACS_PER_STATE * e * n


def _norm_params(cfg: SSMConfig) -> int:
    return 2 * cfg.d_model if cfg.norm == "layernorm" else cfg.d_model


def params(cfg: SSMConfig) -> int:
    mixer, _ = mixer_cost(cfg)
    directions = 2 if cfg.bidirectional else 1
    layer = _norm_params(cfg) + directions * mixer
    return 2 * cfg.vocab_size * cfg.d_model + cfg.n_layers * layer + _norm_params(cfg)   # embedding, head


def macs_per_token(cfg: SSMConfig) -> int:
    """Forward MACs of one token through the stack and the head."""
    directions = 2 if cfg.bidirectional else 1
    return cfg.n_layers * directions * mixer_cost(cfg)[1] + cfg.d_model * cfg.vocab_size


def cost(cfg: SSMConfig, w: Workload) -> dict[str, int]:
    """Exact parameters and forward MACs as harness.instruments.flops counts them (linear in T)."""
    return {"params": params(cfg), "macs": w.batch_size * need_seq_len(w) * macs_per_token(cfg)}


def state_bytes(cfg: SSMConfig, batch: int, itemsize: int) -> int:
    """Bytes of every layer's state: independent of the context length."""
    return cfg.n_layers * sum(math.prod(s) for s in state_shapes(cfg, batch)) * itemsize


def step_cost(cfg: SSMConfig, w: Workload) -> dict[str, int]:
    """One decode step: parameters, forward MACs of one token (the context length only validated), and
    ``state_bytes``, the bytes of the state tensors the step reads."""
    need_seq_len(w)
    return {"params": params(cfg), "macs": w.batch_size * macs_per_token(cfg),
            "state_bytes": state_bytes(cfg, w.batch_size, w.itemsize)}


def step_inputs(cfg: SSMConfig, w: Workload, device: torch.device) -> tuple[Tensor, ...]:
    """The newest token (B, 1) and random per-layer states (their values do not change the cost); the
    workload's seq_len is the context length the step follows, which the state's size does not depend on."""
    need_seq_len(w)
    g = torch.Generator().manual_seed(0)
    token = torch.randint(0, cfg.vocab_size, (w.batch_size, 1), generator=g).to(device)
    states = [torch.randn(shape, generator=g).to(device)
              for _ in range(cfg.n_layers) for shape in state_shapes(cfg, w.batch_size)]
    return (token, *states)


_TINY = dict(vocab_size=1024, d_model=128, n_layers=2)               # decoder-tiny's vocabulary, width, depth
_SMALL = dict(vocab_size=256, d_model=256, n_layers=4)               # lra-exact's
_S4D = dict(kind="s4d", d_state=64, norm="layernorm")
_MAMBA = dict(kind="mamba", d_state=16, expand=2, d_conv=4, norm="rmsnorm")

PRESETS: dict[str, SSMConfig] = {
    "s4d-lm-tiny": SSMConfig(**_TINY, **_S4D),
    "mamba-lm-tiny": SSMConfig(**_TINY, **_MAMBA),
    "s4d-lm-small": SSMConfig(**_SMALL, **_S4D),
    "mamba-lm-small": SSMConfig(**_SMALL, **_MAMBA),
    "s4d-small": SSMConfig(**_SMALL, **_S4D),
    "mamba-small": SSMConfig(**_SMALL, **_MAMBA),
}
STEP_PRESETS: dict[str, SSMConfig] = {
    "ssm-decode-step-tiny": SSMConfig(**_TINY, **_MAMBA),
    "ssm-decode-step-small": SSMConfig(vocab_size=8192, d_model=512, n_layers=6, **_MAMBA),   # decode-step-small's sizes
}

SMALL = (("vocab_size", 64), ("d_model", 32), ("n_layers", 2), ("d_state", 8))


def describe(cfg: SSMConfig) -> str:
    mixer = (f"S4D-Real N={cfg.d_state}" if cfg.kind == "s4d"
             else f"Mamba N={cfg.d_state} E={cfg.channels} conv={cfg.d_conv} R={cfg.rank}")
    return f"{mixer}, d={cfg.d_model}, L={cfg.n_layers}, vocab={cfg.vocab_size}, {cfg.norm}"


for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "ssm", _cfg, SSMLM, token_inputs, f"{describe(_cfg)} (causal)", small=SMALL, cost=cost))
for _name, _cfg in STEP_PRESETS.items():
    register(ArchSpec(_name, "decode-step", _cfg, SSMDecodeStep, step_inputs,
                      f"one SSM decode step (state in inputs), {describe(_cfg)}", small=SMALL, cost=step_cost))
