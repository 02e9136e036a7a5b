"""``torchvision:NAME`` — any torchvision classification model, random weights, nothing downloaded."""
from __future__ import annotations

from dataclasses import dataclass

import torchvision
from torch import nn

from architectures.inputs import image_inputs
from harness.errors import BenchInputError
from harness.registry import register_namespace
from harness.spec import ArchSpec


@dataclass(frozen=True)
class TorchvisionConfig:
    name: str
    num_classes: int = 1000
    img_size: int = 224          # default input side when the workload gives none

    def __post_init__(self) -> None:
        if self.num_classes <= 0 or self.img_size <= 0:
            raise ValueError("num_classes and img_size must be positive")


def classification_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build(cfg: TorchvisionConfig) -> nn.Module:
    kwargs = {"image_size": cfg.img_size} if cfg.name.startswith("vit_") else {}
    return torchvision.models.get_model(cfg.name, weights=None, num_classes=cfg.num_classes, **kwargs)


def resolve(name: str) -> ArchSpec:
    if name not in classification_models():
        raise BenchInputError(f"torchvision has no classification model {name!r}", where="arch")
    return ArchSpec(f"torchvision:{name}", "torchvision", TorchvisionConfig(name), build, image_inputs,
                    f"torchvision.models.{name} (random weights)")


register_namespace("torchvision", resolve)
