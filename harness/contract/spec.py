"""The contract, as plain data: ArchSpec, Workload, Case, and the one check of a workload against an architecture
(:func:`workload_overrides`). Torch-free: the reports, the claims and the suite loader read these facts without
importing torch (the instruments map names to torch types: :mod:`harness.instruments.torch_types`). What a case produces is a
:class:`harness.contract.records.CaseRecord`."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.contract.errors import BenchInputError
from harness.contract.quoted import Quoted
from harness.contract.records import CaseRecord, Status

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
"""The numeric types a workload may name, with their bytes per element (torch types: harness.instruments.torch_types)."""
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
# "generate": a greedy generation of new_tokens after a prompt of prompt_len (harness.engine.generation);
# "train_step": forward, loss, backward, optimizer step (harness.engine.training)
MODES: tuple[str, ...] = ("fwd", "fwd_bwd", "generate", "train_step")
GENERATION_KEYS: tuple[str, ...] = ("prompt_len", "new_tokens")   # the fields of mode "generate" (and only of it)
GENERATION_PROTOCOL: tuple[str, ...] = ("generation_state", "prefill", "decode")
"""The methods a model class has when it can generate (harness.engine.generation)."""
METRICS: tuple[str, ...] = ("latency", "memory", "flops")
# How a case's model runs (harness.engine.compiled): eager, or torch.compile with one of its modes; "cudagraphs" is
# CUDA-only (torch.compile mode="reduce-overhead": inductor kernels replayed as CUDA graphs).
COMPILES: tuple[str, ...] = ("none", "default", "max-autotune", "cudagraphs")
CUDA_ONLY_COMPILES: frozenset[str] = frozenset({"cudagraphs"})
# A training step (mode "train_step", harness.engine.training): its optimizer, mixed precision and activation
# checkpointing. Each is refused in any other mode unless at its default.
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd")
AMPS: tuple[str, ...] = ("none", "bf16", "fp16")     # autocast dtype; "fp16" adds a GradScaler (CUDA only)
CHECKPOINTINGS: tuple[str, ...] = ("none", "block")  # "block": each block of the model's main ModuleList
# One case across ``world_size`` ranks (harness.engine.ranks): "ddp" (DistributedDataParallel) and "fsdp" (FSDP2
# fully_shard) time a training step, each rank on its own batch of ``batch_size``; "tp" (tensor parallelism: a
# decoder's heads and MLP width split over the ranks) times a forward or a generation of one batch shared by the
# ranks; "none": one process.
PARALLELS: tuple[str, ...] = ("none", "ddp", "fsdp", "tp")
PARALLEL_MODES: dict[str, tuple[str, ...]] = {"ddp": ("train_step",), "fsdp": ("train_step",),
                                              "tp": ("fwd", "generate")}


@dataclass(frozen=True)
class Workload:
    """What a model is run on: sizes, numeric type, pass, device, CPU threads and execution (eager/compiled).

    ``mode = "generate"`` (harness.engine.generation) times whole greedy generations: ``prompt_len`` tokens prefilled,
    then ``new_tokens`` produced; it takes those two fields instead of ``seq_len``, and no other mode takes them.
    """

    batch_size: int = 1
    seq_len: int | None = None
    img_size: int | None = None
    dtype: str = "fp32"
    mode: str = "fwd"
    device: str = "cpu"
    threads: int = 0  # 0: the harness default (every core this process may use)
    compile: str = "none"  # one of COMPILES (harness.engine.compiled); not part of a case's key while "none"
    prompt_len: int | None = None  # mode "generate": tokens of the prompt (prefilled at once)
    new_tokens: int | None = None  # mode "generate": tokens generated (the first by the prefill, then one per step)
    optimizer: str = "adamw"     # train_step only: one of OPTIMIZERS; not part of a case's key at its default
    amp: str = "none"            # train_step only: one of AMPS; not part of a case's key at its default
    checkpointing: str = "none"  # train_step only: one of CHECKPOINTINGS; not part of a case's key at its default
    world_size: int = 1          # ranks the case spans (harness.engine.ranks); not part of a case's key at 1
    parallel: str = "none"       # one of PARALLELS: how the ranks split the work; not part of a case's key at "none"

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "img_size", *GENERATION_KEYS):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise BenchInputError(f"must be a positive integer, got {value!r}", where=name)
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise BenchInputError(f"must be a non-negative integer, got {self.threads!r}", where="threads")
        if self.dtype not in DTYPES:
            raise BenchInputError(f"unknown dtype {self.dtype!r}; expected one of {sorted(DTYPES)}", where="dtype")
        if self.mode not in MODES:
            raise BenchInputError(f"unknown mode {self.mode!r}; expected one of {list(MODES)}", where="mode")
        if self.mode == "generate":
            for name in GENERATION_KEYS:
                if getattr(self, name) is None:
                    raise BenchInputError(f"mode \"generate\" needs {name}", where=name)
            if self.seq_len is not None:
                raise BenchInputError("mode \"generate\" takes prompt_len and new_tokens, not seq_len", where="seq_len")
        else:
            for name in GENERATION_KEYS:
                if getattr(self, name) is not None:
                    raise BenchInputError(f"{name} needs mode = \"generate\" (the mode is {self.mode!r})", where=name)
        if not isinstance(self.device, str) or self.device.split(":")[0] not in ("cpu", "cuda", "mps"):
            raise BenchInputError(f"unknown device {self.device!r}; expected cpu, cuda or cuda:N", where="device")
        if self.compile not in COMPILES:
            raise BenchInputError(f"unknown compile {self.compile!r}; expected one of {list(COMPILES)}",
                                  where="compile")
        if self.compile in CUDA_ONLY_COMPILES and self.device.split(":")[0] != "cuda":
            raise BenchInputError(f"{self.compile!r} needs a CUDA device (it replays CUDA graphs), not "
                                  f"{self.device!r}; there use \"default\" or \"max-autotune\"", where="compile")
        self._check_training()
        self._check_parallel()

    def _check_parallel(self) -> None:
        """``world_size`` a positive integer; ``parallel`` known, set whenever several ranks are asked for, and in a
        mode it can run (ddp and fsdp: a training step), eager (one process's compile is not the ranks')."""
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise BenchInputError(f"must be a positive integer, got {self.world_size!r}", where="world_size")
        if self.parallel not in PARALLELS:
            raise BenchInputError(f"unknown parallel {self.parallel!r}; expected one of {list(PARALLELS)}",
                                  where="parallel")
        if self.world_size > 1 and self.parallel == "none":
            raise BenchInputError(f"world_size {self.world_size} needs parallel = one of "
                                  f"{list(PARALLELS[1:])} (how the ranks split the work)", where="parallel")
        if self.parallel != "none" and self.mode not in PARALLEL_MODES[self.parallel]:
            raise BenchInputError(f"parallel {self.parallel!r} runs mode {' or '.join(PARALLEL_MODES[self.parallel])}"
                                  f", not {self.mode!r}", where="parallel")
        if self.parallel != "none" and self.compile != "none":
            raise BenchInputError(f"parallel {self.parallel!r} runs eager: compile must be \"none\"", where="compile")

    def _check_training(self) -> None:
        """The train_step fields: known values, set only for a training step, fp16 autocast only on CUDA (its
        GradScaler), and mixed precision over fp32 master weights (``dtype = "fp32"``)."""
        for name, allowed in (("optimizer", OPTIMIZERS), ("amp", AMPS), ("checkpointing", CHECKPOINTINGS)):
            value = getattr(self, name)
            if value not in allowed:
                raise BenchInputError(f"unknown {name} {value!r}; expected one of {list(allowed)}", where=name)
            if self.mode != "train_step" and value != _TRAIN_DEFAULTS[name]:
                raise BenchInputError(f"{name} = {value!r} applies to mode \"train_step\" only, not "
                                      f"{self.mode!r}", where=name)
        if self.amp == "fp16" and self.device.split(":")[0] != "cuda":
            raise BenchInputError(f"amp \"fp16\" needs a CUDA device (its GradScaler), not {self.device!r}; "
                                  "on the CPU use amp = \"bf16\"", where="amp")
        if self.amp != "none" and self.dtype != "fp32":
            raise BenchInputError(f"amp {self.amp!r} keeps fp32 master weights: dtype must be \"fp32\", "
                                  f"not {self.dtype!r}", where="amp")

    @property
    def itemsize(self) -> int:
        """Bytes per element of the workload's dtype."""
        return DTYPE_BYTES[self.dtype]


