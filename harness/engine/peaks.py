"""A step's rates against its device's published peak: samples, tokens and model FLOPs per second, and MFU / HFU
where the device's dense peak is quoted (:data:`DEVICE_PEAKS`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.contract.spec import Workload

__all__ = ["DEVICE_PEAKS", "DevicePeak", "device_name", "device_peak", "matmul_precision", "rates"]


@dataclass(frozen=True)
class DevicePeak:
    """A device's published DENSE peak in FLOP/s per precision (never the 2:4-sparsity figure), with its source.
    ``matches(name)``: every word of ``needs`` in ``torch.cuda.get_device_name()``, none of ``excludes``."""

    label: str
    needs: tuple[str, ...]
    excludes: tuple[str, ...]
    bf16: float
    fp16: float
    tf32: float
    fp32: float
    source: str

    def matches(self, name: str) -> bool:
        low = name.lower()
        return all(w.lower() in low for w in self.needs) and not any(w.lower() in low for w in self.excludes)


# Quoted from NVIDIA's data sheets (dense, no sparsity): H100 SXM5 (H100 datasheet, "SXM" column, the figures
# without the sparsity asterisk), H200 SXM (the same Hopper compute as H100 SXM), A100 (SXM and PCIe alike).
# A PCIe or NVL H100/H200 has lower clocks and other figures: not in the table, so it reports no MFU.
DEVICE_PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("NVIDIA H100 SXM", ("h100",), ("pcie", "nvl"), 989.4e12, 989.4e12, 494.7e12, 66.9e12,
               "NVIDIA H100 Tensor Core GPU datasheet, SXM, dense"),
    DevicePeak("NVIDIA H200 SXM", ("h200",), ("nvl",), 989.4e12, 989.4e12, 494.7e12, 66.9e12,
               "NVIDIA H200 datasheet, SXM (Hopper, the H100 SXM's compute), dense"),
    DevicePeak("NVIDIA A100", ("a100",), (), 312e12, 312e12, 156e12, 19.5e12,
               "NVIDIA A100 Tensor Core GPU datasheet, dense"),
)


def device_peak(name: str) -> DevicePeak | None:
    """The table's row for a device name (``torch.cuda.get_device_name``), or None: no published peak."""
    return next((row for row in DEVICE_PEAKS if row.matches(name)), None)


def matmul_precision(w: Workload) -> str:
    """The precision the step's matmuls run in: the amp dtype, else the workload's dtype, where fp32 on CUDA is
    ``tf32`` when PyTorch lets fp32 matmuls use TF32 (``torch.backends.cuda.matmul.allow_tf32``)."""
    if w.amp != "none":
        return w.amp
    if w.dtype == "fp32" and w.device.startswith("cuda") and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return w.dtype


def device_name(device: str) -> str:
    """The device's own name: ``torch.cuda.get_device_name`` on CUDA; ``cpu``/``mps`` otherwise."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" and torch.cuda.is_available() else dev.type


def rates(w: Workload, median_s: float, model_flops: float | None, flops: float | None,
          name: str) -> tuple[dict[str, float], str]:
    """A training step's rates from its median time: ``samples_per_s``, ``tokens_per_s`` (with a sequence
    length), ``model_flops_per_s``; with ``name``'s published dense peak (:data:`DEVICE_PEAKS`)
    ``published_peak_flops_per_s``, ``mfu`` (model FLOPs: no recomputation) and ``hfu`` (counted FLOPs of the
    step as run, recomputation included). Returns the metrics and a note ("" or why there is no MFU)."""
    out = {"samples_per_s": w.batch_size / median_s}
    if w.seq_len:
        out["tokens_per_s"] = w.batch_size * w.seq_len / median_s
    if model_flops is not None:
        out["model_flops_per_s"] = model_flops / median_s
    row = device_peak(name)
    if row is None:
        return out, f"MFU: no published peak for this device ({name})"
    peak = getattr(row, matmul_precision(w))
    out["published_peak_flops_per_s"] = peak
    if model_flops is not None:
        out["mfu"] = model_flops / median_s / peak
    if flops is not None:
        out["hfu"] = flops / median_s / peak
    return out, ""
