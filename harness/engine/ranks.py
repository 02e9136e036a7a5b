"""One case across several ranks (``world_size`` > 1, or ``parallel`` set): start the ranks, wait for them within
the case's timeout, stop them all when one fails, and fold what each found into the case's one record.

Each rank is a fresh ``python -m harness.engine.rank_worker`` process (a subprocess, not a multiprocessing child:
the case may run inside a daemonic bench worker), told its rank, the job (case and options, pickled into a private
temporary folder) and a free port on 127.0.0.1 for the rendezvous (gloo on the CPU, nccl on CUDA). A rank that
dies ends the case as ``crashed``, one that raises as ``error`` (``oom`` for an out-of-memory), and a case still
running at its timeout as ``timeout``; in each case every other rank is killed and waited for, so no process is left
behind, and the sweep goes on. Ranks die with the process that started them (``PR_SET_PDEATHSIG``), so a worker
killed from outside takes its ranks with it.

What the record holds (every figure from the ranks' own runs; ``harness.contract.metrics`` describes each):

* time — sample i of the step is the largest of the ranks' sample i (each taken after the same barrier):
  ``median_ms`` and the rest summarize those; ``rank<r>_median_ms`` is each rank's own median, so a straggler shows;
* rates — ``samples_per_s``/``tokens_per_s`` of all ranks together (under DDP and FSDP each rank steps its own
  batch of ``batch_size``; under TP the ranks step one batch together), ``samples_per_s_per_rank``/
  ``tokens_per_s_per_rank`` (the total / N); ``flops`` and ``macs`` are one rank's step as counted (TP: the whole
  model's, as one process counts it), ``flops_all_ranks`` their sum (DDP, FSDP); MFU per device where the device
  has a published peak; a generation's figures (TTFT, TPOT, ...: :mod:`harness.engine.generation`) are the slowest
  rank's;
* memory — each rank's ``rank<r>_peak_bytes`` and its memory by kind (``rank<r>_weight_bytes``, ``_grad_bytes``,
  ``_optimizer_state_bytes``, ``_activation_bytes``: the rank's own shard under FSDP and TP); the unprefixed
  ``peak_bytes`` and ``measured_*_bytes`` are the LARGEST rank's, never a sum;
* communication — ``comm_payload_bytes`` (the tensor bytes the step's collectives carry, derived from the parameter
  sizes, or under TP the activations: :class:`harness.engine.distributed.Payload`), ``comm_counted_bytes`` (the
  same, counted at the collectives of one step: :func:`harness.engine.distributed.counting`), ``comm_calls``,
  ``comm_bytes_per_rank`` and ``comm_counted_bytes_per_rank`` (what a rank sends with ring collectives, from each),
  ``comm_ms`` (the counted collectives replayed alone) and ``comm_share`` = comm_ms / median_ms (an upper
  bound: in the step they overlap compute);
* correctness — ``grad_max_rel_err``: one step's gradients against one process's on the same batches (DDP, FSDP);
  ``logit_max_rel_err``: the logits against the whole model's (TP).

On a CPU the ranks share its cores: the record's note says so, and its times are for correctness, memory and
communication bytes, not speed.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness.analysis.stats import summarize_rounds
from harness.contract import registry
from harness.contract.errors import BenchInputError
from harness.contract.plugins import load_files as load_plugin_files
from harness.contract.records import CaseRecord
from harness.contract.spec import ArchSpec, Case, Workload
from harness.engine import peaks
from harness.engine.env import usable_cores
from harness.engine.overhead import metric_name
from harness.engine.payload import Payload
from harness.engine.tensor_parallel import check_split
from harness.instruments.timing import consecutive_rounds


POLL_S = 0.05
CAUSE_WAIT_S = 0.5
TIMEOUT_MARGIN_S = 10.0     # the ranks are stopped this long before the case's timeout (at most 10 % of it), so
                            # the case's own record, not the executor's kill, says ``timeout``
KINDS: tuple[tuple[str, str], ...] = (("measured_weight_bytes", "weight_bytes"),
                                      ("measured_grad_bytes", "grad_bytes"),
                                      ("measured_optimizer_state_bytes", "optimizer_state_bytes"),
                                      ("activation_bytes", "activation_bytes"),
                                      ("activation_peak_bytes", "activation_peak_bytes"),
                                      ("peak_bytes", "peak_bytes"))
"""A rank's memory metrics (as :func:`harness.engine.training.measure_memory` names them) → their per-rank names."""

Count = Callable[[ArchSpec, Workload, torch.device, bool, dict[str, str]], dict[str, float]]
"""The fake pass (``harness.engine.runner.fake_pass``): one rank's params, MACs and FLOPs."""


def spans_ranks(w: Workload) -> bool:
    """Whether ``w`` runs through here: a ``parallel`` split (one rank or several)."""
    return w.parallel != "none"


def devices_available(device: str) -> int:
    """Ranks this machine can give a device each: its CUDA devices, or its CPU cores (the machine's, not this
    process's affinity: a worker pinned to one core still starts ranks that the kernel spreads over all of them)."""
    return torch.cuda.device_count() if device.startswith("cuda") else (os.cpu_count() or 1)


