"""``timm:NAME`` — any timm model, random weights, nothing downloaded; and timm's published cost table.

timm is an optional extra (``pip install -c constraints.txt -e '.[timm]'``): this module imports without it,
and only resolving or building a ``timm:`` name imports timm (``timm:foo`` without it is one-line bad input).

**Image size.** A timm model whose pretrained config says ``fixed_input_size`` (ViT, Swin, Swin V2, MViT v2,
CoAtNet, MaxViT: position tables, window grids or pooling sizes follow the input) is built for the config's
``img_size`` (``timm.create_model(..., img_size=S)``); a convolutional one (``fixed_input_size`` false) takes any
input and gets no ``img_size``. A ``timm:`` spec's ``img_size`` starts at the model's own default input side
(``swinv2_tiny_window8_256``: 256) and, as for every config with that field, a suite's or ``bench flops``'s
workload ``img_size`` overrides it.

**Fused attention.** ``fused_attn=True`` (default) keeps timm's own choice (``F.scaled_dot_product_attention``
where tested; the ``TIMM_FUSED_ATTN`` variable is honoured); ``False`` builds the model under
``timm.layers.set_fused_attn(False)``: explicit ``softmax(q @ kᵀ) @ v`` matmuls — the same MACs for our counter,
but the only form fvcore (whose trace has no handle for SDPA) can count, hence the form of timm's published GMACs.

**Published numbers** (:func:`published`): rows of timm's ``results/benchmark-infer-amp-nchw-pt291-cu130-5090.csv``
vendored in ``data/timm_published.csv`` (source file and commit in its first line). Their ``infer_gmacs`` is
fvcore's ``FlopCountAnalysis.total()`` at batch 1 — matmul MACs *plus* fvcore's norm and pooling counts — so it
is compared with fvcore's total on our side, not with our counter (see tests/test_timm_models.py).
"""
from __future__ import annotations

import csv
import difflib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from torch import nn

from architectures.inputs import image_inputs
from harness.api import ArchSpec, BenchInputError, register_namespace

TIMM_MISSING = "timm is not installed: pip install -c constraints.txt -e '.[timm]'"
PUBLISHED_CSV = Path(__file__).parent / "data" / "timm_published.csv"


@dataclass(frozen=True)
class TimmConfig:
    name: str
    num_classes: int = 1000
    img_size: int = 224          # input side; resolve() sets the model's default, a workload's img_size overrides
    fused_attn: bool = True      # False: explicit attention matmuls (timm.layers.set_fused_attn(False))

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a timm model name")
        if self.num_classes <= 0 or self.img_size <= 0:
            raise ValueError("num_classes and img_size must be positive")


def _timm() -> ModuleType:
    """timm, imported on first use; a BenchInputError saying how to install it when it is missing."""
    try:
        import timm
    except ImportError:
        raise BenchInputError(TIMM_MISSING, where="arch") from None
    return timm


def _pretrained_cfg(name: str) -> object | None:
    return _timm().models.get_pretrained_cfg(name, allow_unregistered=True)


def default_img_size(name: str) -> int:
    """The input side timm's pretrained config gives ``name`` (224 where it has none)."""
    cfg = _pretrained_cfg(name)
    size = getattr(cfg, "input_size", None)
    return int(size[-1]) if size else 224


def takes_img_size(name: str) -> bool:
    """Whether the model is built for one input size (its pretrained config's ``fixed_input_size``)."""
    return bool(getattr(_pretrained_cfg(name), "fixed_input_size", False))


def build(cfg: TimmConfig) -> nn.Module:
    """``timm.create_model(cfg.name)`` with random weights, ``img_size`` where the model takes one."""
    timm = _timm()
    kwargs = {"img_size": cfg.img_size} if takes_img_size(cfg.name) else {}
    if cfg.fused_attn:
        return timm.create_model(cfg.name, pretrained=False, num_classes=cfg.num_classes, **kwargs)
    from timm.layers import set_fused_attn, use_fused_attn   # timm is importable here (_timm above)
    was, was_experimental = use_fused_attn(), use_fused_attn(experimental=True)
    set_fused_attn(False)                  # read by each attention module's __init__; restored right after
    try:
        return timm.create_model(cfg.name, pretrained=False, num_classes=cfg.num_classes, **kwargs)
    finally:
        set_fused_attn(was, experimental=was_experimental)


def resolve(name: str) -> ArchSpec:
    """The ArchSpec of ``timm:NAME``; BenchInputError if timm is missing or has no model ``name``."""
    timm = _timm()
    if not name or not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3) if name else []
        hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
        raise BenchInputError(f"timm has no model {name!r}{hint}", where="arch")
    return ArchSpec(f"timm:{name}", "timm", TimmConfig(name, img_size=default_img_size(name)), build, image_inputs,
                    f"timm {name} (random weights)")


class Published(NamedTuple):
    """One model's row of timm's published table: GMACs (fvcore's total), millions of parameters, input side."""

    gmacs: float
    mparams: float
    img_size: int


@cache
def _published_rows() -> dict[str, Published]:
    with PUBLISHED_CSV.open(newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {r["model"]: Published(float(r["infer_gmacs"]), float(r["param_count"]), int(r["infer_img_size"]))
                for r in rows}


def published_models() -> tuple[str, ...]:
    """The timm model names the vendored table has, in its order."""
    return tuple(_published_rows())


def published(name: str) -> Published:
    """timm's published (gmacs, mparams, img_size) for ``name``; KeyError naming the table's models if absent."""
    rows = _published_rows()
    if name not in rows:
        raise KeyError(f"{name!r} is not in {PUBLISHED_CSV.name}; it has {', '.join(rows)}")
    return rows[name]


register_namespace("timm", resolve)
