"""``torchvision:NAME`` — any torchvision classification model, random weights, nothing downloaded.

Each spec carries its **quoted** ImageNet-1k top-1 (:func:`quoted_top1`): the accuracy torchvision publishes for
the model's default weights, read offline from the weights enum's metadata (``meta["_metrics"]["ImageNet-1K"]
["acc@1"]``) — a published figure, never measured here, attached to each case as ``quoted_top1`` with its source.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import nn

from architectures.inputs import image_inputs
from harness.api import ArchSpec, BenchInputError, Quoted, register_namespace


def _torchvision() -> ModuleType:
    import torchvision               # noqa: PLC0415 — on first use (see the module's docstring)
    return torchvision


@dataclass(frozen=True)
class TorchvisionConfig:
    name: str
    num_classes: int = 1000
    img_size: int = 224          # default input side when the workload gives none

    def __post_init__(self) -> None:
        if self.num_classes <= 0 or self.img_size <= 0:
            raise ValueError("num_classes and img_size must be positive")


def classification_models() -> list[str]:
    torchvision = _torchvision()
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build(cfg: TorchvisionConfig) -> nn.Module:
    kwargs = {"image_size": cfg.img_size} if cfg.name.startswith("vit_") else {}
    return _torchvision().models.get_model(cfg.name, weights=None, num_classes=cfg.num_classes, **kwargs)


def quoted_top1(name: str) -> Quoted | None:
    """The published ImageNet-1k top-1 (%) of ``name``'s default weights, from torchvision's own metadata (no
    download), with its source: the torchvision version, the weights and their eval crop. None where
    torchvision publishes none."""
    torchvision = _torchvision()
    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
        acc = float(weights.meta["_metrics"]["ImageNet-1K"]["acc@1"])
    except (KeyError, ValueError, AttributeError):
        return None
    crop = getattr(weights.transforms, "keywords", {}).get("crop_size")
    source = (f"torchvision {torchvision.__version__} {type(weights).__name__}.{weights.name} "
              f"meta _metrics ImageNet-1K acc@1 (published, not measured here, eval crop {crop})")
    return Quoted("quoted_top1", acc, source, when=(("num_classes", 1000),))


def resolve(name: str) -> ArchSpec:
    if name not in classification_models():
        raise BenchInputError(f"torchvision has no classification model {name!r}", where="arch")
    top1 = quoted_top1(name)
    return ArchSpec(f"torchvision:{name}", "torchvision", TorchvisionConfig(name), build, image_inputs,
                    f"torchvision.models.{name} (random weights)", quoted=(top1,) if top1 else ())


register_namespace("torchvision", resolve)
