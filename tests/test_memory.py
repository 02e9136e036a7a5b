"""Memory instrument checked against the analytic sizes of the tensors involved."""
from __future__ import annotations


import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from harness.engine.steps import Step
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.memory import (
    LiveTensorTracker,
    activation_peak_cuda,
    estimate_peak,
    measure_peak_cpu,
    measure_peak_cuda,
    memory_budget,
    tensor_bytes,
)

MiB = 2**20
F32 = 4
BATCH, HEADS, N, HEAD_DIM = 1, 8, 4096, 64
SCORES = BATCH * HEADS * N * N * F32  # one n x n attention matrix: 512 MiB
OUT = BATCH * HEADS * N * HEAD_DIM * F32  # one [b, h, n, d] tensor: 8 MiB
LSE = BATCH * HEADS * N * F32  # flash logsumexp [b, h, n]: 128 KiB

# Eager attention, op by op (q, k, v exist before, so are not counted):
#   bmm(q, k^T) -> S              live: S
#   mul(., scale) -> S            live: 2S  (bmm result still alive as the mul's input)
#   softmax -> S                  live: 2S  (bmm result freed; scores + p)
#   bmm(p, v) -> OUT              live: 2S + OUT  (scores, p, out are all held by locals)
EAGER_PEAK = 2 * SCORES + OUT  # 1032 MiB
# CPU SDPA dispatches to _scaled_dot_product_flash_attention_for_cpu, which returns the
# output and the logsumexp; its per-thread work buffers are kernel-internal (not tensors).
SDPA_PEAK = OUT + LSE  # 8.125 MiB


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale
    p = scores.softmax(-1)
    out = p @ v
    return out


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def fake_inputs(make, mode: FakeTensorMode):
    with mode:
        return make()


def qkv(n: int = N) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(BATCH, HEADS, n, HEAD_DIM) for _ in range(3))


@pytest.fixture(scope="module")
def real_attention() -> dict[str, dict]:
    """Measure eager then SDPA once at n=4096 under no_grad (shared by the tests below)."""
    torch.manual_seed(0)
    q, k, v = qkv()
    with torch.no_grad():
        return {fn.__name__: measure_peak_cpu(lambda fn=fn: fn(q, k, v)) for fn in (eager_attention, sdpa_attention)}


def test_eager_attention_tensor_peak(real_attention: dict[str, dict]) -> None:
    peak = real_attention["eager_attention"]["tensor_peak_bytes"]
    assert peak >= SCORES
    assert peak == pytest.approx(EAGER_PEAK, rel=0.01)


def test_sdpa_tensor_peak_far_below_scores(real_attention: dict[str, dict]) -> None:
    peak = real_attention["sdpa_attention"]["tensor_peak_bytes"]
    assert peak < SCORES / 32
    assert peak == pytest.approx(SDPA_PEAK, rel=0.01)


def test_rss_hwm_moves_with_tensor_peak(real_attention: dict[str, dict]) -> None:
    eager, sdpa = real_attention["eager_attention"], real_attention["sdpa_attention"]
    if eager["rss_hwm_bytes"] is None:
        pytest.skip("no /proc/self/clear_refs: RSS high-water mark cannot be reset here")
    eager_delta = eager["rss_hwm_bytes"] - eager["rss_before_bytes"]
    sdpa_delta = sdpa["rss_hwm_bytes"] - sdpa["rss_before_bytes"]
    # 512 MiB buffers are above glibc's mmap threshold, so they are fresh pages, fully written:
    # the HWM sees (almost) all of 2S. The SDPA output is small enough that malloc may reuse
    # already-resident heap, so its delta is only bounded above (output + flash work buffers).
    assert eager_delta >= 0.9 * 2 * SCORES
    assert sdpa_delta < 64 * MiB
    assert eager_delta > 10 * sdpa_delta


@pytest.mark.parametrize("fn", [eager_attention, sdpa_attention])
def test_fake_estimate_matches_real(fn, real_attention: dict[str, dict]) -> None:
    mode = new_fake_mode()
    q, k, v = fake_inputs(qkv, mode)
    with torch.no_grad():
        estimate = estimate_peak(lambda: fn(q, k, v), mode)
    assert estimate == pytest.approx(real_attention[fn.__name__]["tensor_peak_bytes"], rel=0.01)


