"""This machine's measured peak: dense matmul FLOP/s per dtype and memory-copy bandwidth.

A roofline reference measured, not looked up: each case's achieved FLOP/s is later shown as a
share of the matmul peak of its dtype (``reports.frames``). Timed with ``harness.instruments.timing.measure``
(CPU wall clock or CUDA events), so the CPU and CUDA paths are the same code. Threads are not
touched here: the caller pins them, as for every other measurement.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from harness.instruments.torch_types import TORCH_DTYPES as DTYPES
from harness.instruments.timing import TimingConfig, measure

CPU_DTYPES: tuple[str, ...] = ("fp32", "bf16")
CUDA_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")


def default_dtypes(device: torch.device | str) -> tuple[str, ...]:
    return CUDA_DTYPES if torch.device(device).type == "cuda" else CPU_DTYPES


def _median(samples: tuple[float, ...]) -> float:
    s = sorted(samples)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def matmul_flops_per_s(device: torch.device, dtype: str, n: int, config: TimingConfig) -> float:
    """FLOP/s of one ``n × n @ n × n`` matmul (2n³ FLOPs) in ``dtype``: 2n³ / median time."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    c = torch.empty(n, n, device=device, dtype=DTYPES[dtype])
    timed = measure(lambda: torch.mm(a, b, out=c), config, device)
    return 2.0 * n ** 3 / _median(timed.samples_s)


def copy_bytes_per_s(device: torch.device, n_bytes: int, config: TimingConfig) -> float:
    """Bandwidth of ``dst.copy_(src)`` over ``n_bytes`` of fp32: bytes read + written per second."""
    numel = n_bytes // 4
    src = torch.ones(numel, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    timed = measure(lambda: dst.copy_(src), config, device)
    return 2.0 * numel * 4 / _median(timed.samples_s)


def calibrate(device: torch.device | str = "cpu", dtypes: tuple[str, ...] | None = None,
              quick: bool = True) -> dict[str, Any]:
    """Measured peaks on ``device``: ``{"device", "threads", "matmul_n", "matmul_flops_per_s": {dtype: FLOP/s},
    "copy_bytes": ..., "copy_bytes_per_s": B/s}``.

    CPU: n = 1024 (2048 when fp32 runs above ~200 GFLOP/s), a 64 MiB copy; CUDA: n = 4096 and a
    512 MiB copy. ``quick`` uses ``TimingConfig.quick()`` (≈ 1–3 s on a small CPU), else the full defaults.
    A dtype the device cannot run is left out (CPU fp16 matmul is emulated and not a peak).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dtypes = tuple(dtypes) if dtypes is not None else default_dtypes(dev)
    config = TimingConfig.quick() if quick else TimingConfig()
    cuda = dev.type == "cuda"
    n = 4096 if cuda else 1024
    flops: dict[str, float] = {}
    if not cuda and "fp32" in dtypes:
        flops["fp32"] = matmul_flops_per_s(dev, "fp32", n, config)
        if flops["fp32"] > 200e9:         # fast machine: a 1024 matmul is too short to reach peak
            n = 2048
            del flops["fp32"]
    for dt in dtypes:
        if dt in flops:
            continue
        try:
            flops[dt] = matmul_flops_per_s(dev, dt, n, config)
        except (RuntimeError, NotImplementedError):   # dtype unsupported on this device
            continue
    n_bytes = (512 if cuda else 64) * 1024 * 1024
    bandwidth = copy_bytes_per_s(dev, n_bytes, config)
    if cuda:
        torch.cuda.empty_cache()
    result = {"device": str(dev), "threads": torch.get_num_threads(), "matmul_n": n,
              "matmul_flops_per_s": {k: float(v) for k, v in flops.items() if math.isfinite(v) and v > 0},
              "copy_bytes": n_bytes, "copy_bytes_per_s": float(bandwidth), "quick": quick}
    return result


def calibrate_run(devices: Mapping[str, Iterable[str]] | Iterable[str], threads: int, quick: bool = True
                  ) -> dict[str, dict[str, Any]]:
    """One calibration per device a run's cases use, with torch pinned to the run's ``threads``.

    ``devices`` maps each device to the dtypes its cases use (only those are calibrated: a bf16 matmul on a
    CPU without bf16 units takes seconds), or lists devices (then :func:`default_dtypes`). Returns
    ``{device string: calibrate(...)}`` (stored as the run's ``options["peak"]``); CUDA devices are left out
    when CUDA is not available (those cases are skipped anyway). The caller's thread count is restored.
    """
    wanted = dict(devices) if isinstance(devices, Mapping) else {d: None for d in devices}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out: dict[str, dict[str, Any]] = {}
        for device in sorted(wanted):
            dev = torch.device(device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                continue
            if dev.type not in ("cpu", "cuda"):
                continue
            dtypes = wanted[device]
            out[device] = calibrate(dev, tuple(sorted(dtypes)) if dtypes is not None else None, quick=quick)
        return out
    finally:
        torch.set_num_threads(before)
