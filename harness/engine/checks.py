"""The workload checks that need torch, run on every case when a suite is loaded (passed to
:func:`harness.contract.suite.load_suite` as ``checks=``): a training step needs trainable parameters; a case across
ranks needs as many devices as ranks."""
from __future__ import annotations

from harness.contract.spec import WorkloadCheck
from harness.engine.ranks import check_ranks
from harness.engine.training import check_trainable

__all__ = ["WORKLOAD_CHECKS"]

WORKLOAD_CHECKS: tuple[WorkloadCheck, ...] = (check_trainable, check_ranks)
