"""The selective scan of the diagonal state-space layers, as counted custom ops (forward and backward).

**The scan.** ``bench_ssm::selective_scan(x, delta, A, B, C, h0) -> (y, h_last)`` computes, for x and delta
(B, L, D), A (D, N), B and C either input-dependent (B, L, N) (Mamba) or time-invariant (D, N) (S4D), and an
optional initial state h0 (B, D, N)::

    h_t = exp(delta_t·A) ⊙ h_{t-1} + (delta_t·x_t) ⊗ B_t        (B, D, N)
    y_t = Σ_n C_t[n] · h_t[:, :, n]                             (B, D)

(the D skip connection and the gate stay outside the op). It is plain PyTorch (CPU and CUDA alike, fp32
accumulation for fp32/bf16/fp16 inputs, fp64 for fp64) and chunked: CHUNK = 64 positions at a time are discretised into
(B, CHUNK, D, N) temporaries — never (B, L, D, N) for the whole L — and scanned, the state carried from
chunk to chunk sequentially. Within a chunk the scan is two-level: SUB = 8 sub-chunks of 8 positions are
scanned from a zero state side by side (8 steps on (B, 8, D, N)), then the sub-chunks' starting states are
carried (8 steps on (B, D, N)) and added back through the cumulative decays (one pass): 16 sequential steps
per 64 positions instead of 64, only products of decays in (0, 1] (no exp(-cumsum) that could overflow).
The backward op recomputes the states chunk by chunk (as mamba's CUDA kernel does) and runs the adjoint
recurrence g_t = C_t·dy_t + exp(delta_{t+1}·A) ⊙ g_{t+1} backwards through the chunks.

**MAC convention** (registered with ``torch.utils.flop_counter.register_flop_formula``, so
``harness.instruments.flops.count_model`` counts both ops with no harness change and reports no gap): the
multiply-accumulates that involve the state, one per (b, t, d, n) for each of

* forward, 3·B·L·D·N: the discretised input (delta·x)·B, the state update exp(delta·A)·h + ·, and the
  readout Σ_n C·h;
* backward, 6·B·L·D·N (twice the forward, as the stock counter counts a matmul's backward): the adjoint
  state a·g + C·dy (2), dC = Σ_d dy·h (1), dB = Σ_d g·(delta·x) and d(delta·x) = Σ_n g·B (2), and the decay's
  gradient g·h_{t-1} (1). Recomputing the states is not counted (nor is a checkpointed forward anywhere).

The exponent delta·A, exp, and the scalings of the decay's chain rule are elementwise (0 MACs, like an
activation). For comparison, the Mamba authors' figure for the selective scan (also VMamba's
``flops_selective_scan_fn``) is ~9·B·L·D·N FLOPs ≈ 4.5 MACs per (b, t, d, n); ours is 3 MACs = 6 FLOPs,
as it leaves out the elementwise exponent and exp.

**Decoding.** A recurrent step is the same op on one position with the previous state as ``h0``: O(1) in the
context length and counted by the same formula (3·B·D·N per step).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

__all__ = ["BWD_MACS_PER_STATE", "CHUNK", "FWD_MACS_PER_STATE", "scan_reference", "scan_states", "selective_scan"]

CHUNK = 64              # at most this many positions are discretised at once ...
CHUNK_ELEMS = 1 << 19   # ... and at most ~this many (batch, position, channel, state) elements: a chunk's
                        # temporaries (2 MB each in fp32) stay in cache while the kernels pass over them
FWD_MACS_PER_STATE = 3      # see the module docstring
BWD_MACS_PER_STATE = 6


# --------------------------------------------------------------------------------------------
# The scan's kernels (chunked; fp32 accumulation, fp64 for fp64)
# --------------------------------------------------------------------------------------------

def _acc(x: Tensor) -> torch.dtype:
    """The dtype the scan accumulates in: fp32 for fp32/bf16/fp16 inputs, fp64 for fp64."""
    return torch.promote_types(x.dtype, torch.float32)


def _chunk_len(b: int, d: int, n: int) -> int:
    """Positions per chunk: CHUNK, fewer where the (B, c, D, N) temporaries would leave the cache."""
    return max(1, min(CHUNK, CHUNK_ELEMS // (b * d * n)))


def _chunks(length: int, c: int) -> list[tuple[int, int]]:
    return [(i, min(i + c, length)) for i in range(0, length, c)]


class _Scan:
    """One call's inputs in the accumulation dtype and its work buffers, reused from chunk to chunk (fresh
    multi-MB tensors per chunk cost page faults on CPU). ``lti``: delta is the same at every batch row and
    position (S4D), so the decay exp(delta·A) is one (D, N) tensor, broadcast, never (B, c, D, N)."""

    def __init__(self, x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
        acc = _acc(x)
        self.x, self.delta, self.B, self.C = x.to(acc), delta.to(acc), B.to(acc), C.to(acc)
        self.A = A.to(acc)                                                # (D, N)
        self.A2 = self.A * math.log2(math.e)                              # exp(delta·A) = exp2(delta·A·log2 e)
        self.lti = bool(torch.equal(self.delta, self.delta[:1, :1].expand_as(self.delta)))
        self.a_lti = torch.exp2(self.delta[0, 0, :, None] * self.A2) if self.lti else None   # (D, N)
        b, length, d = x.shape
        self.dims = (b, d, A.shape[1])
        self.c = _chunk_len(*self.dims)
        self.flat: dict[str, Tensor] = {}

    def get(self, name: str, c: int, extra: int = 0) -> Tensor:
        """A (B, c + extra, D, N) view of the named flat buffer, grown on demand."""
        b, d, n = self.dims
        shape = (b, c + extra, d, n)
        size = math.prod(shape)
        buf = self.flat.get(name)
        if buf is None or buf.numel() < size:
            buf = self.flat[name] = self.A.new_empty(size)
        return buf[:size].view(shape)

    def bc(self, t: Tensor, i: int, j: int) -> Tensor:
        """B or C at positions i..j, broadcastable to (B, c, D, N): (B, L, N) -> (B, c, 1, N), (D, N) as is."""
        return t[:, i:j, None, :] if t.dim() == 3 else t

    def decays(self, i: int, j: int) -> Tensor:
        """exp(delta·A) at positions i..j: (B, c, D, N), or the (D, N) one of an LTI scan."""
        if self.lti:
            return self.a_lti
        return torch.mul(self.delta[:, i:j, :, None], self.A2, out=self.get("a", j - i)).exp2_()

    def states(self, i: int, j: int, h: Tensor, a: Tensor) -> Tensor:
        """(B, c+1, D, N): the state before position i (``h``), then the states after positions i..j."""
        hs = self.get("hs", j - i, 1)
        hs[:, 0] = h
        torch.mul((self.delta[:, i:j] * self.x[:, i:j]).unsqueeze(-1), self.bc(self.B, i, j), out=hs[:, 1:])
        steps = hs.unbind(1)
        for t, a_t in enumerate(_per_position(a, j - i)):                 # h_t = a_t·h_{t-1} + u_t, in place
            steps[t + 1].addcmul_(a_t, steps[t])
        return hs


def _per_position(a: Tensor, c: int) -> list[Tensor]:
    """The c decays of a chunk, each (B, D, N) or the LTI scan's (D, N)."""
    return list(a.unbind(1)) if a.dim() == 4 else [a] * c