def check_ranks(spec: ArchSpec, w: Workload) -> None:
    """Refuse before anything runs a world larger than the devices (CUDA devices, or CPU cores: one per rank);
    a CUDA device named by index (the ranks take devices 0..N−1); a ``tp`` case on a model it cannot split
    (:func:`harness.engine.tensor_parallel.check_split`). A machine without CUDA leaves a CUDA case to be skipped
    when it runs, as every CUDA case is."""
    if not spans_ranks(w):
        return
    if w.device.startswith("cuda") and ":" in w.device:
        raise BenchInputError(f"a case across ranks takes CUDA devices 0..{w.world_size - 1}: name device "
                              f"\"cuda\", not {w.device!r}", where="device")
    check_split(spec, w)
    if w.device.startswith("cuda") and not torch.cuda.is_available():
        return
    have = devices_available(w.device)
    if w.world_size > have:
        what = "CUDA devices" if w.device.startswith("cuda") else "CPU cores (one per rank)"
        raise BenchInputError(f"world_size {w.world_size} needs {w.world_size} {what}; this machine has {have}",
                              where="world_size")



def shares_batch(w: Workload) -> bool:
    """Whether the ranks step one batch together (TP: each holds a share of the model) rather than a batch each."""
    return w.parallel == "tp"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_note(w: Workload, threads: int) -> str:
    """What a CPU case's times mean: the ranks share the machine's cores."""
    return (f"{w.world_size} rank(s) ({w.parallel}, gloo) share this machine's {usable_cores()} CPU cores, "
            f"{threads} thread(s) each: times are for correctness, memory and communication bytes, not speed")


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill every rank still running and wait for each (none is left behind)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def launch(case: Case, opts: Any, budget_s: float) -> list[dict[str, Any]] | tuple[str, str]:
    """Start the case's ranks and wait: each rank's result (rank order), or ``(status, message)`` when one
    failed or the ranks ran past ``budget_s`` (every rank then stopped)."""
    w = case.workload
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        folder = Path(tmp)
        job = folder / "job.pkl"
        job.write_bytes(pickle.dumps({"case": case, "opts": opts, "port": free_port(), "timeout_s": budget_s,
                                      "parent": os.getpid()}))
        procs: list[subprocess.Popen] = []
        deadline = time.monotonic() + budget_s
        try:
            for r in range(w.world_size):
                with open(folder / f"rank{r}.log", "wb") as log:
                    procs.append(subprocess.Popen([sys.executable, "-m", "harness.engine.rank_worker", str(job),
                                                   str(r)], stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
            while True:
                codes = [p.poll() for p in procs]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    if None in codes and all((folder / f"rank{r}.err").exists() for r in failed):
                        time.sleep(CAUSE_WAIT_S)        # a rank dying may be why this one raised: let it show
                        codes = [p.poll() for p in procs]
                        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                    _stop(procs)
                    # a rank that died is the cause of the others' broken connections: it is named first
                    died = [r for r in failed if not (folder / f"rank{r}.err").exists()]
                    first = (died or failed)[0]
                    return _failure(folder, first, codes[first])
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    _stop(procs)
                    running = [r for r, c in enumerate(codes) if c is None]
                    return "timeout", (f"no result within {budget_s:g} s (rank(s) {running} still running, "
                                       "all stopped)")
                time.sleep(POLL_S)
        finally:
            _stop(procs)
        return [pickle.loads((folder / f"rank{r}.pkl").read_bytes()) for r in range(w.world_size)]


def _failure(folder: Path, rank: int, code: int) -> tuple[str, str]:
    """The case's status and message when ``rank`` ended with ``code``: its own reason when it raised, else how it
    died (with its last line of output)."""
    err = folder / f"rank{rank}.err"
    if err.exists():
        reason = pickle.loads(err.read_bytes())
        return ("oom" if reason["oom"] else "error"), f"rank {rank}: {reason['message']} (the other ranks stopped)"
    last = _tail(folder / f"rank{rank}.log")
    return "crashed", (f"rank {rank} {_death(code)}; the other ranks were stopped"
                       + (f" (its last output: {last})" if last else ""))


def run_ranked(case: Case, opts: Any, count: Count) -> CaseRecord:
    """Measure ``case`` across its ranks (see the module docstring); never raises for the case's own failure.
    ``opts``: the run's :class:`harness.engine.runner.RunOptions`; ``count``: the fake pass."""
    t0 = time.perf_counter()
    w = case.workload
    metrics: dict[str, float] = {}
    config: dict[str, Any] = {}
    try:
        load_plugin_files(opts.plugins)
        spec = registry.resolve(case.arch, **dict(case.overrides))
        config = asdict(spec.config)
        if w.device.startswith("cuda") and not torch.cuda.is_available():
            return case.record("skipped", "CUDA is not available on this machine", config=config,
                               duration_s=time.perf_counter() - t0)
        check_ranks(spec, w)
        gaps: dict[str, str] = {}
        t_count = time.perf_counter()
        metrics.update(count(spec, w, torch.device("cpu") if w.device == "cpu" else torch.device("cuda"),
                             "flops" in case.metrics, gaps))
        metrics.pop("est_peak_bytes", None)      # one process's estimate: the fake pass knows no sharding
        metrics[metric_name("count")] = time.perf_counter() - t_count
        budget = opts.timeout_s - min(TIMEOUT_MARGIN_S, 0.1 * opts.timeout_s) - (time.perf_counter() - t0)
        ranks = launch(case, opts, budget)
    except Exception as exc:  # noqa: BLE001 — a case's failure is a result, the sweep goes on
        text = str(exc).strip()
        return case.record("error", f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", config=config,
                           metrics=metrics, duration_s=time.perf_counter() - t0)
    if isinstance(ranks, tuple):
        status, message = ranks
        return case.record(status, message, config=config, metrics=metrics, duration_s=time.perf_counter() - t0)
    samples, rounds = fold(ranks, metrics, w, opts.timing.rounds)
    metrics[metric_name("timed")] = sum(samples)          # the rest of the case: starting the ranks, build, checks
    note = cpu_note(w, ranks[0]["threads"]) if w.device == "cpu" else ""
    if "latency" in case.metrics:
        extra, why = peaks.rates(w, metrics["median_ms"] / 1e3, metrics.get("model_flops"), metrics.get("flops"),
                                    peaks.device_name(w.device if w.device == "cpu" else "cuda:0"))
        batches = 1 if shares_batch(w) else w.world_size       # TP: one batch for all ranks; else one per rank
        for name in ("samples_per_s", "tokens_per_s"):
            if name in extra:
                extra[name] *= batches
                metrics[f"{name}_per_rank"] = extra[name] / w.world_size
        metrics.update(extra)
        if "output_tokens_per_s" in metrics:                  # a generation's (the slowest rank's figures)
            metrics["output_tokens_per_s_per_rank"] = metrics["output_tokens_per_s"] / w.world_size
        metrics["throughput_per_s"] = batches * w.batch_size / (metrics["median_ms"] / 1e3)
        metrics["comm_share"] = metrics["comm_ms"] / metrics["median_ms"]
        note = "; ".join(x for x in (note, why) if x)
    return case.record("ok", note, config=config, metrics=metrics, samples_s=samples, rounds=rounds,
                       duration_s=time.perf_counter() - t0)


def fold(ranks: list[dict[str, Any]], metrics: dict[str, float], w: Workload, n_rounds: int
         ) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Fold the ranks' results into ``metrics`` (see the module docstring); returns the step's samples (each the
    largest rank's) and their rounds."""
    metrics["threads"] = float(ranks[0]["threads"])
    for name in ranks[0]["errors"]:
        metrics[name] = max(r["errors"][name] for r in ranks)
    if "flops" in metrics and not shares_batch(w):
        metrics["flops_all_ranks"] = metrics["flops"] * w.world_size
    payload: Payload = ranks[0]["payload"]
    metrics["comm_payload_bytes"] = float(payload.total)
    metrics["comm_bytes_per_rank"] = float(payload.sent_per_rank(w.world_size))
    counted: Payload = max((r["counted"] for r in ranks), key=lambda p: p.total)    # the largest rank's (equal here)
    metrics["comm_counted_bytes"] = float(counted.total)
    metrics["comm_counted_bytes_per_rank"] = float(counted.sent_per_rank(w.world_size))
    metrics["comm_calls"] = float(ranks[0]["comm_calls"])
    metrics["comm_ms"] = max(r["comm_s"] for r in ranks) * 1e3
    samples: tuple[float, ...] = ()
    rounds: tuple[int, ...] = ()
    if all("timing" in r for r in ranks):
        timings = [r["timing"] for r in ranks]
        n = min(len(t.samples_s) for t in timings)        # equal by construction (rank 0 decides for all)
        samples = tuple(max(t.samples_s[i] for t in timings) for i in range(n))
        rounds = consecutive_rounds(n, n_rounds)
        metrics.update(summarize_rounds(samples, rounds))
        metrics["cold_ms"] = max(t.cold_s for t in timings) * 1e3
        metrics["n_processes"] = 1.0          # one launch of the ranks
        for r, t in enumerate(timings):
            metrics[f"rank{r}_median_ms"] = statistics.median(t.samples_s) * 1e3
        slowest = max(range(len(ranks)), key=lambda r: metrics[f"rank{r}_median_ms"])
        metrics.update(ranks[slowest].get("figures", {}))    # a generation's TTFT, TPOT, ...: the slowest rank's
    if all("memory" in r for r in ranks):
        for name, short in KINDS:
            values = [r["memory"].get(name) for r in ranks]
            if any(v is None for v in values):
                continue
            for r, v in enumerate(values):
                metrics[f"rank{r}_{short}"] = float(v)
            metrics[name] = float(max(values))            # the largest rank's, never a sum
    return samples, rounds
