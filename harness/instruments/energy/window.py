"""The energy pass: a case's step repeated over a window long enough for the device's energy counter.

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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.instruments.energy.meters import EnergyError, EnergyMeter, energy_delta

__all__ = ["EnergyConfig", "EnergyResult", "counter_step", "measure_energy", "power_integral"]


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
