"""Memory instrument: live-tensor tracking, CPU/CUDA peak measurement, fake-tensor estimates.

The tensor peak counts the bytes of tensor storages created by the ATen ops that run while
:class:`LiveTensorTracker` is active (after autograd, so backward ops are seen too). It does
not see memory that kernels allocate internally (oneDNN/MKL scratch, the CPU flash-attention
work buffers), allocator caching or fragmentation, or non-tensor memory; the RSS high-water
mark (CPU) and the caching allocator's peaks (CUDA) cover those, coarsely.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

__all__ = [
    "LiveTensorTracker",
    "estimate_peak",
    "measure_peak_cpu",
    "measure_peak_cuda",
    "memory_budget",
    "tensor_bytes",
]


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The untyped storages behind ``t`` (recursing into traceable wrapper subclasses)."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        out: list[torch.UntypedStorage] = []
        for name in attrs:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):
                out.extend(_storages(inner))
        return out
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # sparse, nested, ... have no single storage
        return []


class LiveTensorTracker(TorchDispatchMode):
    """Tracks bytes of live tensor storages created while active; .peak_bytes, .current_bytes, .reset().

    Every storage an op returns that none of the op's inputs already had is counted once, by its
    ``nbytes`` (so views and in-place ops add nothing, and fake/meta tensors count like real
    ones), and subtracted when the storage is freed: PyTorch keeps one Python object per live
    storage, and a weakref callback on it fires when the storage dies. Storages that existed
    before the mode (parameters, inputs) are never counted; a tracked storage that an op
    resizes is re-measured.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def reset(self) -> None:
        """Set the peak to the bytes live now (frees of tracked storages keep being counted)."""
        self.peak_bytes = self.current_bytes

    def _freed(self, key: int, ref: weakref.ref) -> None:
        entry = self._live.get(key)
        if entry is not None and entry[0] is ref:
            del self._live[key]
            self.current_bytes -= entry[1]

    def _track(self, st: torch.UntypedStorage) -> None:
        key, nbytes = id(st), st.nbytes()
        entry = self._live.get(key)
        if entry is not None and entry[0]() is st:
            self.current_bytes += nbytes - entry[1]  # resized (e.g. an out= op)
            self._live[key] = (entry[0], nbytes)
            return
        ref = weakref.ref(st, lambda r, k=key: self._freed(k, r))
        self._live[key] = (ref, nbytes)
        self.current_bytes += nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        inputs = {id(s) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) for s in _storages(t)}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    if id(st) not in inputs or id(st) in self._live:
                        self._track(st)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes, or None where unavailable."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_rss_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure_peak_cpu(fn: Callable[[], object]) -> dict[str, int | None]:
    """Run ``fn`` once under the tracker; return its tensor peak and the process RSS high-water mark.

    ``rss_hwm_bytes`` is the peak resident set of the whole process during ``fn`` (including
    ``rss_before_bytes``); both are None where /proc is unavailable or the reset is refused.
    """
    gc.collect()
    can_reset = _reset_rss_hwm()
    rss_before = _proc_status_bytes("VmRSS") if can_reset else None
    with LiveTensorTracker() as tracker:
        result = fn()
    hwm = _proc_status_bytes("VmHWM") if can_reset else None
    del result
    return {"tensor_peak_bytes": tracker.peak_bytes, "rss_hwm_bytes": hwm, "rss_before_bytes": rss_before}


def measure_peak_cuda(fn: Callable[[], object], device: torch.device | str | int) -> dict[str, int]:
    """Run ``fn`` once on ``device``; return the caching allocator's peaks and the allocation before.

    Peaks are process-wide on that device and include ``cuda_allocated_before_bytes``.
    """
    device = torch.device(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    del result
    return {
        "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "cuda_allocated_before_bytes": before,
    }


def activation_peak_cuda(peak: dict[str, int | float]) -> int:
    """The step's own peak on CUDA, meaning what ``activation_peak_bytes`` means on the CPU: the allocator's peak
    during the step (``cuda_max_allocated_bytes``, after a reset) minus the bytes allocated before it
    (``cuda_allocated_before_bytes``: parameters, buffers, inputs and whatever else was alive). Never negative;
    a peak below the bytes before it is an inconsistent reading (the peak was not reset): a ValueError."""
    top, before = int(peak["cuda_max_allocated_bytes"]), int(peak["cuda_allocated_before_bytes"])
    if top < before:
        raise ValueError(f"CUDA peak {top} B below the {before} B allocated before the step: peak stats not reset")
    return top - before


def estimate_peak(fn_fake: Callable[[], object], mode: Any | None = None) -> int:
    """Tensor peak bytes of ``fn_fake`` run on fake tensors (see harness/instruments/fake.py); allocates nothing real.

    If ``mode`` (a FakeTensorMode) is given it is entered beneath the tracker, so factory calls
    inside ``fn_fake`` are faked too. Only what ``fn_fake`` creates is counted: build the fake
    model and inputs outside it to match :func:`measure_peak_cpu` on the real ones.
    """
    tracker = LiveTensorTracker()
    with contextlib.nullcontext() if mode is None else mode, tracker:
        fn_fake()
    return tracker.peak_bytes


def memory_budget(device: torch.device | str) -> int:
    """Default memory budget in bytes for ``device``.

    CPU: 80% of psutil's available memory (leaves headroom for the OS and page cache).
    CUDA: 90% of the device's total memory minus what this process's caching allocator has
    reserved now (other processes on the GPU are not accounted for). Never negative.
    """
    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return max(0, int(0.9 * total) - torch.cuda.memory_reserved(device))
    if device.type == "cpu":
        return int(0.8 * psutil.virtual_memory().available)
    raise ValueError(f"no memory budget for device type {device.type!r}")


def tensor_bytes(tensors_or_module: nn.Module | torch.Tensor | Iterable[torch.Tensor]) -> int:
    """Bytes of a module's parameters and buffers, or of tensors; shared storages count once."""
    if isinstance(tensors_or_module, nn.Module):
        tensors: Iterable[torch.Tensor] = [*tensors_or_module.parameters(), *tensors_or_module.buffers()]
    elif isinstance(tensors_or_module, torch.Tensor):
        tensors = [tensors_or_module]
    else:
        tensors = tensors_or_module
    seen: dict[int, torch.UntypedStorage] = {}  # holding the storages keeps their ids unique
    for t in tensors:
        for st in _storages(t):
            seen.setdefault(id(st), st)
    return sum(st.nbytes() for st in seen.values())
