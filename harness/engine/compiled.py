"""Compiled execution (the workload's ``compile``): build the compiled model, and warm it up apart from timing.

``compile`` means:

* ``"none"`` — eager, the model itself.
* ``"default"`` / ``"max-autotune"`` — ``torch.compile(model, mode=...)`` (inductor). On CUDA, PyTorch's
  ``max-autotune`` also replays CUDA graphs; on the CPU it tunes the GEMM templates.
* ``"cudagraphs"`` (CUDA only, refused in ``Workload.__post_init__``) — ``torch.compile(mode="reduce-overhead")``:
  inductor's fused kernels, replayed as CUDA graphs (CUDA graph trees). Chosen over ``backend="cudagraphs"``
  (AOTAutograd graphs of the unfused eager kernels, captured) because it is what PyTorch offers users as its
  CUDA-graph mode, what the H100 evidence measured (item 8: 7–14x eager at batch 1), and the rung above
  "default" on one ladder: default = fused kernels, cudagraphs = fused kernels without per-kernel launches.

Every mode compiles with ``dynamic=False`` (no automatic dynamic shapes: a case measures kernels compiled for
its own sizes), with one exception, the batch: **a model is compiled once for all its batches**
(:func:`mark_batch_dynamic`). Before the first call the inputs' batch dimension is marked
``torch._dynamo.maybe_mark_dynamic`` (batch > 1; dynamo specialises a batch of 1 anyway), so a batch sweep of one
model compiles one graph generic in the batch — its first batch the size hint — plus one for batch 1 if swept,
instead of one graph per batch; every other size stays static. The batch is marked in every compiled case, alone
or in a sweep, so what a case measures does not depend on the cases before it (only the hint does). The compiled
wrapper is kept with the worker's kept model (:meth:`harness.engine.models.ModelCache.compiled`) and reused by the next
case that differs only in the batch: that case's warm-up finds the graph and compiles nothing (its ``compile_s``
is the guard check, near 0). The compile cache is process-wide: when no model this module compiled is still
alive, :func:`compile_model` clears dynamo's state (``torch._dynamo.reset()``), so a case with other sizes, dtype,
mode or model compiles from scratch as a user's first call would (inductor's on-disk FX graph cache still serves
repeated graphs); models of an interleaved group, alive side by side, share it. Dynamo's ``recompile_limit`` (8
per code object) is kept, but reaching it raises instead of silently running eager.

The counted MACs are the eager model's: the fake pass (harness.engine.runner.fake_pass) never sees the compiled one.
"""
from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable

import torch
from torch import nn

from harness.contract.errors import BenchInputError
from harness.contract.spec import COMPILES, Workload

# The workload's compile value -> torch.compile's mode.
TORCH_MODES: dict[str, str] = {"default": "default", "max-autotune": "max-autotune", "cudagraphs": "reduce-overhead"}
MAX_WARM_UP_CALLS = 8      # a step still compiling after this many calls recompiles on every call: an error

_alive: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()   # compiled models not yet freed (this process)


def uses_cuda_graphs(compile: str, device: torch.device | str) -> bool:
    """Whether ``compile`` replays CUDA graphs on ``device`` (then a step is steady only from its third call:
    CUDA graph trees warm up on the first, record on the second, replay from the third)."""
    return torch.device(device).type == "cuda" and compile in ("cudagraphs", "max-autotune")


def compile_model(model: nn.Module, compile: str, mode: str) -> nn.Module:
    """``model`` compiled as ``compile`` says (``"none"``: ``model`` itself), put in the train/eval state of
    ``mode`` ("fwd": eval, "fwd_bwd": train) first, since dynamo specialises on it. Compiles nothing yet:
    torch.compile compiles on the first call (see :func:`warm_up_compiled`)."""
    if compile not in COMPILES:
        raise BenchInputError(f"unknown compile {compile!r}; expected one of {list(COMPILES)}", where="compile")
    model.train(mode in ("fwd_bwd", "train_step"))
    if compile == "none":
        return model
    torch._dynamo.config.fail_on_recompile_limit_hit = True    # never fall back to eager without a word
    if not len(_alive):
        torch._dynamo.reset()          # nothing compiled is alive: this case starts from a clean cache
    compiled = torch.compile(model, mode=TORCH_MODES[compile], dynamic=False)
    _alive.add(compiled)
    return compiled


def mark_batch_dynamic(inputs: tuple, batch_size: int) -> int:
    """Mark dimension 0 of each input tensor whose first dimension is ``batch_size`` as dynamic for dynamo
    (``torch._dynamo.maybe_mark_dynamic``: a hint, never an error if the model specialises it), so one compiled
    graph serves every batch > 1 of the model. Nothing for batch 1 (dynamo specialises sizes 0 and 1). Returns
    how many tensors were marked."""
    if batch_size <= 1:
        return 0
    marked = 0
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch_size:
            torch._dynamo.maybe_mark_dynamic(x, 0)
            marked += 1
    return marked


def compiled_key(w: Workload) -> tuple:
    """What a compiled wrapper is reused across (with the same model object): the workload but its batch — the
    compile value, the mode (train/eval), the dtype and every other size, which a static graph specialises on."""
    return (w.compile, w.mode, dataclasses.replace(w, batch_size=1))


def captured_graphs() -> int:
    """Graphs dynamo has captured so far in this process (a compiled case records how many its warm-up added as
    ``compile_graphs``: 0 when an earlier batch's graph served it)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _compile_events() -> int:
    """Graphs dynamo captured plus graphs inductor compiled or loaded, so far in this process."""
    from torch._dynamo.utils import counters
    inductor = counters["inductor"]
    return (counters["stats"]["unique_graphs"] + inductor["fxgraph_cache_hit"] + inductor["fxgraph_cache_miss"]
            + inductor["fxgraph_cache_bypass"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up_compiled(step: Callable[[], object], device: torch.device | str, compile: str) -> float:
    """Run ``step`` until the compiled step is steady and return the seconds that took (``compile_s``): the
    calls that compile (forward on the first call; with fwd_bwd the backward on the first backward) and, with
    CUDA graphs, warm up and record; not the call that shows the step steady (it compiled nothing and comes
    after the minimum: 2 calls, 3 with CUDA graphs). 0.0 for ``"none"`` (nothing run). Raises RuntimeError if
    the step still compiles after MAX_WARM_UP_CALLS calls."""
    if compile == "none":
        return 0.0
    device = torch.device(device)
    need = 3 if uses_cuda_graphs(compile, device) else 2
    spent = 0.0
    for calls in range(1, MAX_WARM_UP_CALLS + 1):
        before = _compile_events()
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        took = time.perf_counter() - t0
        if calls >= need and _compile_events() == before:
            return spent
        spent += took
    raise RuntimeError(f"compile={compile}: the step still compiles after {MAX_WARM_UP_CALLS} calls "
                       "(a guard fails on every call); it has no steady state to time")
