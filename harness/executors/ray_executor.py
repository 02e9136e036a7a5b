"""Cases as Ray tasks (``bench run SUITE --executor ray [--address ADDR]``); Ray is an optional extra.

**Design.** Each unit of work — one case, or with ``--interleave`` one group of
:func:`~harness.executors.base.interleave_groups` (timed side by side in one process, so interleaving survives)
— is one Ray task with the resources it needs: ``num_gpus=1`` (and one CPU) for a CUDA case; for a CPU case
``num_cpus`` = its workload's threads, ``threads = 0`` (every core, as locally) asking for the largest node's
CPUs so the case has a node to itself; ``memory=`` the fake pass's estimated peak (``est_peak_bytes``, counted
here on the driver on fake tensors; the group's largest), capped at the largest node's memory, where the case's
own budget guard then skips it as locally.

The task does not measure in the Ray worker: it hands its cases to a
:class:`~harness.executors.process.ProcessExecutor` that the Ray worker keeps (one per worker, for the GPU Ray
gave it), i.e. the same spawned, reused measuring process as ``--executor process``. So a case's timeout counts
from its own start (not from when Ray queued the task), a measuring process that dies is recorded ``oom``
(SIGKILL) or ``error`` (its exit code or signal) exactly as locally, and a poisoning CUDA error replaces it. The
Ray worker itself never touches CUDA; CPU tasks reuse Ray workers (and their measuring process: start-up —
torch, the registry — is paid once per worker, not per case), while CUDA tasks run with ``max_calls=1`` (Ray's
own default for GPU tasks) and close their measuring process at the end, so leaked GPU memory or a poisoned
context never reaches the next task. Tasks never retry (``max_retries=0``): a crash is the case's result.

A task whose Ray worker dies (``WorkerCrashedError``: killed from outside, e.g. ``ray stop``), is killed by Ray's
memory monitor (``OutOfMemoryError`` → ``oom``) or raises (``RayTaskError``, e.g. a measuring process that cannot
start) becomes a record per case; a group that fails so is run again case by case (as ``process`` does), so the
case at fault is found. A CUDA case when the cluster has no GPU is ``skipped`` with the local reason, never
queued (it would wait forever). Records come back in completion order; the driver stores them (a case is
stored once: its key is unique in the run). Without ``--address`` a local cluster is started (the machine's
cores, a small object store) and shut down in :meth:`RayExecutor.close`; with it, ``ray.init(address=...)``
connects and close disconnects. On a remote cluster every node needs this package (and any ``--plugin`` file
at the same path) installed.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.contract import registry
from harness.engine.env import usable_cores
from harness.contract.errors import BenchInputError
from harness.executors.base import interleave_groups
from harness.executors.devices import device_type, pin, unpin
from harness.executors.process import ProcessExecutor
from harness.contract.records import CaseRecord
from harness.engine.runner import RunOptions, fake_pass
from harness.contract.spec import Case

log = logging.getLogger("bench")

RAY_MISSING = "ray is not installed: pip install -c constraints.txt -e '.[ray]'"
NO_CUDA = "CUDA is not available on this machine"     # the reason harness.engine.runner.prepare gives locally
OBJECT_STORE_BYTES = 128 * 1024 * 1024                  # records are small: a local cluster's object store


def ray_available() -> bool:
    """Whether ``import ray`` would work (without importing it)."""
    return importlib.util.find_spec("ray") is not None


@dataclass(frozen=True)
class Cluster:
    """What the cluster can give one task: the largest node's CPUs and memory, and the GPUs in all."""

    max_cpus: float
    max_memory: float
    gpus: float

    @classmethod
    def of(cls, nodes: Sequence[dict[str, Any]], total: dict[str, float]) -> "Cluster":
        """From ``ray.nodes()`` and ``ray.cluster_resources()``."""
        alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
        return cls(max((r.get("CPU", 0.0) for r in alive), default=0.0),
                   max((r.get("memory", 0.0) for r in alive), default=0.0), float(total.get("GPU", 0.0)))