def test_fake_estimate_costs_no_memory() -> None:
    n = 32768  # eager peak ~64 GiB, far beyond this machine's RAM
    mode = new_fake_mode()
    q, k, v = fake_inputs(lambda: qkv(n), mode)
    rss = psutil.Process().memory_info().rss
    with torch.no_grad():
        eager = estimate_peak(lambda: eager_attention(q, k, v), mode)
        sdpa = estimate_peak(lambda: sdpa_attention(q, k, v))  # tensors are fake; no mode needed
    assert psutil.Process().memory_info().rss - rss < 64 * MiB
    assert eager == 2 * HEADS * n * n * F32 + HEADS * n * HEAD_DIM * F32
    assert sdpa == HEADS * n * HEAD_DIM * F32 + HEADS * n * F32


def test_views_and_inplace_do_not_double_count() -> None:
    with LiveTensorTracker() as tracker:
        x = torch.zeros(1000)
        assert tracker.current_bytes == 4000
        v = x.view(10, 100)[::2].t()
        x.add_(1)
        v.mul_(2)
        x.unsqueeze_(0)
        assert tracker.current_bytes == 4000
        y = x * 2  # temporary
        assert tracker.current_bytes == 8000
        del y
        assert tracker.current_bytes == 4000
        assert tracker.peak_bytes == 8000
        tracker.reset()
        assert tracker.peak_bytes == 4000
        del x, v
        assert tracker.current_bytes == 0


def test_preexisting_tensors_not_counted_and_resize_tracked() -> None:
    a = torch.ones(256)
    with LiveTensorTracker() as tracker:
        a.add_(1)  # in-place on a tensor from before the mode
        a[:10].zero_()
        assert tracker.current_bytes == 0
        out = torch.empty(0)
        torch.add(a, a, out=out)  # resizes a tracked storage
        assert tracker.current_bytes == 256 * F32
    assert tracker.peak_bytes == 256 * F32


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


B, D, H = 256, 64, 128
# Forward keeps relu's output r1 [B, H] saved (for ReluBackward and as mat1 of the second
# addmm). The backward peak is at threshold_backward: r1 + its incoming grad [B, H] + relu's
# grad output [B, H], with the second layer's weight and bias grads [D, H] + [D] already made;
# plus the scalar loss and its seed gradient (4 bytes each).
FWD_BWD_PEAK = (3 * B * H + D * H + D) * F32 + 2 * F32
GRADS = (D * H + H + H * D + D) * F32


def test_fwd_bwd_counts_saved_activations_and_grads() -> None:
    torch.manual_seed(0)
    model, x = _mlp(), torch.randn(B, D)
    with LiveTensorTracker() as tracker:
        loss = model(x).sum()
        fwd_peak, saved = tracker.peak_bytes, tracker.current_bytes
        loss.backward()
        del loss
    assert fwd_peak == 2 * B * H * F32  # first addmm output and relu output
    assert saved == B * H * F32 + F32  # saved r1 and the loss
    assert tracker.peak_bytes == FWD_BWD_PEAK
    assert tracker.current_bytes == GRADS == tensor_bytes(p.grad for p in model.parameters())
    # the same on fake tensors, and the fake model is parameter-for-parameter the real one
    mode = new_fake_mode()
    fake_model = build_fake(_mlp, mode, torch.device("cpu"))
    fx = fake_inputs(lambda: torch.randn(B, D), mode)
    assert estimate_peak(lambda: _fwd_bwd(fake_model, fx), mode) == FWD_BWD_PEAK
    assert tensor_bytes(fake_model) == tensor_bytes(model)


def test_tensor_bytes() -> None:
    lin = nn.Linear(1000, 1000)
    assert tensor_bytes(lin) == (1000 * 1000 + 1000) * 4
    tied = nn.Sequential(lin, nn.Linear(1000, 1000))
    tied[1].weight = lin.weight  # shared storage counts once
    assert tensor_bytes(tied) == (1000 * 1000 + 2 * 1000) * 4
    w = torch.zeros(10, 10)
    assert tensor_bytes([w, w[0], w.t()]) == 400
    assert tensor_bytes(nn.BatchNorm1d(10)) == (4 * 10) * 4 + 8  # 2 params, 2 stats, int64 count


