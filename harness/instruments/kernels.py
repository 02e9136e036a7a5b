"""Which SDPA kernel a step really runs, and the attention work its causal kernels skip: one real call, observed.

The fake pass counts MACs from shapes, but on fake CUDA tensors SDPA always falls back to the math path,
so the kernel a GPU picks (flash, efficient, cuDNN or math) is known only from a real call. :func:`probe`
runs a step once and reports:

* ``sdpa_backend``: the backends the step's SDPA calls ran, sorted and joined with ``+`` (``"flash_cpu"``,
  ``"efficient"``, ``"cudnn+math"``, ...); ``""`` when the step made none. ``"math"`` is an
  ``F.scaled_dot_product_attention`` call that dispatched no fused kernel (PyTorch's composite O(n²) path).
* ``causal_skipped_macs``: the MACs the fused causal kernels did not compute, forward and backward: per call,
  the dense count (what :mod:`harness.instruments.flops` counts) minus the lower triangle
  (:func:`harness.instruments.flops.causal_scores`). Block-granular kernels compute a little more than the triangle
  (the upper part of each diagonal tile), so ``macs - causal_skipped_macs`` is a slight undercount of
  their work, as the dense ``macs`` is an overcount. The math path computes every score: it skips nothing.
* ``sdpa_calls``: the forward SDPA calls (a backward op is not a call).

How it sees them: a :class:`~torch.utils._python_dispatch.TorchDispatchMode` records every fused attention
op (:data:`harness.instruments.flops.FUSED_ATTENTION`, forward and backward, autograd's threads included), and
``torch.nn.functional.scaled_dot_product_attention`` is wrapped for the call (a plain function swap, as
:func:`harness.instruments.flops.counter._einsum_counted` does, not a TorchFunctionMode: an active one turns off fused fast
paths such as ``nn.MultiheadAttention``'s) to see the calls that reached no fused op, the math ones.
What neither sees counts as nothing: SDPA inside a fused C++ op (``nn.MultiheadAttention``'s eval fast path,
``_native_multi_head_attention``) and a math call made through ``torch._C._nn`` directly.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from harness.instruments.flops import fused_attention_call

__all__ = ["KernelReport", "probe"]

MATH = "math"


@dataclass(frozen=True)
class KernelReport:
    """What one real run of a step showed: the SDPA backends it ran (``"+"``-joined, ``""`` for none), the
    MACs its fused causal kernels skipped (forward and backward) and its forward SDPA calls."""

    sdpa_backend: str
    causal_skipped_macs: int
    sdpa_calls: int

    def executed_macs(self, macs: float) -> float:
        """``macs`` (the dense count of the same step) minus the skipped MACs. A skip larger than the count
        means the two describe different steps: ValueError, never a negative or clipped figure."""
        if self.causal_skipped_macs > macs:
            raise ValueError(f"causal kernels skipped {self.causal_skipped_macs:,} MACs of a step counted at "
                             f"{macs:,.0f}: the count and the probe are not of the same step")
        return macs - self.causal_skipped_macs


@dataclass
class _Seen:
    """What the probe has seen so far; ``open`` holds one set of backends per SDPA call in progress."""

    backends: set[str] = field(default_factory=set)
    skipped: int = 0
    calls: int = 0
    open: list[set[str]] = field(default_factory=list)

    def close_call(self) -> None:
        ran = self.open.pop()
        self.calls += 1
        self.backends |= ran or {MATH}


class _FusedAttentionMode(TorchDispatchMode):
    """Records each fused attention op: its backend (into the SDPA call in progress, if any) and its skip."""

    def __init__(self, seen: _Seen) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        call = fused_attention_call(func, args, kwargs)
        if call is not None:
            self.seen.skipped += call.skipped_macs
            if call.backward:
                self.seen.backends.add(call.backend)
            elif self.seen.open:
                self.seen.open[-1].add(call.backend)
            else:                                            # a fused op called directly, not through F.sdpa
                self.seen.calls += 1
                self.seen.backends.add(call.backend)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _sdpa_calls_seen(seen: _Seen) -> Iterator[None]:
    """While active, each ``F.scaled_dot_product_attention`` call opens a call in ``seen`` (the dispatch mode
    adds the fused backends it reaches; none means math). Module code reads ``F.<name>`` at call time, and
    ``F.multi_head_attention_forward`` reads its own module's global, so both see the wrapper."""
    original = F.scaled_dot_product_attention

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.open.append(set())
        try:
            return original(*args, **kwargs)
        finally:
            seen.close_call()

    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def probe(step: Callable[[], object]) -> KernelReport:
    """Run ``step()`` once, for real, and report the SDPA kernels it ran and the MACs their causal masks
    skipped (see the module docstring). Anything ``step`` raises propagates: a failed probe has no report.
    On CUDA the step's kernels are queued, not waited for; what the probe reads is known at dispatch."""
    seen = _Seen()
    with _sdpa_calls_seen(seen), _FusedAttentionMode(seen):
        step()
    return KernelReport("+".join(sorted(seen.backends)), seen.skipped, seen.calls)