_TRAIN_DEFAULTS: dict[str, str] = {"optimizer": "adamw", "amp": "none", "checkpointing": "none"}
WORKLOAD_KEYS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(Workload))
# Workload fields added after case keys were first stored (runs, ``--resume``, the CI baseline): left out of a
# case's key and stored workload while at their default, so every case that existed before keeps its key. A
# field added from now on goes here too.
OMITTED_WHEN_DEFAULT: frozenset[str] = frozenset({"compile", "prompt_len", "new_tokens", "optimizer", "amp",
                                                  "checkpointing", "world_size", "parallel"})
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Workload)}


def workload_dict(w: Workload) -> dict[str, Any]:
    """``w`` as a plain dict, without the fields of OMITTED_WHEN_DEFAULT that are at their default: what a case's
    key hashes and its record stores (a record without such a field read back gets the default)."""
    return {k: v for k, v in dataclasses.asdict(w).items() if k not in OMITTED_WHEN_DEFAULT or v != _DEFAULTS[k]}


Builder = Callable[[Any], Any]
"""``build(config) -> torch.nn.Module`` (typed loosely: the contract does not import torch)."""
InputMaker = Callable[[Any, Workload, Any], tuple]
"""``make_inputs(config, workload, torch.device) -> tuple[torch.Tensor, ...]``."""


