"""Trials in worker processes (claims.experiments.runner.sweep under a Training plan): the same figures as the
same trials run one by one at one thread, in other processes, errors raised."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from claims.experiments import recall
from claims.experiments.runner import Training, sweep, training

TINY = recall.Setup(pairs=(2, 3), n_keys=8, n_values=8, d_model=16, n_heads=2, steps=6, batch=4, warmup=2,
                    eval_n=8)


POOL = Training(2, 1)


@pytest.fixture(scope="module")
def workers():
    """One pool of 2 one-thread workers for the module's pooled runs (spawning costs seconds: start it once)."""
    with training(POOL):
        yield POOL


def _strip(result: dict) -> dict:
    """The result without what depends on how it ran (the wall time, the plan)."""
    return {k: v for k, v in result.items() if k not in ("scale", "trained_by")} | {
        "scale": {k: v for k, v in result["scale"].items() if k != "wall_seconds"}}


def where(variant: str, seed: int) -> dict:
    """Which process trained the trial, at how many threads (module-level: picklable)."""
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "tag": f"{variant}{seed}"}


def fails(variant: str, seed: int) -> dict:
    raise ValueError(f"trial {variant} {seed} failed")


def test_pool_gives_the_serial_figures(workers):
    serial = recall.EXPERIMENT.run(setup=TINY, seeds=(0, 1), plan=Training(1, 1))
    pooled = recall.EXPERIMENT.run(setup=TINY, seeds=(0, 1), plan=workers)
    assert serial["trained_by"] == {"workers": 1, "threads_per_worker": 1}
    assert pooled["trained_by"] == {"workers": 2, "threads_per_worker": 1}
    assert _strip(pooled) == _strip(serial)
    assert set(pooled["variants"]) == {"attention", "s4d", "mamba"}
    assert pooled["variants"]["mamba"]["train_loss"][0] != pooled["variants"]["mamba"]["train_loss"][1]


def test_pool_trains_in_other_processes_at_its_threads_in_order(workers):
    out = sweep({"a": "a", "b": "b"}, (0, 1, 2), where)
    assert out["a"]["tag"] == ["a0", "a1", "a2"] and out["b"]["tag"] == ["b0", "b1", "b2"]
    pids = set(out["a"]["pid"] + out["b"]["pid"])
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert set(out["a"]["threads"] + out["b"]["threads"]) == {1}


def test_serial_plan_trains_here_at_its_threads():
    before = torch.get_num_threads()
    with training(Training(1, 1)):
        out = sweep({"a": "a"}, (0, 1), where)
    assert out["a"]["pid"] == [os.getpid()] * 2 and out["a"]["threads"] == [1, 1]
    assert torch.get_num_threads() == before


def test_a_failing_trial_is_raised_not_recorded(workers):
    with pytest.raises(ValueError, match="failed"):
        sweep({"a": "a"}, (0, 1), fails)
    assert sweep({"a": "a"}, (0, 1), where)["a"]["tag"] == ["a0", "a1"]     # the workers go on


def test_default_plans():
    assert recall.EXPERIMENT.parallel
    assert Training.pooled(2) == Training(2, 1)
    with pytest.raises(ValueError):
        Training(0, 1)


def test_pooled_lm_trials_share_a_training_across_experiments(workers, monkeypatch):
    """kv_heads' MHA trained in a worker comes back to this process's TRAINED, and causal's masked decoder (the
    same model) takes its weights: the same figures as causal trained alone, serially at one thread."""
    import dataclasses

    from claims.experiments import causal, kv_heads, lm_train

    def tiny(mod):
        return dataclasses.replace(mod.QUICK, steps=2, warmup=1, batch=2, seq_len=16, eval_windows=4, eval_batch=4,
                                   corpus_bytes=100_000, d_model=32, **({"prefixes": 4} if mod is causal else {}))

    monkeypatch.setattr(lm_train, "TRAINED", {})
    kv = kv_heads.EXPERIMENT.run(seeds=(0,), setup=tiny(kv_heads), plan=workers)
    assert kv["trained_by"] == {"workers": 2, "threads_per_worker": 1}
    assert len(lm_train.TRAINED) == 3 and all("_trained" not in v for v in kv["variants"].values())
    shared = causal.EXPERIMENT.run(seeds=(0,), setup=tiny(causal), plan=workers)
    assert len(lm_train.TRAINED) == 3                      # causal's masked decoder was not trained again
    lm_train.TRAINED.clear()
    alone = causal.EXPERIMENT.run(seeds=(0,), setup=tiny(causal), plan=Training(1, 1))
    for r in (shared, alone):
        for m in r["models"].values():
            m.pop("train_seconds")
    assert _strip(shared) == _strip(alone)


