"""How the cases of a run are measured (:class:`RunOptions`): the same for every case of the run."""
from __future__ import annotations

from dataclasses import dataclass

from harness.contract.replication import PRECISION
from harness.instruments.energy import EnergyConfig
from harness.instruments.timing import TimingConfig


@dataclass(frozen=True)
class RunOptions:
    """How cases are measured; the same for every case of a run."""

    timing: TimingConfig = TimingConfig()
    timeout_s: float = 300.0
    memory_budget_bytes: int | None = None   # None: harness.instruments.memory.memory_budget(device)
    debug: bool = False
    plugins: tuple[str, ...] = ()   # plug-in files (``--plugin``), imported once per process before a case
    interleave: bool = False        # time the cases of a sweep point side by side (harness.engine.runner.run_group)
    energy: bool = False            # the energy pass (harness.instruments.energy) after timing, where a counter is readable
    energy_config: EnergyConfig = EnergyConfig()
    processes: int = 1              # fresh worker processes per case, records merged (harness.engine.replicate)
    max_processes: int = 0          # > processes: more for a group whose interval is wider than ×/÷ precision
    precision: float = PRECISION    # harness.engine.replicate.imprecise
    replica: bool = False           # a replica process: its record lends only its samples to the first process's
                                    # (no counting, memory or energy pass: harness.engine.replicate.merge_processes)
