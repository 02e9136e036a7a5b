"""FLOP / MAC counting: ``torch.utils.flop_counter.FlopCounterMode`` plus formulas for the ops it misses.

One job per module, each importing only those below it:

* :mod:`~harness.instruments.flops.counter`: the MAC counter (:func:`count_flops`, :func:`count_model`,
  :func:`count_params`, :class:`FlopCount`): one counting pass, FLOPs, bytes moved and gaps together;
* :mod:`~harness.instruments.flops.trace`: the dependency trace (:func:`dependency_trace`), which ops a run
  dispatches and how deep each sits in its data-dependency graph;
* :mod:`~harness.instruments.flops.registry`: the formulas the counter adds to the stock one
  (:data:`EXTRA_FORMULAS`) and the book of work no formula counts (:data:`UNCOUNTED_CONTRACTIONS`);
* :mod:`~harness.instruments.flops.attention`: the fused attention ops, dense and causal
  (:func:`fused_attention_call`, :func:`causal_scores`);
* :mod:`~harness.instruments.flops.formulas`: the analytic formulas, shapes in, FLOPs out (:func:`sdpa_flops`,
  :func:`mha_flops`, :func:`einsum_flops`) and the counting conventions.

A multiply-accumulate is 2 FLOPs; ``macs = flops // 2``. A count that cannot be computed is a gap, never 0.
"""
from __future__ import annotations

from harness.instruments.flops.attention import (
    FUSED_ATTENTION,
    AttentionCall,
    FusedAttention,
    causal_scores,
    fused_attention_call,
)
from harness.instruments.flops.counter import (
    CountedCall,
    FlopCount,
    UncountedFlopsError,
    count_flops,
    count_model,
    count_params,
)
from harness.instruments.flops.formulas import einsum_flops, mha_flops, sdpa_backward_flops, sdpa_flops
from harness.instruments.flops.registry import EXTRA_FORMULAS, UNCOUNTED_CONTRACTIONS, FlopFormulaError
from harness.instruments.flops.registry import _registered  # noqa: F401 - wraps a formula as EXTRA_FORMULAS do
from harness.instruments.flops.trace import DependencyTrace, TracedOp, dependency_trace

__all__ = [
    "EXTRA_FORMULAS",
    "FUSED_ATTENTION",
    "UNCOUNTED_CONTRACTIONS",
    "AttentionCall",
    "CountedCall",
    "DependencyTrace",
    "FlopCount",
    "FlopFormulaError",
    "FusedAttention",
    "TracedOp",
    "UncountedFlopsError",
    "causal_scores",
    "count_flops",
    "count_model",
    "count_params",
    "dependency_trace",
    "einsum_flops",
    "fused_attention_call",
    "mha_flops",
    "sdpa_backward_flops",
    "sdpa_flops",
]
