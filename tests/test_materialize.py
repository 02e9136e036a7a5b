"""The one model build: real, fake and for counting give the same model (parameters, dtypes, wrapped blocks), and
the workload's activation checkpointing takes effect whichever it is."""
from __future__ import annotations

import pytest
import torch

from harness.contract import registry
from harness.contract.spec import Workload
from harness.engine.models import fake_case, materialize, real_case
from harness.engine.checkpointing import Checkpointed
from harness.instruments.fake import new_fake_mode
from harness.engine.flop_table import build_real
from harness.instruments.flops import count_params

CPU = torch.device("cpu")


def _shape(model: torch.nn.Module) -> tuple:
    """What the three builds must agree on: each parameter's name, shape and dtype, and the checkpointed blocks."""
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters())
    wrapped = tuple(n for n, m in model.named_modules() if isinstance(m, Checkpointed))
    return params, wrapped


@pytest.mark.parametrize("arch", ["decoder-tiny", "vit-micro"])
@pytest.mark.parametrize("dtype,checkpointing", [("fp32", "none"), ("bf16", "none"), ("bf16", "block")])
def test_real_fake_and_counting_builds_are_one_model(arch, dtype, checkpointing):
    spec = registry.get(arch)
    mode = "train_step" if checkpointing != "none" else "fwd"
    w = Workload(batch_size=1, seq_len=8, img_size=32, dtype=dtype, mode=mode, checkpointing=checkpointing)
    real = materialize(spec, w, CPU)
    fake, _, _ = fake_case(spec, w, CPU)
    counted, inputs = build_real(spec, w)                  # what `bench flops` counts
    assert _shape(real) == _shape(fake) == _shape(counted)
    assert count_params(real) == count_params(fake) == count_params(counted)
    assert {p.dtype for p in real.parameters()} == {torch.bfloat16 if dtype == "bf16" else torch.float32}
    assert any(isinstance(m, Checkpointed) for m in real.modules()) == (checkpointing != "none")
    assert all(type(p).__name__ == "FakeTensor" for p in fake.parameters())
    assert all(t.dtype == torch.bfloat16 for t in inputs if t.is_floating_point()) or dtype == "fp32"


def test_the_real_build_is_seeded_and_checkpointing_recomputes_in_the_backward():
    """Two real builds are the same weights; with checkpointing the blocks' forwards run again in the backward."""
    spec = registry.get("decoder-tiny")
    plain = Workload(batch_size=2, seq_len=8, mode="train_step")
    ckpt = Workload(batch_size=2, seq_len=8, mode="train_step", checkpointing="block")
    a, inputs = real_case(spec, plain, CPU)
    b = materialize(spec, ckpt, CPU)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    calls = {"a": 0, "b": 0}
    for name, model in (("a", a), ("b", b)):
        block = next(m for m in model.modules() if type(m).__name__ == "Block")
        block.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        model(*inputs).float().sum().backward()
    assert calls == {"a": 1, "b": 2}                        # the checkpointed block ran its forward twice
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