@dataclass(frozen=True)
class TaskResources:
    """A task's resource request (``.options(**r.options())``)."""

    num_cpus: float
    num_gpus: float = 0.0
    memory: int | None = None

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory:
            out["memory"] = self.memory
        return out


def estimated_peak_bytes(case: Case) -> int | None:
    """The case's estimated peak bytes from a fake pass (no memory, no arithmetic), or None if it cannot be had
    here (e.g. a plug-in architecture the driver has not imported): the task then asks for no memory."""
    try:
        spec = registry.resolve(case.arch, **dict(case.overrides))
        return int(fake_pass(spec, case.workload, torch.device("cpu"), want_flops=False)["est_peak_bytes"])
    except Exception as exc:  # noqa: BLE001 — an estimate is optional; the task records the case's own failure
        log.debug("no memory estimate for %s (%s): %s", case.key, case.arch, exc)
        return None


def plan(unit: Sequence[Case], cluster: Cluster) -> TaskResources | str:
    """The resources of the task that measures ``unit`` (one device), or why it cannot run (a skip reason)."""
    if device_type(unit[0].workload.device) == "cuda":
        return NO_CUDA if cluster.gpus < 1 else TaskResources(num_cpus=1, num_gpus=1)
    wanted = max(c.workload.threads or cluster.max_cpus for c in unit)
    cpus = min(wanted, cluster.max_cpus) or 1
    if cpus < wanted:
        log.warning("%s asks for %g threads; the largest Ray node has %g CPUs", unit[0].line, wanted, cpus)
    peaks = [p for p in (estimated_peak_bytes(c) for c in unit) if p]
    memory = int(min(max(peaks), cluster.max_memory)) if peaks and cluster.max_memory else None
    return TaskResources(num_cpus=cpus, memory=memory)


def crash_record(case: Case, exc: BaseException) -> CaseRecord:
    """The record of a case whose Ray task failed (its worker died, was killed for memory, or raised)."""
    from ray import exceptions as rex
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, rex.OutOfMemoryError):
        return case.record("oom", f"Ray's memory monitor killed the worker (out of memory): {first}")
    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None) or exc
        text = (str(cause).strip().splitlines() or [""])[0]
        return case.record("error", f"{type(cause).__name__}: {text}")
    if isinstance(exc, rex.WorkerCrashedError):
        return case.record("error", f"Ray worker died (killed from outside, e.g. the kernel's OOM killer or "
                                    f"`ray stop`, or crashed): {first}")
    return case.record("error", f"Ray task failed ({type(exc).__name__}: {first})")


# -- in the Ray worker ------------------------------------------------------------------------------------------

_MEASURING: dict[str, ProcessExecutor] = {}
"""In a Ray worker: its measuring process, by the GPUs Ray made visible to it (a new set → a new process)."""


def measure_in_worker(cases: list[Case], opts: RunOptions, last: bool) -> tuple[list[CaseRecord], float, int]:
    """The Ray task: ``cases`` through this Ray worker's ProcessExecutor (closed after the task when ``last``).
    A CUDA case runs on ``cuda`` (its assigned GPU is the only one visible) and keeps its key; where this worker
    has no CUDA (a declared GPU resource on a machine without one) it is skipped as locally. Returns the
    records, and the seconds and starts of measuring processes spent here (harness.engine.overhead)."""
    if device_type(cases[0].workload.device) == "cuda" and not torch.cuda.is_available():
        return [c.record("skipped", NO_CUDA) for c in cases], 0.0, 0   # a GPU resource without CUDA: as locally
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ex = _MEASURING.get(visible)
    if ex is None:
        for old in _MEASURING.values():
            old.close()
        _MEASURING.clear()
        ex = _MEASURING[visible] = ProcessExecutor()
    s0, n0 = ex.startup_s, ex.starts
    pinned = [pin(c, "cuda") if device_type(c.workload.device) == "cuda" else c for c in cases]
    by_key = {p.key: c for p, c in zip(pinned, cases)}
    try:
        records = [unpin(r, by_key[r.case_key], r.case_key) for r in ex.run(pinned, opts)]
    finally:
        if last:
            ex.close()
            _MEASURING.pop(visible, None)
    if visible.isdigit():
        records = [_with_index(r, int(visible)) if device_type(r.workload.get("device", "")) == "cuda" else r
                   for r in records]
    return records, ex.startup_s - s0, ex.starts - n0


