"""Cases spread over several devices of this machine (``bench run --devices cuda:0,cuda:1``, or ``cpu,cpu``):
one measuring process per device, each a :class:`~harness.executors.process.ProcessExecutor` (the same spawned,
reused worker with its timeouts, crash recording and replacement), fed from one queue per device type.

A case is *pinned* to its worker's device for the run (``cuda`` → ``cuda:1``) but keeps its key and its stored
workload (``device = "cuda"``): where it ran does not change what it is, so ``--resume`` finds it whichever
worker measured it. A pinned CUDA case records the index it ran on as the metric ``device_index``. CPU workers
split this process's cores between them (each spawned worker inherits its share as its CPU affinity, so a case
with ``threads = 0`` uses the worker's cores, not the whole machine's). Cases run concurrently: a timing is
taken beside the other workers' cases.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from harness.contract.errors import BenchInputError
from harness.executors.base import interleave_groups
from harness.executors.process import ProcessExecutor
from harness.contract.records import CaseRecord
from harness.engine.runner import RunOptions
from harness.contract.spec import Case, workload_dict

log = logging.getLogger("bench")

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")


def parse_devices(text: str) -> tuple[str, ...]:
    """``"cuda:0,cuda:1"`` → ``("cuda:0", "cuda:1")``; each is ``cpu``, ``cuda`` or ``cuda:N``, and a CUDA device
    appears once (a CPU may repeat: ``cpu,cpu`` is two workers sharing the cores). Raises BenchInputError."""
    devices = tuple(d.strip() for d in text.split(","))
    if not text.strip() or any(not d for d in devices):
        raise BenchInputError(f"expected a comma-separated list such as cuda:0,cuda:1 or cpu,cpu, got {text!r}",
                              where="--devices")
    for d in devices:
        kind, _, index = d.partition(":")
        if kind not in DEVICE_TYPES or (kind == "cpu" and index) or (index and not index.isdigit()):
            raise BenchInputError(f"unknown device {d!r}; expected cpu, cuda or cuda:N", where="--devices")
    cuda = [d if ":" in d else "cuda:0" for d in devices if d.startswith("cuda")]
    if len(set(cuda)) < len(cuda):
        raise BenchInputError(f"a CUDA device is listed twice in {text!r}", where="--devices")
    return devices


def device_type(device: str) -> str:
    return device.split(":")[0]


def check_devices(cases: Sequence[Case], devices: Sequence[str]) -> None:
    """Every case's device type must have a worker in ``devices`` (raises BenchInputError before anything runs)."""
    have = {device_type(d) for d in devices}
    missing = sorted({c.workload.device for c in cases if device_type(c.workload.device) not in have})
    if missing:
        raise BenchInputError(f"no device in {','.join(devices)} for the cases on {', '.join(missing)} "
                              "(add one, or --device to move the cases)", where="--devices")


def pin(case: Case, device: str) -> Case:
    """``case`` on ``device`` (its key changes; :func:`unpin` gives its record the original back)."""
    if case.workload.device == device:
        return case
    return dataclasses.replace(case, workload=dataclasses.replace(case.workload, device=device))


def unpin(rec: CaseRecord, case: Case, pinned_key: str) -> CaseRecord:
    """The record of ``case`` measured pinned (key ``pinned_key``): the case's own key and workload again, the
    group label remapped, and, on CUDA, the index it ran on (``device_index``)."""
    if rec.case_key == case.key:
        return rec
    group = rec.group
    if group.startswith(pinned_key):           # "KEY+N": the group is named after its first case
        group = case.key + group[len(pinned_key):]
    ran_on = rec.workload.get("device", "")
    metrics = dict(rec.metrics)
    if ran_on.startswith("cuda:"):
        metrics["device_index"] = float(ran_on.partition(":")[2])
    return dataclasses.replace(rec, case_key=case.key, workload=workload_dict(case.workload), metrics=metrics,
                               group=group)