@dataclass(frozen=True)
class ArchSpec:
    """A registered architecture: a frozen config plus how to build it and make its inputs.

    ``build(config)`` returns an ``nn.Module`` free of device/dtype/timers;
    ``make_inputs(config, workload, device)`` returns the positional inputs of ``forward``;
    ``small`` holds config overrides that make a tiny version (tests, smoke runs);
    ``cost(config, workload)`` gives analytic figures — ``{"params": int, "macs": int, ...}`` with
    forward MACs as :func:`harness.instruments.flops.count_model` counts them (eval, no_grad) — or is None;
    ``max_len(config)`` is the longest ``seq_len`` the model can take (learned positions), None if unbounded.
    ``quoted`` holds published figures of the model (:class:`harness.contract.quoted.Quoted`, e.g. ImageNet top-1 of its
    published weights) that the runner attaches to each case, labelled quoted with their source.
    """

    name: str
    family: str
    config: Any
    build: Builder
    make_inputs: InputMaker
    description: str = ""
    small: tuple[tuple[str, Any], ...] = ()
    cost: Callable[[Any, "Workload"], dict[str, int]] | None = None
    max_len: Callable[[Any], int | None] | None = None
    quoted: tuple[Quoted, ...] = ()


def workload_overrides(config: Any, w: Workload) -> dict[str, Any]:
    """The config overrides a workload implies: a model with an ``img_size`` field takes the workload's image size
    (ViT position tables). With :func:`check_workload`, the one place a workload meets an architecture."""
    return {"img_size": w.img_size} if w.img_size and "img_size" in _fields(config) else {}


WorkloadCheck = Callable[[ArchSpec, Workload], None]
"""A check of a workload against an architecture that needs torch, e.g. :data:`harness.engine.checks.WORKLOAD_CHECKS`
(a training step needs trainable parameters: the model is built on the meta device); the caller that loads a suite
passes it to :func:`check_workload`."""


def check_workload(spec: ArchSpec, w: Workload, checks: Sequence[WorkloadCheck] = ()) -> None:
    """A BenchInputError naming the workload field an architecture (resolved: its config as the case builds it)
    cannot take: a sequence longer than its ``max_len`` (learned positions); a generation (mode ``generate``) on a
    model without the generation protocol (an encoder, a CNN), a config the model refuses
    (``cannot_generate(config)``: a reason, or None), or ``prompt_len + new_tokens`` past its ``max_seq_len``;
    then ``checks``, in order."""
    limit = spec.max_len(spec.config) if spec.max_len is not None else None
    if w.seq_len and limit is not None and w.seq_len > limit:
        raise BenchInputError(f"{w.seq_len} is past the {limit} positions {spec.name} can take (its learned "
                              "positions end there: raise max_seq_len with it)", where="seq_len")
    for check in checks:
        check(spec, w)
    if w.mode != "generate":
        return
    missing = [m for m in GENERATION_PROTOCOL if not callable(getattr(spec.build, m, None))]
    if missing:
        raise BenchInputError(f"{spec.name} ({spec.family}) cannot generate: its model has no "
                              f"{', '.join(missing)} (decoders and Mamba can)", where="mode")
    refusal = getattr(spec.build, "cannot_generate", None)
    reason = refusal(spec.config) if callable(refusal) else None
    if reason:
        raise BenchInputError(f"{spec.name} cannot generate: {reason}", where="mode")
    total = (w.prompt_len or 0) + (w.new_tokens or 0)
    max_seq = getattr(spec.config, "max_seq_len", None)
    if max_seq is not None and total > max_seq:
        raise BenchInputError(f"prompt_len {w.prompt_len} + new_tokens {w.new_tokens} = {total} exceeds "
                              f"{spec.name}'s max_seq_len {max_seq}", where="new_tokens")


def _fields(config: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()


@dataclass(frozen=True)
class Case:
    """One measurement to take: an architecture with config overrides on one workload."""

    suite: str
    line: str
    arch: str
    overrides: tuple[tuple[str, Any], ...]
    workload: Workload
    metrics: tuple[str, ...]
    point: int = 0              # index of the suite's sweep point (cases of several lines at one point share it)

    @property
    def key(self) -> str:
        """Stable identity within a suite (used to resume and to align runs)."""
        payload = {
            "suite": self.suite,
            "line": self.line,
            "arch": self.arch,
            "overrides": [list(kv) for kv in self.overrides],
            "workload": workload_dict(self.workload),
            "metrics": list(self.metrics),
        }
        blob = json.dumps(payload, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def record(self, status: Status, message: str = "", **kw: Any) -> CaseRecord:
        """This case's outcome (``kw``: config, metrics, samples_s, duration_s)."""
        if "samples_s" in kw:
            kw["samples_s"] = tuple(kw["samples_s"])
        return CaseRecord(self.key, self.suite, self.line, self.arch, status, message,
                          workload=workload_dict(self.workload), **kw)
