"""Fake placement: same parameters, same kernels, no memory — including tied weights and RegNet."""
from __future__ import annotations

import torch
import torchvision
from torch import nn

from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_params


def _tied() -> nn.Module:
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 100, bias=False))
    model[1].weight = model[0].weight          # an LM head tied to the embedding
    return model


def test_tied_parameters_stay_tied():
    fake = build_fake(_tied, new_fake_mode(), torch.device("cpu"))
    assert fake[1].weight is fake[0].weight
    assert count_params(fake) == count_params(_tied()) == 800


def test_model_that_reads_tensor_data_in_init_still_builds():
    """torchvision's RegNet computes stage widths from tensors: it cannot be built on meta."""
    build = lambda: torchvision.models.regnet_y_400mf()   # noqa: E731
    fake = build_fake(build, new_fake_mode(), torch.device("cpu"))
    assert count_params(fake) == torchvision.models.get_model_weights("regnet_y_400mf").DEFAULT.meta["num_params"]
    assert all(type(p).__name__ == "FakeTensor" or "Fake" in type(p.data).__name__ for p in fake.parameters())
