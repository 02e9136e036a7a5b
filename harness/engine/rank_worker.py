"""One rank of a multi-rank case: ``python -m harness.engine.rank_worker JOB RANK`` (started by
:func:`harness.engine.ranks.run_ranked`, never by hand).

The rank pins its threads (and, where the machine has the cores, its CPU set) so that N ranks do not oversubscribe
the machine, joins the process group on the loopback address, builds the model (:func:`harness.engine.models.materialize`,
the same seeded weights on every rank), then, by the case's ``parallel``:

* ``ddp``/``fsdp`` (:func:`train_rank`): its own batch, the model wrapped (:func:`harness.engine.distributed.wrap`),
  one step's gradients checked against one process's (a mismatch ends the case as an error);
* ``tp`` (:func:`split_rank`): the batch every rank shares, the model split (:mod:`harness.engine.tensor_parallel`),
  its logits checked against the whole model's;

then counts the bytes of one step's collectives (:func:`harness.engine.distributed.counting`), times the step
(:func:`harness.instruments.timing.measure`, the ranks agreeing on every call:
:func:`harness.engine.distributed.agreement`), measures its memory by kind (``Step.memory``) and replays the counted
collectives alone, and writes what it found to ``rank<R>.pkl`` in the job's folder — or, when it fails, the
one-line reason to ``rank<R>.err`` and exits 3.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.contract import registry
from harness.contract.plugins import load_files as load_plugin_files
from harness.contract.spec import ArchSpec, Case, Workload
from harness.engine import distributed, tensor_parallel, training
from harness.engine.env import die_with_parent, usable_cores
from harness.engine.measure import static_bytes
from harness.engine.models import materialize
from harness.engine.modes import step_class
from harness.engine.runner import RunOptions, is_oom
from harness.engine.steps import cast_inputs
from harness.instruments.torch_types import torch_dtype
from harness.instruments import memory
from harness.instruments.timing import measure

EXIT_FAILED = 3          # the rank raised: its reason is in rank<R>.err
INPUT_SEED = 1000        # rank r's batch is drawn after torch.manual_seed(INPUT_SEED + r)
FORWARD_SEED = 2000      # and its checked forward (dropout) runs after torch.manual_seed(FORWARD_SEED + r)


class GradientMismatch(RuntimeError):
    """The ranks' gradients are not one process's on the same batches: the case is wrong, not slow."""


def rank_threads(w: Workload) -> int:
    """Threads per rank: the workload's ``threads``, else this machine's usable cores split evenly (at least 1)."""
    return w.threads or max(1, usable_cores() // w.world_size)


def pin(rank: int, w: Workload) -> int:
    """Set this rank's torch threads and, where the CPU set has a core per thread of every rank, its own disjoint
    cores. Returns the thread count."""
    threads = rank_threads(w)
    torch.set_num_threads(threads)
    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= threads * w.world_size:
            os.sched_setaffinity(0, cores[rank * threads:(rank + 1) * threads])
    return threads


def rank_device(w: Workload, rank: int) -> torch.device:
    """Rank r's device: the CPU, or CUDA device r."""
    return torch.device("cuda", rank) if w.device.startswith("cuda") else torch.device("cpu")


def rank_inputs(spec: ArchSpec, w: Workload, device: torch.device, rank: int) -> tuple:
    """Rank ``rank``'s batch (``w.batch_size`` items), the same wherever it is made."""
    torch.manual_seed(INPUT_SEED + rank)
    return cast_inputs(spec.make_inputs(spec.config, w, device), torch_dtype(w))