@torch.library.custom_op("bench_ssm::selective_scan", mutates_args=())
def _selective_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                    h0: Tensor | None) -> tuple[Tensor, Tensor]:
    _check(x, delta, A, B, C, h0)
    acc = _acc(x)
    if x.shape[1] == 1:                                                   # a decode step: no chunk machinery
        A32, h, B1, C1 = A.to(acc), _initial(x, A, h0), _bc1(B, acc), _bc1(C, acc)
        dl = delta[:, 0].to(acc)                                          # (B, D)
        h = torch.exp(dl.unsqueeze(-1) * A32).mul_(h).add_((dl * x[:, 0]).unsqueeze(-1) * B1)
        y = (h * C1).sum(-1, keepdim=True).transpose(1, 2)               # (B, 1, D)
        return y.to(x.dtype), h.to(x.dtype)
    s = _Scan(x, delta, A, B, C)
    h = _initial(x, A, h0)
    y = x.new_empty(x.shape, dtype=acc)                                   # (B, L, D)
    for i, j in _chunks(x.shape[1], s.c):
        hs = s.states(i, j, h, s.decays(i, j))[:, 1:]                    # (B, c, D, N)
        torch.sum(torch.mul(hs, s.bc(s.C, i, j), out=s.get("tmp", j - i)), -1, out=y[:, i:j])   # (B, c, D)
        h = hs[:, -1].clone()                                             # the buffer is reused next chunk
    return y.to(x.dtype), h.to(x.dtype)


