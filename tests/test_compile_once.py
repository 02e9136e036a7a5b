"""A model is compiled once for all its batches (issue 26, item 4): the batch dimension is marked dynamic
(harness.engine.compiled.mark_batch_dynamic) and the compiled wrapper is kept with the worker's kept model
(harness.engine.models.ModelCache.compiled), so a batch sweep compiles one graph instead of one per batch; and the
worker does not re-run the command line's ``__main__`` (harness.executors.process)."""
from __future__ import annotations

import dataclasses
import multiprocessing.spawn
import sys

import pytest
import torch

from harness.engine import compiled
from harness.contract import registry
from harness.engine.compiled import compiled_key, mark_batch_dynamic
from harness.executors import process
from harness.engine.models import MODELS, ModelCache
from harness.engine.runner import RunOptions, run_case
from harness.contract.spec import Case, Workload
from harness.contract.suite import load_suite
from harness.instruments.timing import TimingConfig

FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=1.0, rounds=1)
SMALL = tuple(sorted(registry.get("decoder-tiny").small))      # d=32, L=2, h=4, vocab 64


# -- marking the batch ------------------------------------------------------------------------------------

def test_only_tensors_whose_first_dimension_is_the_batch_are_marked():
    x, y, other = torch.zeros(4, 3), torch.zeros(4), torch.zeros(3, 4)
    assert mark_batch_dynamic((x, y, other, 7, None), 4) == 2
    assert 0 in getattr(x, "_dynamo_weak_dynamic_indices", set())
    assert 0 in getattr(y, "_dynamo_weak_dynamic_indices", set())
    assert not getattr(other, "_dynamo_weak_dynamic_indices", set())
    one = torch.zeros(1, 3)
    assert mark_batch_dynamic((one,), 1) == 0 and not getattr(one, "_dynamo_weak_dynamic_indices", set())


def test_the_compiled_key_ignores_the_batch_and_nothing_else():
    w = Workload(batch_size=2, seq_len=8, compile="default")
    assert compiled_key(w) == compiled_key(dataclasses.replace(w, batch_size=64))
    for change in ({"seq_len": 16}, {"dtype": "bf16"}, {"mode": "fwd_bwd"}, {"compile": "max-autotune"},
                   {"threads": 1}):
        assert compiled_key(w) != compiled_key(dataclasses.replace(w, **change)), change


# -- the kept wrapper --------------------------------------------------------------------------------------

def test_the_kept_model_keeps_one_wrapper_per_key_and_drops_it_with_the_model():
    cache, made = ModelCache(), []
    model = torch.nn.Linear(2, 2)
    cache.key, cache.model = ("k",), model

    def make() -> torch.nn.Module:
        made.append(torch.nn.Identity())
        return made[-1]
    a = cache.compiled(model, ("fwd", 1), make)
    assert cache.compiled(model, ("fwd", 1), make) is a and len(made) == 1 and cache.compile_hits == 1
    b = cache.compiled(model, ("fwd", 2), make)               # other sizes/dtype/mode: a new wrapper
    assert b is not a and len(made) == 2 and cache.wrapper == (("fwd", 2), b)
    other = torch.nn.Linear(2, 2)                              # a model the cache does not keep: not kept
    c = cache.compiled(other, ("fwd", 2), make)
    assert c is not b and cache.wrapper is None
    cache.compiled(model, ("fwd", 2), make)
    cache.clear()
    assert cache.wrapper is None and cache.model is None


# -- through the runner: a batch sweep compiles once ----------------------------------------------------

def test_a_batch_sweep_compiles_its_model_once():
    """decoder-tiny (tiny preset) compiled at batch 2, 4 and 8 in one process, as a worker runs a sweep: the first
    case captures the graph, the next two reuse it (0 graphs, the compiled wrapper kept); the outputs are the eager
    model's."""
    MODELS.clear()
    records = []
    for b in (2, 4, 8):
        case = Case("t", "compiled", "decoder-tiny", SMALL, Workload(batch_size=b, seq_len=8, compile="default"),
                    ("latency",))
        records.append(run_case(case, RunOptions(timing=FAST)))
    assert [r.status for r in records] == ["ok"] * 3, [r.message for r in records]
    graphs = [r.metrics["compile_graphs"] for r in records]
    assert graphs[0] >= 1 and graphs[1:] == [0.0, 0.0], graphs
    assert records[0].metrics["compile_s"] > 0.0
    assert all(r.metric("median_ms") for r in records)
    assert MODELS.compile_hits >= 2
    spec = registry.resolve("decoder-tiny", **dict(SMALL))
    fast = MODELS.wrapper[1]
    x = spec.make_inputs(spec.config, Workload(batch_size=8, seq_len=8), torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(fast(*x), MODELS.model(*x), rtol=1e-4, atol=1e-5)
    MODELS.clear()


# -- claims/gpu_rate.toml ---------------------------------------------------------------------------------

def test_c23s_gpu_suite_keeps_only_batches_that_can_hold_a_best_rate():
    suite = load_suite("claims/gpu_rate.toml", quick=False, sets={"device": "cuda", "compile": "default"})
    quick = load_suite("claims/gpu_rate.toml", quick=True, sets={"device": "cuda", "compile": "default"})
    for s in (suite, quick):
        by = {}
        for c in s.cases:
            by.setdefault(c.arch, set()).add(c.workload.batch_size)
        assert set(by) == {"vit-b16", "resnet50"} and by["vit-b16"] == by["resnet50"]
        assert min(by["vit-b16"]) > 1 and max(by["vit-b16"]) == 256      # batch 1 is launch-bound, never best
    assert len(quick.cases) < len(suite.cases)


# -- the worker's start ------------------------------------------------------------------------------------

def test_the_worker_is_spawned_without_the_parents_main(monkeypatch):
    """What a spawned bench worker is told to prepare: never the parent's ``__main__`` (the ``bench`` script
    would import the whole command line: pandas, matplotlib, reports), whatever else spawns keeps it."""
    process.skip_main_in_workers()
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "/tmp/some_script.py", raising=False)
    worker = multiprocessing.spawn.get_preparation_data(process.WORKER_NAME)
    assert "init_main_from_path" not in worker and "init_main_from_name" not in worker
    assert worker["sys_path"] == multiprocessing.spawn.get_preparation_data("other")["sys_path"]


@pytest.mark.gpu
def test_a_cudagraphs_batch_sweep_compiles_once_on_cuda():
    """On CUDA with CUDA graphs: batches 2, 4 and 8 of one model, one graph captured (each batch records its own
    CUDA graph, which is not a compile)."""
    MODELS.clear()
    graphs = []
    for b in (2, 4, 8):
        case = Case("t", "graphs", "decoder-tiny", SMALL,
                    Workload(batch_size=b, seq_len=8, device="cuda", compile="cudagraphs"), ("latency",))
        rec = run_case(case, RunOptions(timing=FAST))
        assert rec.status == "ok", rec.message
        graphs.append(rec.metrics["compile_graphs"])
    assert graphs[0] >= 1 and graphs[1:] == [0.0, 0.0], graphs
    MODELS.clear()
    assert compiled.uses_cuda_graphs("cudagraphs", "cuda")
