"""Energy instrument: cumulative energy counters (NVML, RAPL, a fake for tests) and the energy pass.

A meter reads one or more **cumulative counters in joules** (``read()``: one value per domain), each of which
may wrap around at ``wrap_j`` (RAPL's ``max_energy_range_uj``; NVML's 64-bit millijoule counter does not wrap
in practice: ``None``), and, where the device reports one, an instantaneous **power** in watts (``power_w()``;
NVML ``nvmlDeviceGetPowerUsage``; RAPL has none). :func:`find_meter` gives the meter of a device, or an
:class:`Absent` with the reason ("no energy counter on this machine") — never a meter that reads 0.

Counters move in coarse steps: on an H100, NVML's counter was seen to report 964 W over a third of a second on a
700 W card. :func:`measure_energy` therefore

1. polls the counter (a sampling thread, every ``poll_s``) while the case's call repeats, and takes the
   counter's **step** as the smallest nonzero increment seen between two polls;
2. lengthens the window (more calls) until that step is at most ``step_share`` (2 %) of the energy read over
   the window, up to ``max_window_s`` (then the result says the step bound was not met);
3. integrates the power samples of the same thread over the same window (trapezoids, with a reading at each
   end) as an independent cross-check: ``power_integral_j`` is stored beside the counter's figure, never in
   its place (RAPL has no power reading: the cross-check is absent there, not computed from the counter).

The pass is separate from the timed samples (like the memory pass); the runner counts its seconds as the
``energy`` part of harness.engine.overhead.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

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


# --- the energy pass -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnergyConfig:
    """How long an energy window is: at least ``min_window_s``, lengthened until the counter's step is at most
    ``step_share`` of the energy read, at most ``max_window_s``; counter and power polled every ``poll_s``."""

    min_window_s: float = 1.0
    max_window_s: float = 30.0
    step_share: float = 0.02
    poll_s: float = 0.005
    min_calls: int = 3           # a window never rests on one call (a single slow call would set the figure)

    @classmethod
    def quick(cls) -> EnergyConfig:
        return cls(min_window_s=0.5, max_window_s=10.0)


@dataclass(frozen=True)
class EnergyResult:
    """One energy window: ``calls`` calls of the step in ``window_s`` seconds drew ``energy_j`` joules by the
    counter (``step_j``: its smallest increment seen), and ``power_integral_j`` by the power samples (None where
    the meter reads no power)."""

    meter: str
    calls: int
    window_s: float
    energy_j: float
    step_j: float
    power_integral_j: float | None
    power_samples: int
    windows: int                         # windows tried (the last is this one)
    step_ok: bool                        # step_j ≤ step_share × energy_j
    dram_j: float | None = None          # the DRAM zones over the same window (RAPL with dram zones; else None)

    @property
    def energy_per_call_j(self) -> float:
        return self.energy_j / self.calls

    @property
    def avg_power_w(self) -> float:
        return self.energy_j / self.window_s

    def metrics(self, batch_size: int, tokens_per_sample: int | None = None) -> dict[str, float]:
        """The case metrics (units in the names): per call, per sample (image), per token where the workload
        has a sequence, average power, the window, the counter's step and the power-integral figure."""
        out = {"energy_j": self.energy_per_call_j, "energy_per_sample_j": self.energy_per_call_j / batch_size,
               "avg_power_w": self.avg_power_w, "energy_window_s": self.window_s,
               "energy_calls": float(self.calls), "energy_step_j": self.step_j,
               "energy_step_share": self.step_j / self.energy_j if self.energy_j > 0 else math.inf}
        if tokens_per_sample:
            out["energy_per_token_j"] = self.energy_per_call_j / (batch_size * tokens_per_sample)
        if self.power_integral_j is not None:
            out["energy_power_integral_j"] = self.power_integral_j / self.calls
        if self.dram_j is not None:
            out["energy_dram_j"] = self.dram_j / self.calls        # memory: apart from energy_j, never in it
            out["energy_power_samples"] = float(self.power_samples)
        return out


@dataclass
class _Sampler:
    """Polls a meter in a thread: (time, counter reading, power) triples."""

    meter: EnergyMeter
    poll_s: float
    clock: Callable[[], float]
    samples: list[tuple[float, tuple[float, ...], float | None]] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="energy-sampler", daemon=True)

    def sample(self) -> None:
        self.samples.append((self.clock(), self.meter.read(), self.meter.power_w()))

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.poll_s)
        except BaseException as exc:  # noqa: BLE001 — handed to the caller by stop()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise EnergyError(f"reading the energy meter failed: {self.error}") from self.error