def _with_index(rec: CaseRecord, index: int) -> CaseRecord:
    return dataclasses.replace(rec, metrics={**rec.metrics, "device_index": float(index)})


# -- on the driver ----------------------------------------------------------------------------------------------

class RayExecutor:
    """Cases as Ray tasks on a local cluster (started here) or the one at ``address``."""

    def __init__(self, address: str | None = None, **init_kwargs: Any) -> None:
        try:
            import ray
        except ImportError:
            raise BenchInputError(RAY_MISSING) from None
        self._ray = ray
        self.startup_s = 0.0
        self.starts = 0
        self._owns = not ray.is_initialized()     # a cluster this process joined already is left as it was
        if self._owns:
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
            if address is None:
                kwargs.update(num_cpus=usable_cores(), object_store_memory=OBJECT_STORE_BYTES)
            ray.init(address=address, **{**kwargs, **init_kwargs})
            self.startup_s = time.perf_counter() - t0
            self.starts = 1
            log.info("ray: %s in %.1f s (%s)", "connected to " + address if address else "local cluster started",
                     self.startup_s, ", ".join(f"{k} {v:g}" for k, v in sorted(ray.cluster_resources().items())
                                              if k in ("CPU", "GPU")))
        # max_calls is fixed per remote function: CPU tasks reuse Ray workers, a GPU task's worker ends with it
        self._tasks = {gpu: ray.remote(max_retries=0, retry_exceptions=False, max_calls=int(gpu))(measure_in_worker)
                       for gpu in (False, True)}
        self._pending: dict[Any, list[Case]] = {}
        self.concurrency = int(ray.cluster_resources().get("CPU", 1))

    def cluster(self) -> Cluster:
        return Cluster.of(self._ray.nodes(), self._ray.cluster_resources())

    def _submit(self, unit: list[Case], resources: TaskResources, opts: RunOptions) -> None:
        ref = self._tasks[bool(resources.num_gpus)].options(name=f"bench {unit[0].line}", **resources.options()).remote(
            unit, opts, bool(resources.num_gpus))
        self._pending[ref] = unit

    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        ray = self._ray
        cluster = self.cluster()
        units = interleave_groups(cases) if opts.interleave else [[c] for c in cases]
        planned: dict[str, TaskResources] = {}
        for unit in units:
            resources = plan(unit, cluster)
            if isinstance(resources, str):
                log.warning("%d CUDA case(s) skipped: the Ray cluster has no GPU", len(unit))
                yield from (c.record("skipped", resources) for c in unit)
                continue
            planned.update((c.key, resources) for c in unit)
            self._submit(unit, resources, opts)
        while self._pending:
            ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=0.5)   # a timeout keeps Ctrl-C live
            for ref in ready:
                unit = self._pending.pop(ref)
                try:
                    records, startup_s, starts = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    if len(unit) > 1:      # a lost group: each case alone, so the one at fault is found
                        log.warning("a Ray task of %d cases failed (%s); running them one by one", len(unit),
                                    type(exc).__name__)
                        for c in unit:
                            self._submit([c], planned[c.key], opts)
                        continue
                    yield crash_record(unit[0], exc)
                    continue
                self.startup_s += startup_s
                self.starts += starts
                yield from records

    def close(self) -> None:
        for ref in list(self._pending):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 — finished or already gone
                pass
        self._pending.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

