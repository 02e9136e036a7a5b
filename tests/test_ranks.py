"""One case across 2 ranks (gloo, on the CPU): gradients equal to one process's (DDP, FSDP), per-rank memory by kind
(FSDP's saving), the bytes of the collectives counted (equal to the derived for DDP), a rank killed, a rank hung, a
mismatch that is an error (DDP gradients, a wrong tensor-parallel shard), ranks timing together through the one
timing loop, and bad input refused before anything runs.

The fault cases use tests/plugin_rank_faults.py, loaded only in the worker and rank processes (one ProcessExecutor
sweep of three cases, which also shows the sweep going on after a dead and a hung rank)."""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from harness.contract.errors import BenchInputError
from harness.contract.registry import resolve
from harness.contract.records import OMITTED_DEFAULTS
from harness.contract.spec import OMITTED_WHEN_DEFAULT, Case, Workload, workload_dict
from harness.engine import ranks
from harness.engine.distributed import WHOLE, Payload, counting, relative_error, time_calls
from harness.engine.runner import RunOptions, run_case
from harness.executors import ProcessExecutor
from harness.instruments.timing import TimingConfig, measure
from reports.ranks_view import rank_rows, scaling_figure
from reports.training_view import training_rows
from tests.helpers import invoke

PLUGIN = str(Path(__file__).with_name("plugin_rank_faults.py"))
FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=5.0, rounds=1)
METRICS = ("latency", "memory", "flops")


def decoder_case(parallel: str) -> Case:
    w = Workload(batch_size=2, seq_len=16, mode="train_step", world_size=2, parallel=parallel)
    return Case("ranks", parallel, "decoder-tiny", (), w, METRICS)


@pytest.fixture(scope="module")
def measured() -> dict:
    """decoder-tiny's training step on 2 gloo ranks, DDP and FSDP (in this process: the ranks are its children)."""
    return {p: run_case(decoder_case(p), RunOptions(timing=FAST, timeout_s=240)) for p in ("ddp", "fsdp")}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_gradients_equal_one_process(measured, parallel):
    rec = measured[parallel]
    assert rec.status == "ok", rec.message
    # averaged, as one process on both batches (FSDP summing instead would be a relative error of 1)
    assert rec.metrics["grad_max_rel_err"] <= 1e-4
    assert "share this machine's" in rec.message and "not speed" in rec.message


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_times_rates_and_flops_per_rank(measured, parallel):
    m = measured[parallel].metrics
    assert m["n_samples"] == len(measured[parallel].samples_s) >= 3
    medians = [m["rank0_median_ms"], m["rank1_median_ms"]]
    assert m["median_ms"] >= min(medians)            # sample i of the step is the slower rank's sample i
    assert m["tokens_per_s"] == pytest.approx(2 * m["tokens_per_s_per_rank"])
    assert m["tokens_per_s_per_rank"] == pytest.approx(2 * 16 / (m["median_ms"] / 1e3))
    assert m["flops_all_ranks"] == 2 * m["flops"] > 0
    assert 0 < m["comm_share"] == pytest.approx(m["comm_ms"] / m["median_ms"])


def test_memory_by_kind_per_rank_shows_fsdp_sharding(measured):
    ddp, fsdp = measured["ddp"].metrics, measured["fsdp"].metrics
    params = resolve("decoder-tiny").build(resolve("decoder-tiny").config)
    weights = sum(p.numel() * 4 for p in params.parameters())
    for r in (0, 1):
        assert ddp[f"rank{r}_weight_bytes"] == weights          # every rank holds the whole model
        assert ddp[f"rank{r}_grad_bytes"] == weights
        assert ddp[f"rank{r}_optimizer_state_bytes"] >= 2 * weights
        for kind in ("weight_bytes", "grad_bytes", "optimizer_state_bytes"):   # FSDP: each rank its half
            assert fsdp[f"rank{r}_{kind}"] == pytest.approx(ddp[f"rank{r}_{kind}"] / 2, rel=0.02), kind
        assert fsdp[f"rank{r}_peak_bytes"] < ddp[f"rank{r}_peak_bytes"]
    for m in (ddp, fsdp):        # the unprefixed figure is the largest rank's, never the sum
        assert m["peak_bytes"] == max(m["rank0_peak_bytes"], m["rank1_peak_bytes"])
        assert m["measured_weight_bytes"] == max(m["rank0_weight_bytes"], m["rank1_weight_bytes"])