def one_process_grads(spec: ArchSpec, w: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """One process's gradients on every rank's batch: the mean of the ranks' losses, on the model as materialize
    builds it (the ranks' weights)."""
    ref = materialize(spec, w, device)
    for r in range(w.world_size):
        step = training.make_train_step(ref, rank_inputs(spec, w, device, r), w)
        torch.manual_seed(FORWARD_SEED + r)
        (step.forward_loss() / w.world_size).backward()
    return {n: p.grad for n, p in ref.named_parameters() if p.requires_grad and p.grad is not None}


def run_rank(case: Case, opts: RunOptions, rank: int, port: int, timeout_s: float) -> dict[str, Any]:
    """The rank's part of ``case`` (see the module docstring), as plain data."""
    w = case.workload
    threads = pin(rank, w)
    device = rank_device(w, rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=w.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    load_plugin_files(opts.plugins)
    spec = registry.resolve(case.arch, **dict(case.overrides))
    part = split_rank if w.parallel == "tp" else train_rank
    out = {"rank": rank, "threads": threads, **part(spec, case, opts, rank, device)}
    dist.barrier()
    return out


def train_rank(spec: ArchSpec, case: Case, opts: RunOptions, rank: int, device: torch.device) -> dict[str, Any]:
    """DDP or FSDP: a training step on the rank's own batch, its gradients checked against one process's."""
    w = case.workload
    inputs = rank_inputs(spec, w, device, rank)
    model = materialize(spec, w, device)
    step = training.make_train_step(distributed.wrap(model, w.parallel, device), inputs, w)
    payload = distributed.comm_payload(model, w.parallel)
    # correctness first: one step's gradients against one process's on every rank's batch
    torch.manual_seed(FORWARD_SEED + rank)
    step.backward(step.forward_loss())
    err = distributed.rank0_error(distributed.gathered_grads(model),
                                  lambda: one_process_grads(spec, w, device), device)
    step.update()
    tolerance = distributed.GRAD_TOLERANCE[w.amp if w.amp != "none" else w.dtype]
    if not err <= tolerance:
        raise GradientMismatch(f"{w.parallel} gradients on {w.world_size} ranks differ from one process's on the "
                               f"same batches: largest relative difference {err:.3g} > {tolerance:g}")
    out: dict[str, Any] = {"errors": {"grad_max_rel_err": err}, "payload": payload}
    with distributed.counting() as counted:        # one whole step: forward, backward, update
        step()
    if "latency" in case.metrics:
        out["timing"] = measure(step, opts.timing, device, agree=distributed.agreement(device))
    if "memory" in case.metrics:
        held = memory.tensor_bytes(model) + memory.tensor_bytes([x for x in inputs if isinstance(x, torch.Tensor)])
        if w.parallel == "ddp":      # DDP's all-reduce buckets stay allocated between steps (gradients view them)
            held += payload.all_reduce
        out["memory"] = step.memory(held, device)
    return {**out, **_communication(counted, device)}


def split_rank(spec: ArchSpec, case: Case, opts: RunOptions, rank: int, device: torch.device) -> dict[str, Any]:
    """TP: the model's heads and MLP width split over the ranks, a forward or a generation of the batch they all
    share, its logits checked against the whole model's on rank 0."""
    w = case.workload
    tensor_parallel.check_split(spec, w)
    kind = step_class(w.mode)
    torch.manual_seed(INPUT_SEED)                   # one batch, the same on every rank
    inputs = cast_inputs(spec.make_inputs(spec.config, kind.inputs_workload(w), device), torch_dtype(w))
    model = materialize(spec, w, device)
    want = tensor_parallel.outputs(model, inputs, w) if rank == 0 else {}     # the whole model's, before the split
    tensor_parallel.split(model, rank, w.world_size)
    err = distributed.rank0_error(tensor_parallel.outputs(model, inputs, w), lambda: want, device)
    del want
    tolerance = tensor_parallel.LOGIT_TOLERANCE[w.dtype]
    if not err <= tolerance:
        raise tensor_parallel.LogitMismatch(f"tp logits on {w.world_size} ranks differ from one process's on the "
                                            f"same batch: largest relative difference {err:.3g} > {tolerance:g}")
    step = kind.for_workload(model, inputs, w)
    out: dict[str, Any] = {"errors": {"logit_max_rel_err": err}, "payload": tensor_parallel.payload(spec.config, w)}
    with distributed.counting() as counted:
        step()
    if "latency" in case.metrics:
        timing = measure(step, opts.timing, device, agree=distributed.agreement(device))
        out["timing"] = timing
        out["figures"] = step.figures(timing, w, {})[0]          # a generation's TTFT, TPOT, ...: this rank's
    if "memory" in case.metrics:
        weights = sum(p.nbytes for p in model.parameters())
        out["memory"] = {**step.memory(static_bytes(model, inputs), device),
                         "measured_weight_bytes": float(weights)}
    return {**out, **_communication(counted, device)}


def _communication(counted: distributed.Counted, device: torch.device) -> dict[str, Any]:
    """The step's collectives as counted, and replayed alone (``comm_s``)."""
    return {"counted": counted.payload(), "comm_calls": len(counted.calls),
            "comm_s": distributed.time_calls(counted.calls, device)}


def main(job_path: str, rank: int) -> None:
    die_with_parent()
    job = pickle.loads(Path(job_path).read_bytes())
    if os.getppid() != job["parent"]:     # the parent died while this rank was starting: nothing to report to
        os._exit(EXIT_FAILED)
    folder = Path(job_path).parent
    try:
        result = run_rank(job["case"], job["opts"], rank, job["port"], job["timeout_s"])
    except BaseException as exc:  # noqa: BLE001 — the launcher turns the reason into the case's record
        text = str(exc).strip()
        reason = {"message": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", "oom": is_oom(exc)}
        (folder / f"rank{rank}.err").write_bytes(pickle.dumps(reason))
        os._exit(EXIT_FAILED)        # a failed rank's process group cannot be torn down politely
    tmp = folder / f"rank{rank}.tmp"
    tmp.write_bytes(pickle.dumps(result))
    tmp.rename(folder / f"rank{rank}.pkl")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
