"""Fake (meta-backed) placement: run a model's shapes with no memory and no arithmetic.

A module built on the ``meta`` device is wrapped as fake tensors that *report* the target
device, so dispatch picks the same kernels as a real run (e.g. the CPU flash SDPA), while
nothing is allocated. FLOP counting and the memory guard run here; a case's model is placed here by
:func:`harness.engine.models.materialize`. Usage::

    mode = new_fake_mode()
    model = build_fake(lambda: build(cfg), mode, device)   # outside ``with mode``
    with mode:
        inputs = make_inputs(...)                          # factories yield fake tensors
        model(*inputs)
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode



def new_fake_mode() -> FakeTensorMode:
    """A FakeTensorMode that accepts the real tensors a model may hold (e.g. constants)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def build_fake(build: Callable[[], nn.Module], mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """Build ``build()`` on meta, then make every parameter and buffer a fake tensor on ``device``.

    Call it with ``mode`` *not* entered (``_apply`` cannot swap tensors inside the mode). A model
    whose constructor reads tensor data (torchvision's RegNet computes stage widths from tensors)
    cannot be built on meta: it is built for real on the CPU once and then converted.
    """
    try:
        with torch.device("meta"):
            model = build()
    except (NotImplementedError, RuntimeError):
        with torch.device("cpu"):
            model = build()
    ties = _shared_parameters(model)
    model._apply(lambda t: FakeTensor(mode, t, device) if t.device.type == "meta"
                 else FakeTensor(mode, t.to("meta"), device))
    for places in ties:                       # _apply converts a shared Parameter once per owner: re-tie
        first_owner, first_name = places[0]
        for owner, name in places[1:]:
            setattr(owner, name, getattr(first_owner, first_name))
    return model


def _shared_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Groups of (module, attribute) places that hold one and the same Parameter (tied weights)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((module, name))
    return [p for p in places.values() if len(p) > 1]