def test_communication_bytes_derived_from_parameter_sizes(measured):
    ddp, fsdp = measured["ddp"].metrics, measured["fsdp"].metrics
    weights = ddp["rank0_weight_bytes"]
    assert ddp["comm_payload_bytes"] == weights              # one all-reduce of every gradient
    assert ddp["comm_bytes_per_rank"] == weights             # ring: 2 (N-1)/N of it, N = 2
    # FSDP: gather every parameter in the forward, the blocks' again in the backward, reduce-scatter every gradient
    assert 2 * weights < fsdp["comm_payload_bytes"] < 3 * weights
    assert fsdp["comm_bytes_per_rank"] == fsdp["comm_payload_bytes"] / 2
    assert Payload(all_reduce=100).sent_per_rank(4) == 150
    assert Payload(all_gather=100, reduce_scatter=100).sent_per_rank(4) == 150


def test_counted_bytes_equal_the_derived_for_ddp(measured):
    ddp, fsdp = measured["ddp"].metrics, measured["fsdp"].metrics
    # DDP all-reduces every gradient once, in its buckets: counted at torch.distributed.all_reduce
    assert ddp["comm_counted_bytes"] == ddp["comm_payload_bytes"] == ddp["rank0_weight_bytes"]
    assert ddp["comm_calls"] >= 1
    # ring all-reduce: a rank sends 2 (N-1)/N of the payload, N = 2
    assert ddp["comm_counted_bytes_per_rank"] == 2 * (2 - 1) / 2 * ddp["comm_counted_bytes"]
    # FSDP2: its all-gathers and reduce-scatters, counted (shards padded to equal sizes: at least the derived bytes)
    assert fsdp["comm_payload_bytes"] <= fsdp["comm_counted_bytes"] <= 1.05 * fsdp["comm_payload_bytes"]