def test_an_experiment_that_times_its_trials_refuses_workers():
    from claims.experiments import residual
    assert not residual.EXPERIMENT.parallel
    with pytest.raises(ValueError, match="one process"):
        residual.EXPERIMENT.run(seeds=(0,), plan=Training(2, 1))


PARALLEL = ["recall", "kv_heads", "positions", "ssm_lm", "causal", "norm_placement", "small_vision", "mnist1d"]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", PARALLEL)
def test_every_parallel_experiments_trials_pickle(name, monkeypatch):
    """A parallel experiment's sweeps hand a worker only picklable trials and variants (no closure, no lambda):
    each sweep's arguments go through pickle, then the run stops (nothing is trained)."""
    import dataclasses
    import importlib
    import pickle

    mod = importlib.import_module(f"claims.experiments.{name}")
    assert mod.EXPERIMENT.parallel

    def pickling(variants, seeds, trial):
        pickle.loads(pickle.dumps((dict(variants), seeds, trial)))
        raise _Stop

    for m in {mod, importlib.import_module("claims.experiments.lm_train")}:
        if hasattr(m, "sweep"):
            monkeypatch.setattr(m, "sweep", pickling)
    quick = mod.EXPERIMENT.quick
    setup = dataclasses.replace(quick, grad_depths=(1,), grad_batch=2) if name == "norm_placement" else quick
    with pytest.raises(_Stop):
        mod.EXPERIMENT.run(seeds=(0,), setup=setup)


def test_the_list_of_parallel_experiments_is_complete():
    import importlib
    import pkgutil

    import claims.experiments as pkg
    parallel = {m.name for m in pkgutil.iter_modules(pkg.__path__)
                if getattr(importlib.import_module(f"claims.experiments.{m.name}"), "EXPERIMENT", None) is not None
                and importlib.import_module(f"claims.experiments.{m.name}").EXPERIMENT.parallel}
    assert parallel == set(PARALLEL)


@dataclasses.dataclass(frozen=True)
class _Setup:
    size: int = 1


def _measure(setup: _Setup, seeds: tuple[int, ...]) -> tuple[dict, dict]:
    return {"threads_here": torch.get_num_threads()}, {}


@pytest.mark.parametrize("parallel, trained_by", [(True, {"workers": 2, "threads_per_worker": 1}),
                                                  (False, {"workers": 1, "threads_per_worker": 2})])
def test_bench_claims_pools_only_a_parallel_experiment(parallel, trained_by, tmp_path, monkeypatch):
    """claims.evidence.Context.experiment trains a parallel experiment under Training.pooled(its threads), any
    other one serially at its threads; the stored result says which."""
    import sys
    import types

    from claims.evidence import Context
    from claims.experiments.runner import Experiment
    from harness.store.db import Store

    fake = types.ModuleType("claims.experiments.fake_pool")
    fake.EXPERIMENT = Experiment("CX", _Setup(), _Setup(), _measure, parallel=parallel)  # type: ignore[attr-defined]
    fake.run = fake.EXPERIMENT.run                                                       # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "claims.experiments.fake_pool", fake)
    before = torch.get_num_threads()
    try:
        ctx = Context(store=Store(f"sqlite:///{tmp_path / 's.sqlite'}"), quick=True, threads=2, seeds=(0,))
        assert ctx.experiment("fake_pool")["trained_by"] == trained_by
    finally:
        torch.set_num_threads(before)
