"""Where the claims' evidence comes from: suite runs and training experiments, reused from the store when
one was measured at the same size on the same hard environment (``--fresh`` measures again).

Nothing here prints: what is measured or reused is logged on the ``bench`` logger, and each finished
case goes to the context's ``on_record`` callback (the CLI draws its progress from both).
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from claims.experiment_store import ExperimentStore
from claims.experiments.runner import Training
from harness.engine.env import fingerprint
from harness.contract.records import CaseRecord, RunRecord
from harness.executors import make_executor
from harness.executors.base import Executor
from harness.session import Run, run_options
from harness.store.db import Store
from harness.engine.checks import WORKLOAD_CHECKS
from harness.contract.suite import load_suite
from claims.reads import reads_of

log = logging.getLogger("bench")
EXPERIMENTS = Path(__file__).with_name("experiments")


def experiments_code_hash() -> str:
    """A digest of the experiments' code (claims/experiments/*.py): a stored result is reused only when the
    code that trained it is the code of this checkout."""
    h = hashlib.sha256()
    for path in sorted(EXPERIMENTS.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


class UndeclaredRead(RuntimeError):
    """A probe read a suite or experiment its ``@probe(..., reads=...)`` does not declare."""


def read_name(read: str) -> str:
    """"suite heads (cuda)" -> "suite heads": the piece a declared read names, without its device mark."""
    kind, _, rest = read.strip().partition(" ")
    rest = rest.removesuffix("(cuda)").strip()
    return f"{kind} {rest}" if rest and " " not in rest else ""


@dataclass
class Context:
    """What a probe may ask for. Every suite/experiment is measured at most once per context."""

    store: Store
    quick: bool = True
    fresh: bool = False
    seeds: tuple[int, ...] = (0, 1, 2)
    threads: int = 2
    executor: str = "process"
    calibrate: bool = True
    on_record: Callable[[CaseRecord], None] | None = None
    device: str = "cpu"                    # where this context measures (rules for another device are unmeasured)
    force: bool = False                    # decide timing rules even when the machine was busy
    processes: int = 1                     # fresh worker processes per suite case (harness.engine.replicate)
    max_processes: int = 1                 # up to this many where a timed group's interval is still wide
    reading: tuple[str, tuple[str, ...]] | None = None   # (probe, the reads it declares) while a probe runs:
                                                          # a read it does not declare is an UndeclaredRead
    _suites: dict[tuple, tuple[RunRecord, list[CaseRecord]]] = field(default_factory=dict)
    _experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    _experiment_provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    provenance: list[dict[str, Any]] = field(default_factory=list)   # one entry per suite/experiment use
    pieces: dict[str, dict[str, Any]] = field(default_factory=dict)  # "suite X" / "experiment Y" -> seconds, reused
    _executor: Executor | None = None                                 # kept_executor()

    @property
    def used(self) -> list[str]:
        """Each suite run and experiment this context drew on, once, in order of first use."""
        return list(dict.fromkeys(p["source"] for p in self.provenance))

    def here(self) -> dict[str, Any]:
        """Provenance of what a probe computes in this process: this checkout's commit, torch, device."""
        soft = fingerprint(threads=self.threads)["soft"]
        return {"source": "computed by this run", "commit": soft.get("commit"), "dirty": soft.get("dirty"),
                "torch": torch.__version__, "device": self.device}

    def hard_env(self) -> dict[str, Any]:
        return fingerprint(threads=self.threads)["hard"]

    # -- suites ----------------------------------------------------------------------------
    def kept_executor(self) -> Executor:
        """The executor every suite of this context measures through, made once: its worker process stays between
        suites (a replicated suite starts fresh ones for its passes all the same). :meth:`close` ends it."""
        if self._executor is None:
            self._executor = make_executor(self.executor)
        return self._executor

    def close(self) -> None:
        """End the kept executor's workers (a context used again makes new ones)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def suite(self, name: str, sets: dict[str, Any] | None = None) -> tuple[RunRecord, list[CaseRecord]]:
        """The run of suite ``name`` (built-in, or a path) with ``sets`` pinned (as ``--set``) on this context's
        device (a CUDA device applies the suite's [cuda] table), and its records."""
        sets = dict(sets or {})
        sets.setdefault("threads", self.threads)
        if self.device != "cpu":
            sets.setdefault("device", self.device)
        key = (name, tuple(sorted(sets.items())))
        if key in self._suites:
            self.check_read(f"suite {self._suites[key][0].suite}")
            self.provenance.append(self._run_provenance(*self._suites[key]))
            return self._suites[key]
        t0 = time.perf_counter()
        suite, cases, reads = self.plan_suite(name, sets)
        self.check_read(f"suite {suite.name}")
        procs = max(self.processes, reads.processes)          # a deciding timing rule's cases: over processes
        most = max(self.max_processes, procs)
        run = None if self.fresh else self.stored_suite(suite.name, sets, {c.key for c in cases}, reads.peak,
                                                        procs, most)
        reused = run is not None
        if run is None:
            left = len(suite.cases) - len(cases)
            log.info("claims: measuring suite %s%s (%d cases%s)", name, f" with {sets}" if sets else "", len(cases),
                     f"; {left} that no rule reads left out: claims/reads.toml" if left else "")
            with Run.open_suite(self.store, suite, cases, quick=self.quick, calibrate=self.calibrate and reads.peak,
                                options={"sets": sets, "by": "bench claims", "interleave": True,
                                         **({"processes": procs} if procs > 1 else {}),
                                         **({"max_processes": most} if most > procs else {})}) as opened:
                many = [c for c in cases if procs == self.processes or reads.over_processes(c)]
                opened.execute(self.kept_executor(), run_options(self.quick, interleave=True, processes=procs,
                                                          max_processes=most), cases=many,
                               on_record=self.on_record)
                rest = [c for c in cases if c not in many]       # read by no deciding timing rule: as the run asks
                if rest:
                    opened.execute(self.kept_executor(), run_options(self.quick, interleave=True, processes=self.processes,
                                                              max_processes=self.max_processes), cases=rest,
                                   on_record=self.on_record)
            run = opened.record()
        else:
            log.info("claims: reusing run %s of %s", run.id, name)
        keys = {c.key for c in cases}
        result = (run, [r for r in self.store.records(run.id) if r.case_key in keys])
        self._suites[key] = result
        was = self.pieces.get(f"suite {suite.name}", {"seconds": 0.0, "reused": True, "cases": 0})
        self.pieces[f"suite {suite.name}"] = {       # a suite run at two --set (C23's compile modes): their sum
            "seconds": was["seconds"] + time.perf_counter() - t0, "reused": was["reused"] and reused,
            "cases": was["cases"] + len(cases), "run": run.id}
        self.provenance.append(self._run_provenance(*result))
        return result

    def check_read(self, piece: str) -> None:
        """Raise :class:`UndeclaredRead` when the running probe reads ``piece`` ("suite X", "experiment Y") without
        declaring it (``@probe(..., reads=...)``): the declaration is the one list of what a claim needs."""
        if self.reading is None:
            return
        name, declared = self.reading
        if piece not in {read_name(r) for r in declared}:
            raise UndeclaredRead(f"probe {name} read {piece}, which it does not declare "
                                 f"(reads = {', '.join(declared) or 'nothing'})")

    def plan_suite(self, name: str, sets: dict[str, Any]) -> tuple[Any, list[Any], Any]:
        """Suite ``name`` at this size with ``sets``, the cases some rule reads (claims/reads.toml) and those reads."""
        suite = load_suite(name, quick=self.quick, sets=dict(sets), checks=WORKLOAD_CHECKS)
        reads = reads_of(suite.name)
        return suite, [c for c in suite.cases if reads.keeps(c)], reads

    @staticmethod
    def _run_provenance(run: RunRecord, records: list[CaseRecord]) -> dict[str, Any]:
        """Where a suite run's figures came from: its commit, torch version and the devices of its cases."""
        devices = sorted({str(r.value("device")) for r in records if r.value("device") is not None})
        return {"source": f"run {run.id} ({run.suite})", "commit": run.commit or None,
                "dirty": (run.env.get("soft") or {}).get("dirty"), "torch": run.hard_env.get("torch"),
                "device": ", ".join(devices) or "cpu"}

    def stored_suite(self, suite: str, sets: dict[str, Any], keys: set[str], peak: bool = False,
                     processes: int | None = None, max_processes: int | None = None) -> RunRecord | None:
        """A finished run of ``suite`` at this size that holds every case of ``keys`` (a suite file that changed
        since is measured again; a run with more cases serves too), timed side by side in ``processes`` worker
        processes (default: this context's), on this hard environment, with a calibrated peak when a rule reads it
        (``peak``)."""
        hard = self.hard_env()
        procs = self.processes if processes is None else processes
        most = self.max_processes if max_processes is None else max_processes
        for run in self.store.list_runs(suite):
            if (run.status == "done" and run.quick == self.quick and run.options.get("sets") == sets
                    and run.options.get("interleave") and run.options.get("processes", 1) == procs
                    and run.options.get("max_processes", procs) == most
                    and run.stored == run.n_cases and run.hard_env == hard and (run.peak or not peak)
                    and keys <= self.store.stored_keys(run.id)):
                return run
        return None

    # -- experiments -----------------------------------------------------------------------
    def stored_experiment(self, module: str) -> dict[str, Any] | None:
        """The stored result of experiment ``module`` this context would reuse: same size, seeds and hard
        environment, trained by this checkout's experiment code."""
        row = ExperimentStore(self.store).find(module, self.quick, list(self.seeds), self.hard_env())
        if row is not None and row["result"].get("code_hash") != experiments_code_hash():
            log.info("claims: the stored %s was trained by other experiment code: training it again", module)
            return None
        return row

    def experiment(self, module: str) -> dict[str, Any]:
        """``claims.experiments.<module>.run(quick, seeds)``'s result (stored, then reused)."""
        self.check_read(f"experiment {module}")
        if module in self._experiments:
            self.provenance.append(self._experiment_provenance[module])
            return self._experiments[module]
        seeds = list(self.seeds)
        env = fingerprint(threads=self.threads)
        t_start = time.perf_counter()
        row = None if self.fresh else self.stored_experiment(module)
        if row is not None:
            log.info("claims: reusing experiment %s from %s", module, row["finished_at"])
            result = row["result"]
            env = row["env"]                          # provenance: the environment that trained it
        else:
            mod = importlib.import_module(f"claims.experiments.{module}")
            log.info("claims: training experiment %s (%s, seeds %s)", module, "quick" if self.quick else "full", seeds)
            torch.set_num_threads(self.threads)
            t0 = time.perf_counter()
            exp = getattr(mod, "EXPERIMENT", None)
            plan = Training.pooled(self.threads) if exp is not None and exp.parallel else None
            result = exp.run(quick=self.quick, seeds=tuple(seeds), plan=plan) if plan else mod.run(
                quick=self.quick, seeds=tuple(seeds))      # a parallel one: its trials in worker processes
            result.setdefault("wall_s", time.perf_counter() - t0)
            result["code_hash"] = experiments_code_hash()
            result["data_description"] = getattr(mod, "DATA", "")
            ExperimentStore(self.store).add(module, self.quick, seeds, env, result)
            log.info("claims: %s took %.0f s", module, time.perf_counter() - t0)
        self._experiments[module] = result
        self.pieces[f"experiment {module}"] = {"seconds": time.perf_counter() - t_start, "reused": row is not None}
        self._experiment_provenance[module] = {
            "source": f"experiment {module}", "commit": env["soft"].get("commit"), "dirty": env["soft"].get("dirty"),
            "torch": env["hard"].get("torch"), "device": "cpu"}        # the experiments train on the CPU
        self.provenance.append(self._experiment_provenance[module])
        return result
