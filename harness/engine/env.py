"""Machine and software fingerprint stored with every run.

``hard`` keys decide whether two runs are comparable (same CPU/GPU, software, settings);
``soft`` fields are context (host, time, commit).
"""
from __future__ import annotations

import ctypes
import gc
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")
"""The vector-ISA flags of /proc/cpuinfo that the fingerprint keeps (x86 AVX2, AVX-512, AMX; Arm NEON, SVE): the
kernels torch picks depend on them, and virtual machines name very different CPUs alike ("Intel Xeon Processor")."""


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU as /proc/cpuinfo tells it apart beyond its model name: ``vendor``, ``family``, ``model``, ``stepping``
    (x86; ``implementer``/``part`` on Arm) and ``isa``, the sorted :data:`ISA_FLAGS` it has. ``{}`` where there is
    no /proc/cpuinfo. ``cpuinfo``: the file's text (read when None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if first:
                break                       # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    names = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
             "CPU implementer": "implementer", "CPU part": "part"}
    out: dict[str, Any] = {v: first[k] for k, v in names.items() if k in first}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    if out or flags:
        out["isa"] = sorted(flags & set(ISA_FLAGS))
    return out


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware), the default thread count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=5).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def gpu_info() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "memory_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}",
                    "multiprocessors": p.multi_processor_count})
    return out


def fingerprint(threads: int | None = None) -> dict[str, Any]:
    """Everything needed to say where and how a number was measured."""
    try:
        import psutil
        mem = psutil.virtual_memory().total
    except ImportError:  # pragma: no cover
        mem = None
    hard = {
        "cpu": cpu_model(),
        "cpu_id": cpu_identity(),
        "cores": usable_cores(),
        "memory_bytes": mem,
        "gpus": gpu_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "mkldnn": torch.backends.mkldnn.is_available(),
    }
    soft = {"host": platform.node(), "platform": platform.platform(), **git_commit()}
    return {"hard": hard, "soft": soft}


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the process that started it dies (a worker or a rank never
    outlives its parent, e.g. after ``kill -9``)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def freeze_heap() -> None:
    """One full garbage collection, then ``gc.freeze()``: the objects alive now are left out of every later collection.

    The harness collects garbage before each memory measurement and after each dropped model
    (:func:`harness.instruments.memory.measure_peak_cpu`, :func:`harness.engine.models.release`). A full collection
    walks every tracked object, and torch's and the zoo's imports alone are ~200,000: 0.1 s a collection in a fresh
    worker, 0.3 s in a process that also loaded the reports. Frozen, they are skipped, and a collection walks only what
    the cases made since. Cyclic garbage among the frozen objects is never collected, so a process calls this once,
    after its imports and before its first case: what is alive then stays alive."""
    gc.collect()
    gc.freeze()
