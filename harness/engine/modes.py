"""Each workload mode's step class (:class:`harness.engine.steps.Step`): the one place that knows which class
steps which mode, so that the runner asks a step, never a mode."""
from __future__ import annotations

from torch import nn

from harness.contract.spec import Workload
from harness.engine.generation import Generation
from harness.engine.steps import Forward, ForwardBackward, Step
from harness.engine.training import TrainStep

STEPS: dict[str, type[Step]] = {cls.mode: cls for cls in (Forward, ForwardBackward, TrainStep, Generation)}
"""Mode (:data:`harness.contract.spec.MODES`) -> the class of its step."""


def step_class(mode: str) -> type[Step]:
    """The class that steps workload mode ``mode`` (ValueError for a mode with none)."""
    try:
        return STEPS[mode]
    except KeyError:
        raise ValueError(f"no step for mode {mode!r}; expected one of {sorted(STEPS)}") from None


def step_for(model: nn.Module, inputs: tuple, w: Workload) -> Step:
    """The eager step of ``w``'s mode for ``model`` on ``inputs`` (made for the class's ``inputs_workload(w)``)."""
    return step_class(w.mode).for_workload(model, inputs, w)
