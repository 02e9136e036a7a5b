"""Energy meters: cumulative energy counters of a device (NVML, RAPL, a fake for tests).

A meter reads one or more **cumulative counters in joules** (``read()``: one value per domain), each of which
may wrap around at ``wrap_j`` (RAPL's ``max_energy_range_uj``; NVML's 64-bit millijoule counter does not wrap
in practice: ``None``), and, where the device reports one, an instantaneous **power** in watts (``power_w()``;
NVML ``nvmlDeviceGetPowerUsage``; RAPL has none). :func:`find_meter` gives the meter of a device, or an
:class:`Absent` with the reason ("no energy counter on this machine") — never a meter that reads 0.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["NO_COUNTER", "RAPL_ROOT", "Absent", "EnergyError", "EnergyMeter", "FakeMeter", "NvmlMeter", "RaplMeter",
           "energy_delta", "find_meter", "rapl_dram_zones", "rapl_zones", "zone_name"]

NO_COUNTER = "no energy counter on this machine"
RAPL_ROOT = Path("/sys/class/powercap")


class EnergyError(RuntimeError):
    """The energy pass could not produce a figure (a counter that never moved, went backwards, or failed)."""


class EnergyMeter(Protocol):
    """Cumulative energy counters of one device."""

    name: str                                   # e.g. "nvml:NVIDIA H100 80GB HBM3", "rapl:package-0+package-1"
    wrap_j: tuple[float | None, ...]            # per domain: where the counter wraps to 0 (None: never)

    def read(self) -> tuple[float, ...]:
        """Each domain's cumulative counter, in joules."""
        ...

    def power_w(self) -> float | None:
        """Instantaneous power of the device in watts, or None where it reports none."""
        ...


@dataclass(frozen=True)
class Absent:
    """No meter for a device, and why (stored and shown instead of a figure; never a 0)."""

    reason: str = NO_COUNTER


def energy_delta(before: Sequence[float], after: Sequence[float], wrap_j: Sequence[float | None]) -> float:
    """Joules between two readings, summed over domains; a domain whose counter went down wrapped once at its
    ``wrap_j`` (a counter without a wrap range that goes down is an :class:`EnergyError`)."""
    total = 0.0
    for b, a, wrap in zip(before, after, wrap_j, strict=True):
        if a >= b:
            total += a - b
        elif wrap is not None:
            total += a + wrap - b
        else:
            raise EnergyError(f"energy counter went backwards ({b:.6g} J → {a:.6g} J) and has no wrap range")
    return total


# --- meters ------------------------------------------------------------------------------------------------

class NvmlMeter:
    """One NVIDIA GPU through NVML (``nvidia-ml-py``, the ``energy`` extra): the total-energy counter (mJ since
    the driver loaded; Volta and newer) and the power reading (mW)."""

    def __init__(self, index: int = 0, uuid: str | None = None) -> None:
        import pynvml   # lazily: the energy extra, not needed on a CPU
        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = (pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid
                        else pynvml.nvmlDeviceGetHandleByIndex(index))
        gpu = pynvml.nvmlDeviceGetName(self._handle)
        self.name = f"nvml:{gpu.decode() if isinstance(gpu, bytes) else gpu}"
        self.wrap_j: tuple[float | None, ...] = (None,)
        self.read()     # raises here when the counter is not supported, so find_meter reports it absent

    def read(self) -> tuple[float, ...]:
        return (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3,)

    def power_w(self) -> float | None:
        try:
            return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3
        except self._nvml.NVMLError:
            return None


class RaplMeter:
    """The CPU packages' RAPL counters (``/sys/class/powercap/intel-rapl:N/energy_uj``, each wrapping at its
    ``max_energy_range_uj``), summed as the energy; the DRAM zones, where there are any, read apart
    (:meth:`read_dram`: memory is not in the package's figure, and not added to it); no power reading."""

    def __init__(self, zones: Sequence[Path], dram: Sequence[Path] = ()) -> None:
        if not zones:
            raise EnergyError("no RAPL package zone")
        self._files = [z / "energy_uj" for z in zones]
        self.wrap_j = _wraps(zones)
        self._dram_files = [z / "energy_uj" for z in dram]
        self.dram_wrap_j = _wraps(dram)
        self.name = "rapl:" + "+".join(zone_name(z) for z in zones) + (" (dram apart)" if dram else "")
        self.read()
        self.read_dram()

    def read(self) -> tuple[float, ...]:
        return tuple(float(f.read_text()) / 1e6 for f in self._files)

    def read_dram(self) -> tuple[float, ...]:
        """Each DRAM zone's cumulative counter in joules (empty where the machine has none)."""
        return tuple(float(f.read_text()) / 1e6 for f in self._dram_files)

    def power_w(self) -> float | None:
        return None


def _wraps(zones: Sequence[Path]) -> tuple[float | None, ...]:
    return tuple(float((z / "max_energy_range_uj").read_text()) / 1e6 for z in zones)


def zone_name(zone: Path) -> str:
    """A powercap zone's ``name`` (``package-0``, ``dram``, ``psys``, ``core``), else its folder's name."""
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return zone.name


