"""The training step (``mode = "train_step"``): forward, a loss on synthetic targets, backward, optimizer step,
gradients zeroed — what a trainer's loop does once per batch, built once per case and timed like any step.

The loss follows the model's output (:func:`loss_kind`):

* ``next_token`` — logits ``(B, T, V)`` and an integer input of shape ``(B, T)`` (a language model; for an
  encoder-decoder the last such input, the decoder's tokens): cross-entropy of the logits at positions
  ``0..T-2`` against the tokens at ``1..T-1`` (the targets are the input shifted by one, as nanoGPT trains).
* ``classification`` — logits ``(B, C)`` with ``C > 1`` (vision models, encoders with a class head):
  cross-entropy against the fixed labels ``arange(B) % C``.
* ``mse`` — any other output (a layer's ``(B, T, d)``, a single score): mean squared error against a fixed
  target of zeros of the output's shape, so every output still drives a backward.

Targets are made on the first call (the output's shape is known then) and kept: a case's steps all see the
same batch and labels. The optimizer is built once per case: ``adamw`` (``torch.optim.AdamW``, lr 1e-3: two
state tensors of the parameter's dtype per parameter plus a 4-byte ``step`` scalar per parameter tensor) or
``sgd`` (``torch.optim.SGD``, lr 1e-2, no momentum: no state). ``amp`` runs the forward and the loss under
``torch.autocast`` in bf16 or fp16 over fp32 master weights (the workload's dtype stays fp32); fp16 adds a
``torch.amp.GradScaler`` (CUDA only, refused elsewhere by the Workload). ``checkpointing = "block"``
recomputes each block's activations in the backward (:mod:`harness.engine.checkpointing`, applied to the built
model from outside, never inside a model's code).

Memory by kind (:func:`analytic_memory`, :func:`measured_memory`): weights, gradients and optimizer state are
static, known from the parameter count, the dtype and the optimizer; activations are what autograd keeps from
the forward for the backward, measured (CPU: the live-tensor tracker; CUDA: the allocator).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from harness.instruments import memory
from harness.contract.errors import BenchInputError
from harness.contract.spec import ArchSpec, Workload
from harness.engine.checkpointing import block_lists
from harness.engine.compiled import mark_batch_dynamic
from harness.engine.peaks import device_name, rates
from harness.engine.steps import Count, Step
from harness.instruments.outputs import first_tensor
from harness.instruments.timing import TimingResult

__all__ = [
    "AMP_DTYPES",
    "TrainStep",
    "analytic_memory",
    "check_trainable",
    "loss_kind",
    "make_optimizer",
    "make_train_step",
    "optimizer_state_bytes",
]

AMP_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LEARNING_RATES: dict[str, float] = {"adamw": 1e-3, "sgd": 1e-2}
ADAMW_STATE_TENSORS = 2        # exp_avg and exp_avg_sq, each of the parameter's shape and dtype
ADAMW_STEP_BYTES = 4           # the per-parameter-tensor ``step`` counter: a float32 scalar tensor


_shapes: dict[tuple[str, str], tuple[bool, bool]] = {}   # (arch, config) -> (trainable, has blocks)


def check_trainable(spec: ArchSpec, w: Workload) -> None:
    """Refuse, before anything runs, a training step that cannot be: a model with no trainable parameter, or
    checkpointing of a model without blocks. The model is built on the meta device (no memory; once per
    architecture and config); one that cannot be built there is left to the run."""
    if w.mode != "train_step":
        return
    arch = spec.name
    key = (arch, repr(spec.config))
    if key not in _shapes:
        try:
            with torch.device("meta"):
                model = spec.build(spec.config)
        except Exception:  # noqa: BLE001 — a model that needs real tensors to build is checked when it runs
            return
        _shapes[key] = (any(p.requires_grad for p in model.parameters()), bool(block_lists(model)))
    trainable, has_blocks = _shapes[key]
    if not trainable:
        raise BenchInputError(f"mode \"train_step\" needs trainable parameters; {arch} has none", where="mode")
    if w.checkpointing != "none" and not has_blocks:
        raise BenchInputError(f"checkpointing = {w.checkpointing!r} needs blocks in an nn.ModuleList; {arch} "
                              "has none", where="checkpointing")


# -- loss and optimizer ----------------------------------------------------------------------------------------
def loss_kind(out: torch.Tensor, inputs: tuple) -> tuple[str, int]:
    """``("next_token", i)`` (``i``: the index of the token input), ``("classification", -1)`` or ``("mse", -1)``
    for a model output ``out`` on ``inputs`` (see the module docstring)."""
    if out.dim() == 3 and out.is_floating_point():
        for i in reversed(range(len(inputs))):
            x = inputs[i]
            if isinstance(x, torch.Tensor) and not x.is_floating_point() and tuple(x.shape) == tuple(out.shape[:2]) \
                    and out.shape[1] > 1:
                return "next_token", i
    if out.dim() == 2 and out.shape[1] > 1 and out.is_floating_point():
        return "classification", -1
    return "mse", -1


def make_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The workload's optimizer over ``params``: AdamW (lr 1e-3) or plain SGD (lr 1e-2, no momentum)."""
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATES["adamw"])
    if name == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATES["sgd"], momentum=0.0)
    raise BenchInputError(f"unknown optimizer {name!r}; expected adamw or sgd", where="optimizer")


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors the optimizer holds as state now (AdamW: after its first step); of a sharded
    parameter's state (FSDP) the rank's own shard (:func:`harness.instruments.memory.tensor_bytes`)."""
    return memory.tensor_bytes([v for state in optimizer.state.values() for v in state.values()
                                if isinstance(v, torch.Tensor)])


@dataclass
class TrainStep(Step):
    """One case's training step, callable; its parts (:meth:`forward_loss`, :meth:`backward`, :meth:`update`)
    are what the memory pass measures one by one. ``model`` is what is called (a compiled wrapper or the model);
    ``params`` its trainable parameters."""

    model: nn.Module
    inputs: tuple
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    device_type: str
    amp_dtype: torch.dtype | None = None
    scaler: Any = None                      # torch.amp.GradScaler with amp fp16
    compiled: bool = False
    kind: str = ""                          # the loss (loss_kind), known after the first call
    targets: torch.Tensor | None = None
    token_input: int = -1
    steps: int = field(default=0)

    mode: ClassVar[str] = "train_step"

    @classmethod
    def for_workload(cls, model: nn.Module, inputs: tuple, w: Workload) -> TrainStep:
        return make_train_step(model, inputs, w)

    def compile(self, w: Workload, wrap: Callable[[nn.Module], nn.Module]) -> TrainStep:
        """The step calling ``wrap(model)`` (the same parameters), sharing this step's optimizer; the inputs' batch
        dimension marked dynamic first (:func:`harness.engine.compiled.mark_batch_dynamic`)."""
        mark_batch_dynamic(self.inputs, w.batch_size)
        return make_train_step(self.model, self.inputs, w, compiled=wrap(self.model), optimizer=self.optimizer)

    def counts(self, w: Workload, count: Count | None) -> dict[str, float]:
        """The static memory by kind, from the parameters (:func:`analytic_memory`)."""
        return analytic_memory(self.params, w.optimizer)

    @classmethod
    def flop_figures(cls, w: Workload, counted: Mapping[str, float],
                     flops_of: Callable[[Workload], float]) -> dict[str, float]:
        """A training step's FLOPs beside the counted ``flops`` (the step as run: forward, loss, backward,
        optimizer; with checkpointing the recomputed forwards too): ``model_flops`` — the same step without
        checkpointing (``flops_of`` counts it again on fake tensors), what MFU divides — and the 6·N·D rule as
        ``est_6nd_flops`` (N: trainable parameters, D: tokens of the step), an estimate labelled so."""
        out: dict[str, float] = {"model_flops": counted["flops"]}
        if w.checkpointing != "none":
            out["model_flops"] = flops_of(dataclasses.replace(w, checkpointing="none"))
        if w.seq_len:
            out["est_6nd_flops"] = 6.0 * counted["params"] * w.batch_size * w.seq_len
        return out

    def _loss(self, out: torch.Tensor) -> torch.Tensor:
        if self.targets is None:            # the first call: targets from the output's kind, made once
            self.kind, self.token_input = loss_kind(out, self.inputs)
            if self.kind == "next_token":
                self.targets = self.inputs[self.token_input][:, 1:].contiguous()          # (B, T-1)
            elif self.kind == "classification":
                self.targets = torch.arange(out.shape[0], device=out.device) % out.shape[1]   # (B,)
            else:
                self.targets = torch.zeros(out.shape, dtype=out.dtype, device=out.device)
        if self.kind == "next_token":
            logits = out[:, :-1]                                                       # (B, T-1, V)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
        if self.kind == "classification":
            return F.cross_entropy(out, self.targets)
        return F.mse_loss(out, self.targets.to(out.dtype))

    def forward_loss(self) -> torch.Tensor:
        """Forward and loss (under autocast with amp)."""
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        if self.amp_dtype is None:
            return self._loss(first_tensor(self.model(*self.inputs)))
        with torch.autocast(self.device_type, dtype=self.amp_dtype):
            return self._loss(first_tensor(self.model(*self.inputs)))

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def update(self) -> None:
        """Optimizer step (through the grad scaler with fp16) and gradients zeroed (set to None)."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1

    def __call__(self) -> None:
        self.backward(self.forward_loss())
        self.update()

    def figures(self, timed: TimingResult, w: Workload, metrics: Mapping[str, float]) -> tuple[dict[str, float], str]:
        """The step's rates (:func:`harness.engine.peaks.rates`) from the timed median, with MFU/HFU where the device's peak is known."""
        return rates(w, metrics["median_ms"] / 1e3, metrics.get("model_flops"), metrics.get("flops"),
                     device_name(w.device))

    def memory(self, static_before: int, device: torch.device) -> dict[str, float]:
        """The memory pass part by part (:func:`measure_memory`)."""
        return measure_memory(self, static_before, device)


