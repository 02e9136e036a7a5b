"""One timing path for every device (harness.instruments.timing): measure, measure_cuda, measure_interleaved and the A/B
worker all sample through one Sampler, which takes its clock — and nothing else — from the device. Checked on
a CPU by giving the "cuda" device a stand-in clock (perf_counter, counting its synchronizes): the CUDA path is
then run end to end without a GPU. The real CUDA events are checked against torch.utils.benchmark and triton's
do_bench in tests/test_timer_gpu.py and tests/test_timing.py (gpu-marked)."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch

from harness.instruments import timing
from harness.instruments.timing import TimingConfig, measure, measure_cuda, measure_interleaved

FAST = dataclasses.replace(TimingConfig.quick(), min_samples=6, min_time_s=0.02, max_time_s=0.5, warmup_s=0.005,
                           rounds=3)


class FakeCudaClock(timing.HostClock):
    """perf_counter standing in for CUDA events; counts the synchronizes and the blocks it timed."""

    name = "cuda_event"
    syncs = 0
    blocks = 0

    def context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def sync(self) -> None:
        FakeCudaClock.syncs += 1

    def block(self, fn, k, flush=None):
        FakeCudaClock.blocks += 1
        return super().block(fn, k, flush)


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeCudaClock.syncs = FakeCudaClock.blocks = 0
    monkeypatch.setitem(timing.CLOCKS, "cuda", FakeCudaClock)
    return FakeCudaClock


def _work():
    x = torch.ones(64)
    return lambda: x.add_(1.0)


def test_every_entry_point_on_cuda_samples_through_the_device_clock(fake_cuda):
    for r in (measure(_work(), FAST, "cuda"), measure_cuda(_work(), FAST, "cuda:0"),
              *measure_interleaved([_work(), _work()], FAST, "cuda")):
        assert r.clock == "cuda_event" and len(r.samples_s) >= 3 and all(s > 0 for s in r.samples_s)
        assert sum(r.rounds) == len(r.samples_s) and r.warmup_calls >= FAST.warmup_calls
    assert fake_cuda.blocks > 0 and fake_cuda.syncs > 0


def test_cuda_and_cpu_take_the_same_steps(fake_cuda):
    """Same warm-up, block size rule, stop rule and rounds on both devices: only the clock differs."""
    cpu, cuda = measure(_work(), FAST, "cpu"), measure(_work(), FAST, "cuda")
    assert cpu.clock == "perf_counter" and cuda.clock == "cuda_event"
    for r in (cpu, cuda):
        assert r.block_size > 1                           # a µs call is timed in blocks on both
        assert len(r.rounds) == FAST.rounds and r.l2_flush_bytes == 0
    # the fake clock synchronized around the cold call and after every warm-up call, never inside a block
    assert fake_cuda.syncs >= 2 + FAST.warmup_calls
    s = timing.Sampler(_work(), FAST, torch.device("cuda"))
    blocks = fake_cuda.blocks
    s.take_round(FAST)
    assert fake_cuda.blocks - blocks == s.rounds[0] == len(s.samples)


def test_a_device_without_a_clock_and_cuda_only_calls_are_refused():
    with pytest.raises(ValueError, match="unsupported device type"):
        measure(lambda: None, FAST, "meta")
    with pytest.raises(ValueError, match="needs a cuda device"):
        measure_cuda(lambda: None, FAST, "cpu")


def test_cuda_events_are_made_in_one_place_only():
    """No second CUDA timer: torch.cuda.Event and elapsed_time appear in harness.instruments.timing's CudaClock alone, and
    no other module of the project times with CUDA events."""
    repo = Path(timing.__file__).parent.parent
    for path in sorted(p for pkg in ("harness", "claims", "architectures", "reports", "cli")
                       for p in (repo / pkg).rglob("*.py")):
        tree = ast.parse(path.read_text())
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and (n.attr == "elapsed_time" or (
            n.attr == "Event" and isinstance(n.value, ast.Attribute) and n.value.attr == "cuda"))]
        if path != Path(timing.__file__):
            assert not found, f"{path} times with CUDA events: use harness.instruments.timing"
            continue
        inside = [n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "CudaClock"
                  for n in ast.walk(c) if n in found]
        assert found and len(inside) == len(found), "CUDA events outside harness.instruments.timing.CudaClock"
