"""Diagonal state-space layers: S4D and Mamba mixers and their blocks, each with a full-sequence forward and a
one-position step, over the selective scan of :mod:`architectures.layers.scan` (a counted custom op: its MAC
convention is there).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from architectures.layers.blocks import NormKind, make_norm
from architectures.layers.scan import selective_scan


def _log_uniform(n: int, low: float, high: float) -> Tensor:
    return torch.rand(n) * (math.log(high) - math.log(low)) + math.log(low)


class S4DMixer(nn.Module):
    """S4D-Real (Gu et al. 2022): per-channel diagonal SSM with A_n = -exp(A_log) (init -(n+1)), B folded
    into C (B = 1, as the paper's reference code does), ZOH discretisation, D skip, GELU, output linear.

    The time-invariant (D, N) parameters go through the selective-scan op broadcast over the batch and
    positions (delta = dt expanded; B̄ = (exp(dt·A) - 1)/(dt·A) so that the op's delta·B̄ is ZOH's B̄)."""

    def __init__(self, d: int, d_state: int) -> None:
        super().__init__()
        self.log_dt = nn.Parameter(_log_uniform(d, 1e-3, 1e-1))                       # (D,)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d, 1))
        self.C = nn.Parameter(torch.randn(d, d_state) * d_state ** -0.5)              # (D, N)
        self.D = nn.Parameter(torch.ones(d))
        self.out = nn.Linear(d, d)

    def _params(self) -> tuple[Tensor, Tensor, Tensor]:
        dt = torch.exp(self.log_dt)                                       # (D,)
        A = -torch.exp(self.A_log)                                        # (D, N)
        dtA = dt[:, None] * A
        return dt, A, torch.expm1(dtA) / dtA                              # B̄/dt, (D, N)

    def forward(self, x: Tensor) -> Tensor:                               # (B, L, D) -> (B, L, D)
        dt, A, Bbar = self._params()
        y, _ = selective_scan(x, dt.expand_as(x), A, Bbar, self.C)         # (B, L, D)
        return self.out(F.gelu(y + self.D * x))

    def new_state(self, batch: int, like: Tensor) -> tuple[Tensor, ...]:
        return (like.new_zeros(batch, self.A_log.shape[0], self.A_log.shape[1]),)   # h (B, D, N)

    def step(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One position x (B, 1, D) from state (h,) -> (y (B, 1, D), (h',))."""
        dt, A, Bbar = self._params()
        y, h = selective_scan(x, dt.expand_as(x), A, Bbar, self.C, state[0])
        return self.out(F.gelu(y + self.D * x)), (h,)


class MambaMixer(nn.Module):
    """Mamba's selective SSM (mamba_simple.Mamba): in_proj (d -> 2E) → causal depthwise conv1d (d_conv) →
    SiLU → x_proj (E -> R + 2N) → dt_proj (R -> E) + softplus → selective scan (+ D skip) → · SiLU(z) →
    out_proj (E -> d); E = expand·d, R = dt_rank."""

    def __init__(self, d: int, d_state: int, expand: int, d_conv: int, dt_rank: int) -> None:
        super().__init__()
        e = expand * d
        self.d_state, self.dt_rank, self.d_conv = d_state, dt_rank, d_conv
        self.in_proj = nn.Linear(d, 2 * e, bias=False)
        self.conv1d = nn.Conv1d(e, e, d_conv, groups=e)                   # causal: padded on the left in forward
        self.x_proj = nn.Linear(e, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, e)
        dt = torch.exp(_log_uniform(e, 1e-3, 1e-1)).clamp(min=1e-4)     # softplus(bias) = dt at init
        with torch.no_grad():
            nn.init.uniform_(self.dt_proj.weight, -dt_rank ** -0.5, dt_rank ** -0.5)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, d, bias=False)

    def _ssm(self, x: Tensor, z: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        """x, z (B, L, E) after the conv and SiLU -> (gated y (B, L, d), last state (B, E, N))."""
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)   # (B, L, R|N|N)
        delta = F.softplus(self.dt_proj(dt))                              # (B, L, E)
        y, h = selective_scan(x, delta, -torch.exp(self.A_log), B, C, h0)  # (B, L, E), (B, E, N)
        return self.out_proj((y + self.D * x) * F.silu(z)), h

    def forward(self, hidden: Tensor) -> Tensor:                          # (B, L, d) -> (B, L, d)
        x, z = self.in_proj(hidden).chunk(2, dim=-1)                      # (B, L, E) each
        x = self.conv1d(F.pad(x.transpose(1, 2), (self.d_conv - 1, 0)))  # (B, E, L): causal
        return self._ssm(F.silu(x.transpose(1, 2)), z, None)[0]

    def new_state(self, batch: int, like: Tensor) -> tuple[Tensor, ...]:
        e = self.D.shape[0]                                               # h (B, E, N), conv window (B, E, d_conv-1)
        return like.new_zeros(batch, e, self.d_state), like.new_zeros(batch, e, self.d_conv - 1)

    def prefill(self, hidden: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """A whole prompt (B, L, d) in parallel (the scan) -> (y (B, L, d), the state after it, as ``step``'s)."""
        x, z = self.in_proj(hidden).chunk(2, dim=-1)                      # (B, L, E) each
        padded = F.pad(x.transpose(1, 2), (self.d_conv - 1, 0))           # (B, E, d_conv-1+L)
        conv = padded[:, :, padded.shape[2] - (self.d_conv - 1):]         # (B, E, d_conv-1): the last inputs
        y, h = self._ssm(F.silu(self.conv1d(padded).transpose(1, 2)), z, None)
        return y, (h, conv)

    def step(self, hidden: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One position (B, 1, d) from (h (B, E, N), conv (B, E, d_conv-1)) -> (y (B, 1, d), new state)."""
        h, conv = state
        x, z = self.in_proj(hidden).chunk(2, dim=-1)                      # (B, 1, E) each
        window = torch.cat([conv, x.transpose(1, 2)], dim=2)             # (B, E, d_conv)
        x = F.conv1d(window, self.conv1d.weight, self.conv1d.bias, groups=window.shape[1])   # (B, E, 1)
        y, h = self._ssm(F.silu(x.transpose(1, 2)), z, h)
        return y, (h, window[:, :, 1:])


class SSMBlock(nn.Module):
    """Pre-norm residual: x + mixer(norm(x)); ``reverse``: also + flip(mixer_rev(flip(norm(x)))) (bidirectional)."""

    def __init__(self, mixer: nn.Module, norm: nn.Module, reverse: nn.Module | None = None) -> None:
        super().__init__()
        self.norm, self.mixer, self.reverse = norm, mixer, reverse

    def forward(self, x: Tensor) -> Tensor:                               # (B, L, d) -> (B, L, d)
        h = self.norm(x)
        out = self.mixer(h)
        if self.reverse is not None:
            out = out + self.reverse(h.flip(1)).flip(1)
        return x + out

    def step(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One position (B, 1, d) -> (B, 1, d) and the mixer's new state (causal blocks only)."""
        if self.reverse is not None:
            raise ValueError("a bidirectional block cannot be stepped one position at a time")
        y, state = self.mixer.step(self.norm(x), state)
        return x + y, state

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """A prompt (B, L, d) -> (B, L, d) and the mixer's state after it (mixers with a ``prefill`` only)."""
        if self.reverse is not None or not hasattr(self.mixer, "prefill"):
            raise ValueError(f"{type(self.mixer).__name__} cannot prefill a generation (causal Mamba only)")
        y, state = self.mixer.prefill(self.norm(x))
        return x + y, state


class S4DBlock(SSMBlock):
    """norm → S4D layer (diagonal SSM, D skip, GELU, output linear) → residual."""

    def __init__(self, d: int, d_state: int = 64, norm: NormKind = "layernorm", bidirectional: bool = False) -> None:
        super().__init__(S4DMixer(d, d_state), make_norm(norm, d), S4DMixer(d, d_state) if bidirectional else None)


class MambaBlock(SSMBlock):
    """norm → Mamba mixer → residual (mamba_simple's Block); dt_rank 0 = ceil(d/16)."""

    def __init__(self, d: int, d_state: int = 16, expand: int = 2, d_conv: int = 4, dt_rank: int = 0,
                 norm: NormKind = "rmsnorm", bidirectional: bool = False) -> None:
        rank = dt_rank or math.ceil(d / 16)
        mixers = [MambaMixer(d, d_state, expand, d_conv, rank) for _ in range(2 if bidirectional else 1)]
        super().__init__(mixers[0], make_norm(norm, d), mixers[1] if bidirectional else None)
