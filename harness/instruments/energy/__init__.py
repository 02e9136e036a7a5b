"""Energy instrument: cumulative energy counters (:mod:`~harness.instruments.energy.meters`: NVML, RAPL, a fake for
tests) and the energy pass that reads them over a window of repeated calls
(:mod:`~harness.instruments.energy.window`). Never a 0 for a counter that is not there: an :class:`Absent` with the
reason.
"""
from __future__ import annotations

from harness.instruments.energy.meters import (
    NO_COUNTER,
    RAPL_ROOT,
    Absent,
    EnergyError,
    EnergyMeter,
    FakeMeter,
    NvmlMeter,
    RaplMeter,
    energy_delta,
    find_meter,
    rapl_dram_zones,
    rapl_zones,
    zone_name,
)
from harness.instruments.energy.window import EnergyConfig, EnergyResult, counter_step, measure_energy, power_integral

__all__ = ["NO_COUNTER", "RAPL_ROOT", "Absent", "EnergyConfig", "EnergyError", "EnergyMeter", "EnergyResult",
           "FakeMeter", "NvmlMeter", "RaplMeter", "counter_step", "energy_delta", "find_meter", "measure_energy",
           "power_integral", "rapl_dram_zones", "rapl_zones", "zone_name"]