def test_memory_budget_cpu() -> None:
    budget = memory_budget("cpu")
    assert 0 < budget < psutil.virtual_memory().total
    assert budget <= 0.8 * psutil.virtual_memory().total


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_peak_cuda() -> None:
    device = torch.device("cuda")
    x = torch.randn(1024, 1024, device=device)  # 4 MiB, allocated before
    result = measure_peak_cuda(lambda: (x @ x) @ x, device)
    assert result["cuda_allocated_before_bytes"] >= 4 * MiB
    # both 4 MiB products are alive together at the second matmul
    assert result["cuda_max_allocated_bytes"] - result["cuda_allocated_before_bytes"] >= 8 * MiB
    assert result["cuda_max_reserved_bytes"] >= result["cuda_max_allocated_bytes"]
    assert 0 <= memory_budget(device) < torch.cuda.get_device_properties(device).total_memory


# -- activation_peak_bytes means the same on CUDA as on the CPU (issue 26 item 3: C08 read "no value" on CUDA) ----
def test_activation_peak_cuda_is_the_peak_above_what_was_alive_before() -> None:
    peak = {"cuda_max_allocated_bytes": 9 * MiB, "cuda_allocated_before_bytes": 4 * MiB, "cuda_max_reserved_bytes": 0}
    assert activation_peak_cuda(peak) == 5 * MiB
    assert activation_peak_cuda({**peak, "cuda_max_allocated_bytes": 4 * MiB}) == 0     # a step that allocates nothing
    with pytest.raises(ValueError, match="not reset"):
        activation_peak_cuda({**peak, "cuda_max_allocated_bytes": MiB})


class _Step(Step):
    """A plain function as the measured step."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self):
        return self.fn()


def test_measure_memory_stores_activation_peak_on_cuda(monkeypatch) -> None:
    """A CUDA case (the allocator faked: no GPU here) stores ``activation_peak_bytes``, which C08 reads, next to
    ``peak_bytes`` — the same metric a CPU case stores."""
    from types import SimpleNamespace

    from harness.instruments import memory
    from harness.engine import measure
    seen = []
    monkeypatch.setattr(memory, "measure_peak_cuda", lambda fn, device: seen.append(fn()) or {
        "cuda_max_allocated_bytes": 2_254_000_000, "cuda_allocated_before_bytes": 54_000_000,
        "cuda_max_reserved_bytes": 2_400_000_000})
    p = SimpleNamespace(case=SimpleNamespace(workload=SimpleNamespace(device="cuda")), metrics={}, step=_Step(lambda: 1),
                        model=nn.Linear(4, 4), inputs=())
    measure.measure_memory(p)
    assert seen == [1]
    assert p.metrics["activation_peak_bytes"] == 2_200_000_000 and p.metrics["peak_bytes"] == 2_254_000_000
    cpu = SimpleNamespace(case=SimpleNamespace(workload=SimpleNamespace(device="cpu")), metrics={},
                          model=nn.Linear(4, 4), inputs=(torch.zeros(2, 4),), step=_Step(lambda: torch.ones(256)))
    measure.measure_memory(cpu)
    assert cpu.metrics["activation_peak_bytes"] == 256 * F32                              # the same meaning on CPU
    assert set(p.metrics) >= {"activation_peak_bytes", "peak_bytes"} <= set(cpu.metrics)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_activation_peak_on_cuda_matches_the_cpu_tensor_peak() -> None:
    """Eager attention's activation peak on CUDA (allocator) agrees with the CPU tracker's exact count (2 score
    matrices + the output, 1032 MiB), within the allocator's rounding and a cuBLAS workspace."""
    from types import SimpleNamespace

    from harness.engine import measure
    q, k, v = (t.cuda() for t in qkv())
    with torch.no_grad():
        eager_attention(q, k, v)                             # warm: cuBLAS handles and workspace allocated before
        p = SimpleNamespace(case=SimpleNamespace(workload=SimpleNamespace(device="cuda")), metrics={},
                            step=_Step(lambda: eager_attention(q, k, v)), model=nn.Identity(), inputs=())
        measure.measure_memory(p)
    assert 0.97 * EAGER_PEAK <= p.metrics["activation_peak_bytes"] <= 1.1 * EAGER_PEAK