def counter_step(readings: Sequence[tuple[float, ...]], wrap_j: Sequence[float | None]) -> float | None:
    """The smallest nonzero increment between consecutive readings (None if the counter never moved)."""
    steps = [d for a, b in zip(readings, readings[1:]) if (d := energy_delta(a, b, wrap_j)) > 0]
    return min(steps) if steps else None


def power_integral(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """∫ power dt over [t0, t1] by trapezoids over (time, watts) samples sorted by time, the first and last
    sample held flat to the window's ends."""
    pts = sorted((t, p) for t, p in samples if t0 <= t <= t1)
    if not pts:
        raise EnergyError("no power sample inside the energy window")
    if pts[0][0] > t0:
        pts.insert(0, (t0, pts[0][1]))
    if pts[-1][0] < t1:
        pts.append((t1, pts[-1][1]))
    return sum((tb - ta) * (pa + pb) / 2 for (ta, pa), (tb, pb) in zip(pts, pts[1:]))


def measure_energy(step: Callable[[], object], meter: EnergyMeter, cfg: EnergyConfig = EnergyConfig(),
                   sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter,
                   call_s: float | None = None) -> EnergyResult:
    """Repeat ``step`` over windows of growing length until the window is at least ``cfg.min_window_s`` and
    ``cfg.min_calls`` calls, and the counter's step is ≤ ``cfg.step_share`` of the energy read (or the window
    reaches ``cfg.max_window_s``). ``sync`` waits for the device (CUDA); ``call_s`` (e.g. the timed median) sizes
    the first window, else one call is timed for it."""
    if call_s is None:
        t = clock()
        step()
        sync()
        call_s = clock() - t
    calls = max(cfg.min_calls, math.ceil(cfg.min_window_s / max(call_s, 1e-6)))
    seen: list[float] = []               # counter steps seen in every window so far
    last = False                         # this window was cut to max_window_s: it ends the loop
    read_dram = getattr(meter, "read_dram", None)          # RAPL: the DRAM zones, read at the window's ends
    for window in range(1, 1000):
        sampler = _Sampler(meter, cfg.poll_s, clock)
        dram0 = read_dram() if read_dram is not None else ()
        sampler.sample()
        t0 = sampler.samples[0][0]
        sampler.start()
        try:
            for _ in range(calls):
                step()
            sync()
        finally:
            t1, e1, p1 = clock(), meter.read(), meter.power_w()
            dram1 = read_dram() if read_dram is not None else ()
            sampler.stop()
        window_s = t1 - t0
        readings = [s[1] for s in sampler.samples] + [e1]
        # summed poll by poll, so a counter that wraps more than once in a long window is still counted
        energy = sum(energy_delta(a, b, meter.wrap_j) for a, b in zip(readings, readings[1:]))
        if (s := counter_step(readings, meter.wrap_j)) is not None:
            seen.append(s)
        step_j = min(seen) if seen else math.inf
        ok = energy > 0 and step_j <= cfg.step_share * energy
        if (ok and window_s >= cfg.min_window_s) or last or window_s >= cfg.max_window_s:
            if energy <= 0:
                raise EnergyError(f"the energy counter did not move in a {window_s:.2f} s window")
            powers = [(ts, p) for ts, _, p in sampler.samples if p is not None]
            integral = (power_integral(powers + [(t1, p1)], t0, t1)
                        if powers and p1 is not None else None)
            dram = energy_delta(dram0, dram1, meter.dram_wrap_j) if dram0 else None   # type: ignore[attr-defined]
            return EnergyResult(meter.name, calls, window_s, energy, step_j, integral, len(powers) + 1,
                                window, ok, dram)
        # enough calls for the step to be step_share of the energy (×1.25 margin), at least twice as many,
        # but a window no longer than max_window_s (the next window then ends the loop, bound met or not)
        need = 4.0 if energy <= 0 or not math.isfinite(step_j) else step_j / (cfg.step_share * energy) * 1.25
        need = max(need, cfg.min_window_s / max(window_s, 1e-9) * 1.1)      # the first call may have been slow
        grown = max(calls + 1, math.ceil(calls * need)) if ok else max(calls * 2, math.ceil(calls * need))
        cap = max(calls + 1, math.floor(calls * cfg.max_window_s / max(window_s, 1e-9)))
        last = cap <= grown
        calls = min(grown, cap)
    raise EnergyError("energy window did not converge")   # pragma: no cover — the window cap ends the loop
