"""Harness overhead: the time accounting of a run, model reuse, cheap weight init, and which errors poison a
worker (a CUDA context that cannot be trusted); that a worker outlives a case's Python exception but not a crash is
tested on real worker processes in test_executor.py."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from harness import session
from harness.engine import measure
from harness.executors.base import poisons_worker
from harness.engine.overhead import (CASE_PARTS, MEASURED, RunOverhead, metric_name, run_overhead, summary_line,
                              warmup_shares)
from harness.contract.metrics import GATE_EQUAL
from harness.contract.registry import resolve
from harness.engine.models import MODELS, materialize, cheap_init, model_key
from harness.engine.runner import RunOptions, run_case, run_group
from harness.contract.spec import Case, Workload
from harness.store.db import Store
from harness.instruments.timing import TimingConfig
from tests.helpers import run_tiny

FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=0.5)
DETERMINISTIC = GATE_EQUAL


def tiny(seq_len: int = 16, mode: str = "fwd", dtype: str = "fp32", line: str = "a", **over) -> Case:
    overrides = tuple(sorted({"n_kv_heads": 4, **over}.items()))
    return Case("oh", line, "decoder-tiny", overrides, Workload(seq_len=seq_len, mode=mode, dtype=dtype),
                ("latency", "memory", "flops"))


# -- the accounting ------------------------------------------------------------------------------------------
def test_run_accounting_adds_up_and_is_stored_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "_process_start_counted", False)   # as in a fresh `bench` process
    _, url, res = run_tiny(tmp_path, "--no-calibrate", "--no-report")
    assert res.exit_code == 0, res.stderr
    store = Store(url, create=False)
    run = store.get_run("latest")
    o = RunOverhead.from_dict(run.options["overhead"])
    records = store.records(run.id)
    assert o.n_cases == len(records) == 6
    assert o.wall_s > 0 and all(v >= 0 for v in o.parts.values())
    assert sum(o.parts.values()) == pytest.approx(o.wall_s, rel=1e-9)          # parts + remainder = wall
    assert sum(o.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert o.measured_s <= o.wall_s and o.overhead_share == pytest.approx(1 - o.measured_s / o.wall_s)
    assert o.parts["startup"] > 0                  # this process's imports belong to its first run
    for rec in records:
        parts = [rec.metrics[metric_name(p)] for p in CASE_PARTS
                 if p not in ("compile", "energy")]   # compile: compiled cases only; energy: --energy runs only
        assert all(v >= 0 for v in parts) and sum(parts) <= rec.duration_s
        assert rec.metrics[metric_name("timed")] == pytest.approx(
            sum(rec.samples_s) * rec.metrics["block_size"], rel=1e-9)
    assert o.parts["timed"] == pytest.approx(sum(r.metrics[metric_name("timed")] for r in records))
    assert "overhead" in res.stderr and "timed" in res.stderr        # the summary line is printed at the end


def test_interleaved_run_accounts_each_case(tmp_path):
    _, url, res = run_tiny(tmp_path, "--no-calibrate", "--no-report", "--interleave")
    assert res.exit_code == 0, res.stderr
    store = Store(url, create=False)
    run = store.get_run("latest")
    records = store.records(run.id)
    assert all(r.group for r in records)
    for rec in records:
        assert rec.metrics[metric_name("warmup")] > 0 and rec.metrics[metric_name("timed")] > 0
        assert sum(rec.metrics[metric_name(p)] for p in CASE_PARTS if p not in ("compile", "energy")) <= rec.duration_s
    o = RunOverhead.from_dict(run.options["overhead"])
    assert sum(o.shares.values()) == pytest.approx(1.0, abs=1e-9)


def test_run_overhead_shares_and_overlap():
    cases = [({"time_timed_s": 2.0, "time_warmup_s": 1.0, "time_build_s": 0.5}, 4.0)]
    o = run_overhead(10.0, cases, startup_s=1.0, calibrate_s=2.0, workers_s=0.5, worker_starts=1)
    assert o.measured_s == pytest.approx(3.0) and o.overhead_s == pytest.approx(7.0)
    assert o.parts["cases_other"] == pytest.approx(0.5) and o.parts["other"] == pytest.approx(2.5)
    assert sum(o.shares.values()) == pytest.approx(1.0)
    assert RunOverhead.from_dict(o.to_dict()) == o
    line = summary_line(o)
    assert "overhead 70%" in line and "timed 20%" in line and "calibration 20%" in line
    with pytest.raises(ValueError, match="exceeds the wall time"):
        run_overhead(3.0, cases, startup_s=1.0)           # 4 s of case + 1 s start-up in 3 s of wall


def test_warmup_shares_split_the_rest_by_weight():
    assert warmup_shares(10.0, [2.0, 4.0], [1.0, 3.0]) == pytest.approx([1.0, 3.0])
    assert warmup_shares(10.0, [2.0, 4.0], [0.0, 0.0]) == pytest.approx([2.0, 2.0])
    assert warmup_shares(5.0, [3.0, 3.0], [1.0, 1.0]) == [0.0, 0.0]           # never negative


def test_measured_parts_are_the_definition():
    assert set(MEASURED) == {"timed", "warmup", "memory", "count", "compile", "energy"}


# -- model reuse --------------------------------------------------------------------------------------------
def _fresh(case: Case) -> dict[str, float]:
    MODELS.clear()
    rec = run_case(case, RunOptions(timing=FAST))
    assert rec.ok, rec.message
    return rec.metrics


@pytest.mark.parametrize("before", [tiny(64), tiny(64, mode="fwd_bwd"), tiny(16, dtype="bf16")],
                         ids=["other length", "after fwd_bwd", "after bf16"])
def test_a_reused_model_measures_as_a_fresh_build(before):
    case = tiny(32)
    fresh = _fresh(case)
    MODELS.clear()
    assert run_case(before, RunOptions(timing=FAST)).ok
    hits = MODELS.hits
    reused = run_case(case, RunOptions(timing=FAST))
    assert reused.ok, reused.message
    assert MODELS.hits == hits + 1                       # the kept model was used, not rebuilt
    assert all(p.grad is None for p in MODELS.model.parameters())
    for k in DETERMINISTIC:
        assert reused.metrics[k] == fresh[k], k


def test_another_model_is_built_and_the_kept_one_dropped():
    MODELS.clear()
    assert run_case(tiny(16), RunOptions(timing=FAST)).ok
    first = MODELS.model
    hits = MODELS.hits
    assert run_case(tiny(16, n_kv_heads=1), RunOptions(timing=FAST)).ok
    assert MODELS.hits == hits and MODELS.model is not first
    assert MODELS.key == model_key(tiny(16, n_kv_heads=1))


def test_a_model_that_grew_state_is_rebuilt():
    MODELS.clear()
    assert run_case(tiny(16), RunOptions(timing=FAST)).ok
    MODELS.model.register_buffer("cached_mask", torch.zeros(4))       # e.g. a mask cached for one length
    hits = MODELS.hits
    assert run_case(tiny(32), RunOptions(timing=FAST)).ok
    assert MODELS.hits == hits and not hasattr(MODELS.model, "cached_mask")


def test_a_group_shares_a_model_only_in_one_mode_and_dtype(monkeypatch):
    MODELS.clear()
    seen: list[tuple[Case, nn.Module, bool]] = []
    real = measure.measure_memory

    def spy(p):                                   # called once per case, in order, with the case prepared
        seen.append((p.case, p.model, p.model.training))
        real(p)
    monkeypatch.setattr(measure, "measure_memory", spy)
    cases = [tiny(16), tiny(32), tiny(16, mode="fwd_bwd"), tiny(16, dtype="bf16")]
    recs = run_group(cases, RunOptions(timing=FAST, interleave=True))
    assert all(r.ok for r in recs), [r.message for r in recs]
    (_, m16, t16), (_, m32, _), (_, mbwd, tbwd), (_, mbf, _) = seen
    assert m16 is m32                              # same model, same mode and dtype: shared
    assert mbwd is not m16 and mbf is not m16 and mbf is not mbwd
    assert not t16 and tbwd and not m16.training   # the fwd cases still step an eval-mode model
    assert next(mbf.parameters()).dtype == torch.bfloat16 and next(m16.parameters()).dtype == torch.float32


# -- cheap initialisation -----------------------------------------------------------------------------------
def test_cheap_init_keeps_each_init_distribution_and_restores_torch():
    uniform, normal, trunc = torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_
    with cheap_init():
        lin = nn.Linear(512, 256)                 # kaiming_uniform_: U(-1/√512·…, …)
        emb = nn.Embedding(1000, 64)              # normal_(0, 1)
        t = nn.init.trunc_normal_(torch.empty(300, 300), std=1.0, a=-0.5, b=0.5)
    assert (torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_) == (uniform, normal, trunc)
    bound = 1 / 512 ** 0.5
    w = lin.weight.detach()
    assert torch.isfinite(w).all() and w.abs().max() <= bound and w.std() == pytest.approx(bound / 3 ** 0.5, rel=0.05)
    e = emb.weight.detach()
    assert e.mean().abs() < 0.02 and e.std() == pytest.approx(1.0, rel=0.03)
    assert t.min() >= -0.5 and t.max() <= 0.5
    assert torch.linalg.matrix_rank(w[:, :256]) == 256         # the pool does not repeat rows


def test_cheap_init_is_deterministic_and_finite():
    spec = resolve("vit-tiny") if _has("vit-tiny") else resolve("decoder-tiny")
    w = Workload(img_size=32, seq_len=16)
    a, b = (materialize(spec, w, torch.device("cpu")) for _ in range(2))
    for (n, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), n
        if pa.is_floating_point():
            assert torch.isfinite(pa).all(), n


def _has(name: str) -> bool:
    from harness.contract.registry import list_archs
    return name in list_archs()


# -- which errors end the worker (the worker's life through real crashes and exceptions: test_executor.py) ---------
@pytest.mark.parametrize("message, poisoned", [
    ("RuntimeError: CUDA error: an illegal memory access was encountered", True),
    ("RuntimeError: CUDA error: device-side assert triggered", True),
    ("RuntimeError: CUDA error: unspecified launch failure", True),
    ("RuntimeError: CUDA error: misaligned address", True),
    ("RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`", True),
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ("RuntimeError: boom", False),
    ("MemoryError: simulated host allocation failure", False),
    ("AssertionError: sdpa_flop_count: query/key/value shapes are incompatible", False),
    ("RuntimeError: CUDA error: invalid configuration argument", False),
])
def test_which_errors_poison_the_worker(message, poisoned):
    assert poisons_worker(message) is poisoned