def make_train_step(model: nn.Module, inputs: tuple, w: Workload, compiled: nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None) -> TrainStep:
    """The training step of ``model`` on ``inputs`` for workload ``w`` (mode "train_step"); it calls
    ``compiled`` when given (``model`` compiled: the same parameters). ``optimizer``: reuse one built for this
    case (a compiled case's eager and compiled steps share theirs), else a new one. Puts the model in train mode.
    Raises BenchInputError when the model has no trainable parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BenchInputError(f"mode \"train_step\" needs trainable parameters; {type(model).__name__} has none",
                              where="mode")
    model.train()
    device_type = next(iter(params)).device.type
    scaler = torch.amp.GradScaler(device_type) if w.amp == "fp16" else None
    return TrainStep(compiled if compiled is not None else model, inputs, params,
                     optimizer or make_optimizer(w.optimizer, params), device_type, AMP_DTYPES[w.amp], scaler,
                     compiled=compiled is not None)


# -- memory by kind ----------------------------------------------------------------------------------------------
def analytic_memory(params: Iterable[nn.Parameter], optimizer: str) -> dict[str, float]:
    """The static memory of a training step from the parameters alone: ``weight_bytes`` (numel × element size
    of the parameters' own dtype: fp32 master weights under amp), ``grad_bytes`` (the same: a gradient has its
    parameter's dtype), ``optimizer_state_bytes`` (AdamW: 2 × numel × element size + 4 bytes of ``step`` per
    parameter tensor, i.e. 8 bytes per fp32 parameter; SGD without momentum: 0) and their sum
    ``static_train_bytes``. Shared parameters count once."""
    unique = {id(p): p for p in params}.values()
    weights = sum(p.numel() * p.element_size() for p in unique)
    state = ADAMW_STATE_TENSORS * weights + ADAMW_STEP_BYTES * len(unique) if optimizer == "adamw" else 0
    return {"weight_bytes": float(weights), "grad_bytes": float(weights), "optimizer_state_bytes": float(state),
            "static_train_bytes": float(2 * weights + state)}


def grad_bytes(params: Iterable[nn.Parameter]) -> int:
    """Bytes of the gradients the parameters hold now (shared storages once: DDP's gradient buckets; of a sharded
    gradient, FSDP's, the rank's own shard)."""
    return memory.tensor_bytes([p.grad for p in params if p.grad is not None])


def measure_memory(step: TrainStep, static_before: int, device: torch.device) -> dict[str, float]:
    """One training step measured part by part (separate from timing), after a first step when none ran yet (so
    the optimizer's state exists, as in a trainer's steady state):

    * ``measured_weight_bytes`` / ``measured_grad_bytes`` / ``measured_optimizer_state_bytes`` — the nbytes of
      the parameters, of their ``.grad`` after the backward, of the optimizer's state tensors;
    * ``activation_bytes`` — what the forward and loss leave alive for the backward (CPU: the live-tensor
      tracker's count at the loss; CUDA: the allocator's growth over the forward);
    * ``activation_peak_bytes`` — the step's peak above what was alive before it (activations, gradients and
      temporaries); ``peak_bytes`` — that plus ``static_before`` (weights, optimizer state, inputs, targets) on
      the CPU, the allocator's peak on CUDA (``cuda_max_allocated_bytes``, ``cuda_max_reserved_bytes`` too).
    """
    if step.steps == 0:
        step()
    out: dict[str, float] = {}
    params = step.params
    out["measured_weight_bytes"] = float(memory.tensor_bytes(params))
    out["measured_optimizer_state_bytes"] = float(optimizer_state_bytes(step.optimizer))
    static = static_before + out["measured_optimizer_state_bytes"] + (
        memory.tensor_bytes(step.targets) if step.targets is not None else 0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        loss = step.forward_loss()
        torch.cuda.synchronize(device)
        out["activation_bytes"] = float(torch.cuda.memory_allocated(device) - before)
        step.backward(loss)
        del loss
        out["measured_grad_bytes"] = float(grad_bytes(params))
        step.update()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        out.update(cuda_max_allocated_bytes=float(peak), cuda_allocated_before_bytes=float(before),
                   cuda_max_reserved_bytes=float(torch.cuda.max_memory_reserved(device)),
                   activation_peak_bytes=float(peak - before), peak_bytes=float(peak))
        return out
    tracked = memory.LiveTensorTracker()
    with tracked:
        loss = step.forward_loss()
        out["activation_bytes"] = float(tracked.current_bytes)
        step.backward(loss)
        del loss
        out["measured_grad_bytes"] = float(grad_bytes(params))
        step.update()
    out["activation_peak_bytes"] = float(tracked.peak_bytes)
    out["peak_bytes"] = float(static + tracked.peak_bytes)
    return out