def _bc1(t: Tensor, acc: torch.dtype) -> Tensor:
    """B or C of a one-position scan, broadcastable to (B, D, N)."""
    return t[:, 0, None, :].to(acc) if t.dim() == 3 else t.to(acc)


def _initial(x: Tensor, A: Tensor, h0: Tensor | None) -> Tensor:
    b, d, n = x.shape[0], x.shape[2], A.shape[1]
    return x.new_zeros(b, d, n, dtype=_acc(x)) if h0 is None else h0.to(_acc(x))


def _check(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> None:
    b, length, d = x.shape
    n = A.shape[1]
    if delta.shape != x.shape or A.shape != (d, n):
        raise ValueError(f"selective_scan: x {tuple(x.shape)}, delta {tuple(delta.shape)}, A {tuple(A.shape)}")
    for name, t in (("B", B), ("C", C)):
        if tuple(t.shape) not in ((b, length, n), (d, n)):
            raise ValueError(f"selective_scan: {name} must be (B, L, N) or (D, N), got {tuple(t.shape)}")
    if h0 is not None and h0.shape != (b, d, n):
        raise ValueError(f"selective_scan: h0 must be {(b, d, n)}, got {tuple(h0.shape)}")


@_selective_scan.register_fake
def _(x, delta, A, B, C, h0):
    _check(x, delta, A, B, C, h0)
    return x.new_empty(x.shape), x.new_empty(x.shape[0], x.shape[2], A.shape[1])


@torch.library.custom_op("bench_ssm::selective_scan_backward", mutates_args=())
def _selective_scan_backward(dy: Tensor, dh_last: Tensor | None, x: Tensor, delta: Tensor, A: Tensor, B: Tensor,
                             C: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    s = _Scan(x, delta, A, B, C)
    chunks = _chunks(x.shape[1], s.c)
    starts, h = [], _initial(x, A, h0)
    for i, j in chunks:                                                   # recompute the chunks' start states
        starts.append(h)
        h = s.states(i, j, h, s.decays(i, j))[:, -1].clone()
    dy = dy.to(s.A.dtype)
    dx, ddelta = torch.empty_like(s.x), torch.empty_like(s.x)            # (B, L, D)
    dA = torch.zeros_like(s.A)
    dB, dC = torch.zeros_like(s.B), torch.zeros_like(s.C)
    g_next = None if dh_last is None else dh_last.to(s.A.dtype)          # adjoint of the state after the chunk
    a_next = None                                                         # and the decay into it (None: 1)
    for (i, j), h_start in zip(reversed(chunks), reversed(starts)):
        c = j - i
        a = s.decays(i, j)                                                # (B, c, D, N) or (D, N)
        hs = s.states(i, j, h_start, a)                                   # (B, c+1, D, N)
        h_prev, h_t = hs[:, :-1], hs[:, 1:]
        dl, xc, dyc = s.delta[:, i:j], s.x[:, i:j], dy[:, i:j]            # (B, c, D)
        dlx = dl * xc
        g = torch.mul(dyc.unsqueeze(-1), s.bc(s.C, i, j), out=s.get("g", c))   # C_t·dy_t, then dL/dh_t
        steps, decay = g.unbind(1), _per_position(a, c)
        for t in reversed(range(c)):                                      # g_t = C_t·dy_t + a_{t+1}·g_{t+1}
            nxt, a_nxt = (g_next, a_next) if t == c - 1 else (steps[t + 1], decay[t + 1])
            if a_nxt is not None:
                steps[t].addcmul_(a_nxt, nxt)
            elif nxt is not None:                                         # into h_last: no decay
                steps[t].add_(nxt)
        g_next, a_next = g[:, 0].clone(), (a if s.lti else a[:, 0].clone())
        tmp = s.get("tmp", c)
        if s.C.dim() == 3:
            dC[:, i:j] = torch.matmul(dyc.unsqueeze(2), h_t).squeeze(2)  # Σ_d dy·h, (B, c, N)
        else:
            dC += torch.mul(h_t, dyc.unsqueeze(-1), out=tmp).sum((0, 1))  # (D, N)
        if s.B.dim() == 3:
            dB[:, i:j] = torch.matmul(dlx.unsqueeze(2), g).squeeze(2)    # Σ_d g·(delta·x), (B, c, N)
        else:
            dB += torch.mul(g, dlx.unsqueeze(-1), out=tmp).sum((0, 1))
        d_dlx = torch.mul(g, s.bc(s.B, i, j), out=tmp).sum(-1)           # Σ_n g·B, (B, c, D)
        dlog = g.mul_(h_prev).mul_(a)                                     # dL/d(delta·A) = g_t·a_t·h_{t-1}
        if s.lti:
            dA += dlog.sum((0, 1)) * dl[0, 0, :, None]
        else:
            dA += torch.mul(dlog, dl.unsqueeze(-1), out=tmp).sum((0, 1))
        ddelta[:, i:j] = torch.mul(dlog, s.A, out=tmp).sum(-1).addcmul_(d_dlx, xc)
        dx[:, i:j] = d_dlx * dl
    dh0 = g_next if a_next is None else a_next * g_next                   # h_0 = a_0·h0 + u_0
    return (dx.to(x.dtype), ddelta.to(delta.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype),
            dh0.to(x.dtype))


@_selective_scan_backward.register_fake
def _(dy, dh_last, x, delta, A, B, C, h0):
    b, d, n = x.shape[0], x.shape[2], A.shape[1]
    return (x.new_empty(x.shape), delta.new_empty(delta.shape), A.new_empty(A.shape), B.new_empty(B.shape),
            C.new_empty(C.shape), x.new_empty(b, d, n))


def _setup_context(ctx, inputs, output) -> None:
    x, delta, A, B, C, h0 = inputs
    ctx.has_h0 = h0 is not None
    ctx.save_for_backward(x, delta, A, B, C, h0)


def _backward(ctx, dy: Tensor | None, dh_last: Tensor | None):
    x, delta, A, B, C, h0 = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dx, ddelta, dA, dB, dC, dh0 = torch.ops.bench_ssm.selective_scan_backward(dy, dh_last, x, delta, A, B, C, h0)
    return dx, ddelta, dA, dB, dC, (dh0 if ctx.has_h0 else None)


_selective_scan.register_autograd(_backward, setup_context=_setup_context)


def scan_states(x_shape, a_shape) -> int:
    """B·L·D·N: the (batch, position, channel, state) elements a scan of these shapes updates."""
    b, length, d = x_shape
    return b * length * d * a_shape[1]


@register_flop_formula(torch.ops.bench_ssm.selective_scan)
def _scan_flops(x, delta, A, B, C, h0=None, *args, out_shape=None, **kwargs) -> int:
    return 2 * FWD_MACS_PER_STATE * scan_states(x, A)


@register_flop_formula(torch.ops.bench_ssm.selective_scan_backward)
def _scan_backward_flops(dy, dh_last, x, delta, A, *args, out_shape=None, **kwargs) -> int:
    return 2 * BWD_MACS_PER_STATE * scan_states(x, A)


def selective_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """y (B, L, D) and the last state (B, D, N) of the diagonal recurrence (module docstring); B, C are
    (B, L, N) or time-invariant (D, N); h0 (B, D, N) or None (zeros)."""
    return torch.ops.bench_ssm.selective_scan(x, delta, A, B, C, h0)


def scan_reference(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The same recurrence as a plain loop over positions (the tests' reference; differentiable by autograd)."""
    b, length, d = x.shape
    h = x.new_zeros(b, d, A.shape[1]) if h0 is None else h0
    ys = []
    for t in range(length):
        bt = B[:, t, None, :] if B.dim() == 3 else B                     # (B, 1, N) or (D, N)
        ct = C[:, t, None, :] if C.dim() == 3 else C
        h = torch.exp(delta[:, t, :, None] * A) * h + (delta[:, t] * x[:, t])[..., None] * bt   # (B, D, N)
        ys.append((h * ct).sum(-1))                                       # (B, D)
    return torch.stack(ys, 1), h