def test_counting_sees_the_collectives_and_puts_them_back():
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    originals = {name: getattr(dist, name) for name in WHOLE}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ranks.free_port()}", rank=0, world_size=1)
    try:
        with counting() as counted:
            dist.all_reduce(torch.ones(10))
            dist.reduce_scatter_single(torch.empty(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
            dist.all_gather_single(output_tensor=torch.empty(3), input_tensor=torch.ones(3))
        assert [(c.op, c.nbytes) for c in counted.calls] == [("all_reduce", 40), ("reduce_scatter_single", 48),
                                                             ("all_gather_single", 12)]
        assert counted.payload() == Payload(all_reduce=40, all_gather=12, reduce_scatter=48)
        assert time_calls(counted.calls, torch.device("cpu")) > 0
    finally:
        dist.destroy_process_group()
    assert {name: getattr(dist, name) for name in WHOLE} == originals


def test_processes_timing_together_make_the_same_calls():
    """The ranks' timing is the one timing loop (timing.measure) with an agreement: here two threads, the leader's
    calls long (one call a block), the other's short (alone it would time blocks of many calls, and more of them)."""
    barrier, offered, calls = threading.Barrier(2), [0, 0], [0, 0]

    def agreement(rank: int):
        def agree(value: int) -> int:          # the leader's value once both have offered theirs
            offered[rank] = value
            barrier.wait()
            out = offered[0]
            barrier.wait()
            return out
        return agree

    def step(rank: int, seconds: float):
        def fn() -> None:
            calls[rank] += 1
            time.sleep(seconds)
        return fn

    config = TimingConfig(warmup_calls=2, warmup_s=0.0, min_samples=5, min_time_s=0.0, max_time_s=3.0,
                          min_sample_s=2e-3, rounds=1)
    results: list = [None, None]

    def run(rank: int, seconds: float) -> None:
        results[rank] = measure(step(rank, seconds), config, "cpu", agree=agreement(rank))
    threads = [threading.Thread(target=run, args=(0, 1e-2)), threading.Thread(target=run, args=(1, 1e-4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert calls[0] == calls[1]
    assert results[0].block_size == results[1].block_size == 1         # the leader's block size
    assert len(results[0].samples_s) == len(results[1].samples_s) >= 5
    # each its own clock: the other's samples are its own short calls, not the leader's pace
    assert statistics.median(results[0].samples_s) > statistics.median(results[1].samples_s)


def test_relative_error_sees_a_sum_for_a_mean():
    g = {"w": torch.tensor([1.0, -2.0])}
    assert relative_error({"w": 2 * g["w"]}, g) == pytest.approx(1.0)
    assert relative_error(g, g) == 0.0
    assert relative_error({}, g) == float("inf")


def _rank_processes_since(start: float) -> list[int]:
    """Rank worker processes started since ``start`` (epoch seconds) and still alive, after a short grace for a
    rank killed with its parent (PR_SET_PDEATHSIG) to go."""
    deadline = time.monotonic() + 5.0
    while True:
        found = []
        for p in psutil.process_iter(["cmdline", "create_time", "status"]):
            if p.info["create_time"] >= start and "harness.engine.rank_worker" in (p.info["cmdline"] or []) \
                    and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_dead_or_hung_rank_ends_its_case_and_the_sweep_goes_on():
    def case(behavior: str) -> Case:
        w = Workload(batch_size=2, mode="train_step", world_size=2, parallel="ddp")
        return Case("ranks", behavior, "rank-faulty", (("behavior", behavior),), w, ("latency",))
    # a wrong tensor-parallel shard: rank 1 keeps its first output projection scaled
    tp_skew = Case("ranks", "tp skew", "decoder-tp-skewed", (),
                   Workload(batch_size=2, seq_len=8, mode="fwd", world_size=2, parallel="tp"), ("latency",))
    start = time.time() - 1.0
    opts = RunOptions(timing=FAST, timeout_s=240, plugins=(PLUGIN,))
    # the hang: its ranks are stopped at 9 s (the timeout less its margin); on a loaded machine they may still be
    # starting then, which ends the case the same way (a timeout, every rank stopped)
    short = RunOptions(timing=FAST, timeout_s=10, plugins=(PLUGIN,))
    ex = ProcessExecutor()
    try:
        recs = {r.line: r for r in ex.run([case("sigkill"), case("skew"), tp_skew], opts)}
        recs.update({r.line: r for r in ex.run([case("hang")], short)})        # the same worker goes on
        assert recs["sigkill"].status == "crashed", recs["sigkill"].message
        assert "rank 1 killed by signal 9" in recs["sigkill"].message
        assert recs["hang"].status == "timeout", recs["hang"].message
        assert recs["hang"].duration_s < short.timeout_s           # the case's own timeout, within its budget
        assert recs["skew"].status == "error"                       # a mismatch is an error, not a result
        assert "differ from one process's" in recs["skew"].message
        assert recs["tp skew"].status == "error", recs["tp skew"].message
        assert "tp logits on 2 ranks differ from one process's" in recs["tp skew"].message
        assert _rank_processes_since(start) == []             # no rank left behind
    finally:
        ex.close()


def test_bad_input_is_refused_before_anything_runs(monkeypatch, tmp_path):
    with pytest.raises(BenchInputError, match="needs parallel"):
        Workload(mode="train_step", world_size=2)
    with pytest.raises(BenchInputError, match="runs mode train_step"):
        Workload(mode="fwd", world_size=2, parallel="ddp")
    with pytest.raises(BenchInputError, match="positive integer"):
        Workload(mode="train_step", world_size=0, parallel="ddp")
    with pytest.raises(BenchInputError, match="unknown parallel"):
        Workload(mode="train_step", world_size=2, parallel="pipeline")
    monkeypatch.setattr(ranks, "usable_cores", lambda: 2)
    with pytest.raises(BenchInputError, match="needs 3 CPU cores"):
        ranks.check_ranks(resolve("decoder-tiny"), Workload(mode="train_step", world_size=3, parallel="fsdp"))
    store = tmp_path / "r.db"
    result = invoke("run", "training", "--quick", "--executor", "inline", "--store", f"sqlite:///{store}",
                    "--set", "world_size=3", "--set", "parallel=ddp")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "world_size 3 needs 3" in lines[0]
    assert not store.exists()


def test_world_size_one_keeps_the_case_key():
    defaults = {f.name: f.default for f in dataclasses.fields(Workload)}
    assert OMITTED_DEFAULTS == {k: defaults[k] for k in OMITTED_WHEN_DEFAULT}   # a record reads them back
    w = Workload(mode="train_step")
    assert "world_size" not in workload_dict(w) and "parallel" not in workload_dict(w)
    assert workload_dict(Workload(mode="train_step", world_size=2, parallel="ddp"))["world_size"] == 2


def test_the_report_shows_each_rank_and_leaves_the_one_process_table(measured):
    recs = [measured["ddp"], measured["fsdp"]]
    rows = rank_rows(recs)
    assert [r["parallel"] for r in rows] == ["ddp", "fsdp"]
    assert rows[1]["peaks"].count(" / ") == 1                     # every rank's peak, side by side
    assert float(rows[1]["weights"]) < float(rows[0]["weights"])  # FSDP's shard
    assert scaling_figure(recs) is not None
    assert training_rows(recs) == []                               # not mixed into the one-process table
