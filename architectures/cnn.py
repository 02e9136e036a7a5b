"""Convolutional networks: friendly-named torchvision classifiers and a small from-scratch ResNet.

The torchvision presets are :mod:`architectures.torchvision_models` configs under short names
(random weights, nothing downloaded). They declare no ``cost``: an analytic formula per
torchvision family would duplicate its builder, and published metadata is not analytic; the
harness counts their params and MACs on fake tensors instead. ``resnet-micro`` is a CIFAR-style
ResNet (He et al., 2016, §4.2) for CPU training experiments, with an exact cost formula.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from architectures.inputs import image_inputs
from architectures.torchvision_models import TorchvisionConfig
from architectures.torchvision_models import build as build_torchvision
from harness.api import ArchSpec, Workload, register

# friendly name -> torchvision builder
TORCHVISION_PRESETS: dict[str, str] = {
    "resnet18": "resnet18",
    "resnet50": "resnet50",
    "resnet101": "resnet101",
    "efficientnet-b0": "efficientnet_b0",
    "mobilenet-v3-large": "mobilenet_v3_large",
    "mobilenet-v3-small": "mobilenet_v3_small",
    "convnext-tiny": "convnext_tiny",
    "regnet-y-400mf": "regnet_y_400mf",
}
# 64² keeps every downsampling stage at >= 2×2, so BatchNorm sees > 1 value per channel at batch 2
TORCHVISION_SMALL = (("img_size", 64), ("num_classes", 10))


@dataclass(frozen=True)
class ResNetMicroConfig:
    """3×3 stem at full resolution, then ``n_stages`` stages of ``blocks`` BasicBlocks; stage i has
    ``width · 2^i`` channels and (for i > 0) halves the resolution."""

    img_size: int = 32
    width: int = 32
    n_stages: int = 3
    blocks: int = 2
    num_classes: int = 10

    def __post_init__(self) -> None:
        for name in ("img_size", "width", "n_stages", "blocks", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def widths(self) -> list[int]:
        return [self.width * 2 ** i for i in range(self.n_stages)]



def shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    """A residual block's shortcut: identity, or a strided 1×1 conv + BatchNorm when the shape changes."""
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

class BasicBlock(nn.Module):
    """relu(BN(conv3×3(relu(BN(conv3×3(x))))) + shortcut(x)); a 1×1 conv + BN shortcut when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.shortcut = shortcut(c_in, c_out, stride)

    def forward(self, x: Tensor) -> Tensor:                        # (B, C_in, H, W) -> (B, C_out, H/s, W/s)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNetMicro(nn.Module):
    """Images (B, 3, S, S) -> logits (B, num_classes)."""

    def __init__(self, cfg: ResNetMicroConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.stem = nn.Sequential(nn.Conv2d(3, cfg.width, 3, 1, 1, bias=False), nn.BatchNorm2d(cfg.width), nn.ReLU())
        blocks, c_in = [], cfg.width
        for i, c in enumerate(cfg.widths()):
            for j in range(cfg.blocks):
                blocks.append(BasicBlock(c_in, c, stride=2 if i > 0 and j == 0 else 1))
                c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, cfg.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.blocks(self.stem(images))                         # (B, C_last, S/2^(n-1), S/2^(n-1))
        return self.head(x.mean(dim=(2, 3)))                       # (B, num_classes)


def resnet_micro_cost(cfg: ResNetMicroConfig, w: Workload) -> dict[str, int]:
    """Exact parameters (conv weights, BN scale/shift, head) and forward MACs (convs + head)."""
    side = w.img_size or cfg.img_size
    params, macs = 27 * cfg.width + 2 * cfg.width, side * side * 27 * cfg.width
    c_in = cfg.width
    for i, c in enumerate(cfg.widths()):
        for j in range(cfg.blocks):
            stride = 2 if i > 0 and j == 0 else 1
            side = (side - 1) // stride + 1                        # 3×3 pad 1 and 1×1 pad 0 alike: ⌈S/s⌉
            projected = stride != 1 or c_in != c                   # 1×1 conv + BN shortcut
            weights = 9 * c_in * c + 9 * c * c + (c_in * c if projected else 0)
            params += weights + 2 * c * (3 if projected else 2)    # + BN scale and shift per norm
            macs += side * side * weights
            c_in = c
    params += c_in * cfg.num_classes + cfg.num_classes
    macs += c_in * cfg.num_classes
    return {"params": params, "macs": w.batch_size * macs}


for _name, _builder in TORCHVISION_PRESETS.items():
    register(ArchSpec(_name, "cnn", TorchvisionConfig(_builder), build_torchvision, image_inputs,
                      f"torchvision.models.{_builder} (random weights)", small=TORCHVISION_SMALL))

_micro = ResNetMicroConfig()
register(ArchSpec("resnet-micro", "cnn", _micro, ResNetMicro, image_inputs,
                  f"CIFAR-style ResNet, {_micro.img_size}², {_micro.n_stages} stages × {_micro.blocks} BasicBlocks, "
                  f"width {_micro.width}",
                  small=(("width", 8), ("blocks", 1), ("n_stages", 2)), cost=resnet_micro_cost))
