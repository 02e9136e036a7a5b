"""Where the claims' evidence comes from: suite runs and training experiments, reused from the store when
one was measured at the same size on the same hard environment (``--fresh`` measures again)."""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from rich.console import Console

from harness.env import fingerprint
from harness.store import Store

Log = Callable[[str], None]


@dataclass
class Context:
    """What a probe may ask for. Every suite/experiment is measured at most once per context."""

    store: Store
    quick: bool = True
    fresh: bool = False
    seeds: tuple[int, ...] = (0, 1, 2)
    threads: int = 2
    executor: str = "process"
    console: Console = field(default_factory=lambda: Console(stderr=True))
    calibrate: bool = True
    _suites: dict[tuple, tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=dict)
    _experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    used: list[str] = field(default_factory=list)

    def hard_env(self) -> dict[str, Any]:
        return fingerprint(threads=self.threads)["hard"]

    # -- suites ----------------------------------------------------------------------------
    def suite(self, name: str, sets: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run of built-in suite ``name`` (with ``sets`` pinned, as ``--set``) and its rows."""
        from harness.session import execute, open_run, run_options
        from harness.suite import load_suite
        sets = dict(sets or {})
        sets.setdefault("threads", self.threads)
        key = (name, tuple(sorted(sets.items())))
        if key in self._suites:
            return self._suites[key]
        suite = load_suite(name, quick=self.quick, sets=dict(sets))
        run = None if self.fresh else self._stored_run(suite.name, sets, {c.key for c in suite.cases})
        if run is None:
            cases = list(suite.cases)
            self.console.print(f"[bold]claims[/]: measuring suite {name}"
                               + (f" with {sets}" if sets else "") + f" ({len(cases)} cases)")
            run_id, todo = open_run(self.store, suite, cases, resume=False, quick=self.quick, timeout=None,
                                    calibrate=self.calibrate, console=self.console,
                                    extra_options={"sets": sets, "by": "bench claims"})
            execute(self.store, run_id, todo, run_options(self.quick), self.executor, len(cases), self.console)
            run = self.store.get_run(run_id)
        else:
            self.console.print(f"[bold]claims[/]: reusing run {run['id']} of {name}")
        result = (run, self.store.records(run["id"]))
        self._suites[key] = result
        self.used.append(f"run {run['id']} ({name})")
        return result

    def _stored_run(self, suite: str, sets: dict[str, Any], keys: set[str]) -> dict[str, Any] | None:
        """A finished run of ``suite`` at this size with exactly these cases (a suite file that
        changed since is measured again) on this hard environment."""
        hard = self.hard_env()
        for run in self.store.list_runs(suite):
            opts = run["options"] or {}
            if (run["status"] == "done" and run["quick"] == self.quick and opts.get("sets") == sets
                    and run["stored"] == run["n_cases"] and run["env"].get("hard") == hard
                    and self.store.stored_keys(run["id"]) == keys):
                return run
        return None

    # -- experiments -----------------------------------------------------------------------
    def experiment(self, module: str) -> dict[str, Any]:
        """``harness.claims.experiments.<module>.run(quick, seeds)``'s result (stored, then reused)."""
        if module in self._experiments:
            return self._experiments[module]
        seeds = list(self.seeds)
        env = fingerprint(threads=self.threads)
        row = None if self.fresh else self.store.find_experiment(module, self.quick, seeds, env["hard"])
        if row is not None:
            self.console.print(f"[bold]claims[/]: reusing experiment {module} from {row['finished_at']}")
            result = row["result"]
        else:
            mod = importlib.import_module(f"harness.claims.experiments.{module}")
            self.console.print(f"[bold]claims[/]: training experiment {module} "
                               f"({'quick' if self.quick else 'full'}, seeds {seeds})")
            torch.set_num_threads(self.threads)
            t0 = time.perf_counter()
            result = mod.run(quick=self.quick, seeds=tuple(seeds))
            result.setdefault("wall_s", time.perf_counter() - t0)
            result["data_description"] = getattr(mod, "DATA", "")
            self.store.add_experiment(module, self.quick, seeds, env, result)
            self.console.print(f"[bold]claims[/]: {module} took {time.perf_counter() - t0:,.0f} s")
        self._experiments[module] = result
        self.used.append(f"experiment {module}")
        return result