def _zones(root: Path | None) -> list[Path]:
    """Every RAPL zone and sub-zone with a counter under ``root`` (default :data:`RAPL_ROOT`): ``intel-rapl:N`` and
    ``intel-rapl:N:M``, in order."""
    root = RAPL_ROOT if root is None else root
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("intel-rapl:*") if (p / "energy_uj").exists())


def rapl_zones(root: Path | None = None) -> list[Path]:
    """The RAPL zones whose sum is the CPUs' energy: the top-level ``package-N`` zones. Not ``psys`` (a client
    part's platform zone, which already holds the packages: adding it would count them twice), not the
    ``intel-rapl:N:M`` sub-zones (``core``, ``uncore``: inside their package), and not ``dram``
    (:func:`rapl_dram_zones`, read apart). ``root`` defaults to :data:`RAPL_ROOT`."""
    return [z for z in _zones(root) if z.name.count(":") == 1 and zone_name(z).startswith("package-")]


def rapl_dram_zones(root: Path | None = None) -> list[Path]:
    """The RAPL zones named ``dram`` (a package's sub-zone, or a top-level zone on some servers): the memory's
    energy, reported apart from the packages' (``energy_dram_j``), never added to it."""
    return [z for z in _zones(root) if zone_name(z) == "dram"]


class FakeMeter:
    """A counter for tests: a device drawing ``power`` watts (a number, or a function of the seconds since the
    meter was made), read in steps of ``step_j`` joules, wrapping at ``wrap_j``; ``reported_power`` is what
    ``power_w`` says (default: the true power; None: no power reading)."""

    def __init__(self, power: float | Callable[[float], float] = 100.0, step_j: float = 1.0,
                 wrap_j: float | None = None, offset_j: float = 0.0,
                 reported_power: float | Callable[[float], float | None] | None | str = "true",
                 clock: Callable[[], float] = time.perf_counter, dt_s: float = 1e-3) -> None:
        self.name = "fake"
        self.wrap_j = (wrap_j,)
        self._power = power if callable(power) else (lambda t, p=float(power): p)
        self._reported = reported_power
        self._step, self._offset, self._clock, self._dt = step_j, offset_j, clock, dt_s
        self._t0 = clock()
        self._lock = threading.Lock()
        self._energy, self._t_last = 0.0, 0.0     # true energy integrated up to _t_last (seconds since _t0)

    def _advance(self) -> float:
        with self._lock:
            t = self._clock() - self._t0
            while self._t_last < t:               # integrate the (possibly varying) power in dt steps
                dt = min(self._dt, t - self._t_last)
                self._energy += self._power(self._t_last + dt / 2) * dt
                self._t_last += dt
            return self._energy

    def true_energy_j(self) -> float:
        """The energy drawn since the meter was made (what the stepped counter approximates)."""
        return self._advance()

    def read(self) -> tuple[float, ...]:
        e = self._offset + math.floor(self._advance() / self._step) * self._step
        wrap = self.wrap_j[0]
        return (e % wrap if wrap is not None else e,)

    def power_w(self) -> float | None:
        t = self._clock() - self._t0
        if self._reported == "true":
            return self._power(t)
        if self._reported is None:
            return None
        return self._reported(t) if callable(self._reported) else float(self._reported)


def find_meter(device: str) -> EnergyMeter | Absent:
    """The meter of ``device`` ("cuda", "cuda:N", "cpu"), or :class:`Absent` with the reason.

    CUDA: NVML for that GPU (matched by UUID when torch gives one, so ``CUDA_VISIBLE_DEVICES`` is honoured);
    CPU: the RAPL package counters. ``BENCH_FAKE_ENERGY=WATTS`` gives every device a :class:`FakeMeter` of that
    power (tests of the CLI and the runner only: its figures are not measurements)."""
    fake = os.environ.get("BENCH_FAKE_ENERGY")
    if fake:
        return FakeMeter(power=float(fake), step_j=0.01)
    kind, _, idx = device.partition(":")
    if kind == "cuda":
        try:
            import pynvml  # noqa: F401 — only to tell a missing package from a missing counter
        except ImportError:
            return Absent(f"{NO_COUNTER} (NVML needs nvidia-ml-py: pip install -c constraints.txt -e '.[energy]')")
        try:
            return NvmlMeter(int(idx or 0), _cuda_uuid(int(idx or 0)))
        except Exception as exc:  # noqa: BLE001 — any NVML failure means: no readable counter, and why
            return Absent(f"{NO_COUNTER} (NVML: {type(exc).__name__}: {exc})")
    if kind == "cpu":
        zones = rapl_zones()
        if not zones:
            return Absent(f"{NO_COUNTER} (no RAPL package counter under {RAPL_ROOT})")
        try:
            return RaplMeter(zones, rapl_dram_zones())
        except (OSError, ValueError, EnergyError) as exc:
            return Absent(f"{NO_COUNTER} (RAPL unreadable: {exc})")
    return Absent(f"{NO_COUNTER} (no energy meter for device {device!r})")


def _cuda_uuid(index: int) -> str | None:
    """NVML's UUID string of torch's CUDA device ``index`` (None where torch does not say)."""
    try:
        import torch
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
