"""The registry, and every registered preset built and run (parametrized: new presets need no new test)."""
from __future__ import annotations

import pytest
import torch

from harness.contract import registry
from harness.contract.errors import BenchInputError
from harness.contract.spec import ArchSpec, Workload
from tests.helpers import counted_cost

@pytest.mark.parametrize("name", registry.list_archs())
def test_every_preset_builds_runs_and_backprops(name):
    spec = registry.get(name)
    assert spec.small, f"{name} declares no `small` overrides for tests"
    spec = registry.resolve(name, **dict(spec.small))
    model = spec.build(spec.config)
    inputs = spec.make_inputs(spec.config, Workload(batch_size=2, seq_len=8), torch.device("cpu"))
    out = model(*inputs)
    assert out.shape[0] == 2 and torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_list_wildcards_and_duplicates():
    assert "decoder-small" in registry.list_archs("decoder-*")
    assert registry.list_archs("nothing-*") == []
    spec = registry.get("decoder-small")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(spec)


def test_unknown_and_bad_overrides():
    with pytest.raises(BenchInputError, match="unknown architecture"):
        registry.get("gpt-17")
    with pytest.raises(BenchInputError, match="no config field"):
        registry.resolve("decoder-small", heads=3)
    with pytest.raises(BenchInputError, match="must divide"):
        registry.resolve("decoder-small", n_heads=7)
    with pytest.raises(BenchInputError, match="one of"):
        registry.resolve("decoder-small", attn_impl="flash9")


def test_torchvision_namespace():
    spec = registry.resolve("torchvision:resnet18", num_classes=10)
    model = spec.build(spec.config).eval()
    (x,) = spec.make_inputs(spec.config, Workload(batch_size=1, img_size=64), torch.device("cpu"))
    with torch.no_grad():
        assert model(x).shape == (1, 10)
    with pytest.raises(BenchInputError, match="no classification model"):
        registry.get("torchvision:resnet9000")


def test_learned_positions_past_max_len_is_a_clear_error():
    spec = registry.resolve("decoder-tiny", positions="learned", max_seq_len=16)
    model = spec.build(spec.config)
    with pytest.raises(ValueError, match="learned positions cover 16 tokens"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_user_registration_roundtrip():
    from dataclasses import dataclass
    from torch import nn

    @dataclass(frozen=True)
    class Cfg:
        width: int = 4

    spec = ArchSpec("test-user-mlp", "user", Cfg(), lambda c: nn.Linear(c.width, c.width),
                    lambda c, w, d: (torch.randn(w.batch_size, c.width),))
    registry.register(spec)
    try:
        got = registry.resolve("test-user-mlp", width=6)
        assert got.config.width == 6 and got.build(got.config).out_features == 6
    finally:
        registry._ARCHS.pop("test-user-mlp")


COSTED = [n for n in registry.list_archs() if registry.get(n).cost is not None]


@pytest.mark.parametrize("name", COSTED)
def test_every_cost_formula_equals_the_counters(name):
    """Each preset's analytic cost (at its small size, on fake tensors) equals the FLOP counter's forward
    MACs and the real parameter count exactly. Families also test random configs (hypothesis)."""
    spec = registry.resolve(name, **dict(registry.get(name).small))
    w = Workload(batch_size=2, seq_len=16)
    predicted = spec.cost(spec.config, w)
    assert (predicted["params"], predicted["macs"]) == counted_cost(spec, w)