def split_cores(cores: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``cores`` dealt to ``n`` workers round-robin; with fewer cores than workers, workers share one each."""
    cores = sorted(cores)
    if n <= len(cores):
        return [tuple(cores[i::n]) for i in range(n)]
    return [(cores[i % len(cores)],) for i in range(n)]


@dataclass
class _Slot:
    """One device's worker: its ProcessExecutor, driven by one thread."""

    device: str
    cores: tuple[int, ...] = ()           # CPU workers: the cores its spawned processes may use
    executor: ProcessExecutor = field(default_factory=ProcessExecutor)


class DevicesExecutor:
    """One :class:`ProcessExecutor` per device, run side by side; records come back in completion order."""

    def __init__(self, devices: Sequence[str]) -> None:
        if not devices:
            raise BenchInputError("no device given", where="--devices")
        self.devices = tuple(devices)
        n_cpu = sum(device_type(d) == "cpu" for d in devices)
        shares = iter(split_cores(sorted(os.sched_getaffinity(0)), n_cpu) if n_cpu else ())
        self.slots = [_Slot(d, next(shares) if device_type(d) == "cpu" else ()) for d in devices]
        self.placed: dict[str, tuple[str, int | None]] = {}   # case key → (device, worker pid) it ran on
        self.concurrency = len(self.slots)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def startup_s(self) -> float:         # summed over workers (they start side by side: harness.engine.overhead)
        return sum(s.executor.startup_s for s in self.slots)

    @property
    def starts(self) -> int:
        return sum(s.executor.starts for s in self.slots)

    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        units = interleave_groups(cases) if opts.interleave else [[c] for c in cases]
        queues: dict[str, queue.Queue[list[Case]]] = {}
        for unit in units:
            kind = device_type(unit[0].workload.device)
            if not any(device_type(s.device) == kind for s in self.slots):
                for c in unit:                # the CLI refuses this before the run (check_devices)
                    yield c.record("error", f"no worker for device {c.workload.device} in --devices "
                                            f"{','.join(self.devices)}")
                continue
            queues.setdefault(kind, queue.Queue()).put(unit)
        out: queue.Queue[tuple[str, object]] = queue.Queue()
        slots: list[_Slot] = []                  # no more workers of a type than it has units to run
        for slot in self.slots:
            kind = device_type(slot.device)
            if kind in queues and sum(device_type(s.device) == kind for s in slots) < queues[kind].qsize():
                slots.append(slot)
        ready = threading.Barrier(len(slots)) if slots else None
        self._threads = [threading.Thread(target=self._drive, args=(slot, queues[device_type(slot.device)], opts, out,
                                                                    ready),
                                          name=f"bench-{slot.device}", daemon=True) for slot in slots]
        for t in self._threads:
            t.start()
        running = len(self._threads)
        while running:
            try:
                kind, item = out.get(timeout=0.5)     # a timeout keeps Ctrl-C deliverable
            except queue.Empty:
                continue
            if kind == "done":
                running -= 1
            elif kind == "failed":
                raise item                             # type: ignore[misc] — a worker that cannot start
            else:
                yield item                             # type: ignore[misc]

    def _drive(self, slot: _Slot, units: queue.Queue[list[Case]], opts: RunOptions,
               out: queue.Queue[tuple[str, object]], ready: threading.Barrier) -> None:
        """A worker thread: start its worker, wait for the others' (so the first cases are not all dealt to the
        fastest to start), then take units of its device type until none is left, each pinned to its device."""
        try:
            if slot.cores:   # this thread's affinity: the processes it spawns inherit it (Linux: per thread)
                os.sched_setaffinity(0, slot.cores)
            try:
                slot.executor._ensure()          # noqa: SLF001 — start it now, side by side with the others
            except BaseException:
                ready.abort()
                raise
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                pass                             # another worker failed to start: the run stops on its error
            while not self._stop.is_set():
                try:
                    unit = units.get_nowait()
                except queue.Empty:
                    break
                pinned = {pin(c, slot.device).key: c for c in unit}
                for rec in slot.executor.run([pin(c, slot.device) for c in unit], opts):
                    case = pinned[rec.case_key]
                    proc = slot.executor.proc
                    self.placed[case.key] = (slot.device, proc.pid if proc is not None else None)
                    log.debug("case %s ran on %s (worker pid %s)", case.key, slot.device, self.placed[case.key][1])
                    out.put(("record", unpin(rec, case, rec.case_key)))
                    if self._stop.is_set():
                        break
            slot.executor.close()
        except BaseException as exc:  # noqa: BLE001 — handed to the driving thread, which raises it
            out.put(("failed", exc))
        finally:
            out.put(("done", None))

    def close(self) -> None:
        self._stop.set()
        for slot in self.slots:
            slot.executor.close()
        for t in self._threads:
            t.join(10)

