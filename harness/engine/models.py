"""The one model build (:func:`materialize`: real, or fake for counting and estimating), weights initialised
cheaply, and the model of the last case kept in a worker process for the next cases that differ only in the
workload (:data:`MODELS`), with its compiled wrapper for the next cases that differ only in the batch. Used by
:mod:`harness.engine.runner`, the FLOP table and the claims."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from torch._subclasses.fake_tensor import FakeTensorMode

from harness.instruments import memory
from harness.instruments.fake import build_fake, new_fake_mode
from harness.contract.spec import ArchSpec, Case, Workload
from harness.engine.steps import cast_inputs
from harness.instruments.torch_types import torch_dtype
from harness.engine.checkpointing import apply_checkpointing


def release() -> None:
    """Give back what dropped models held: garbage-collect, and empty the CUDA allocator's cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- cheap weight initialisation -----------------------------------------------------------------------------
_POOL_N = 1_048_573      # a prime: a tensor filled from the pool at a rotating offset repeats no row or column
_pools: dict[str, torch.Tensor] = {}


def _pool(kind: str) -> torch.Tensor:
    """``_POOL_N`` standard normal (``"normal"``) or uniform [0, 1) (``"uniform"``) fp32 values, seeded: the same
    in every process."""
    if kind not in _pools:
        g = torch.Generator().manual_seed(0 if kind == "normal" else 1)
        _pools[kind] = (torch.randn if kind == "normal" else torch.rand)(_POOL_N, generator=g)
    return _pools[kind]


def _scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


class _PoolFill:
    """Fills a tensor from a pool, continuing where the previous fill stopped (deterministic per build)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, t: torch.Tensor, kind: str, scale: float, shift: float) -> torch.Tensor:
        pool, flat, n = _pool(kind), t.view(-1), t.numel()
        done = 0
        with torch.no_grad():
            while done < n:
                start = self.offset % _POOL_N
                m = min(n - done, _POOL_N - start)
                chunk, src = flat[done:done + m], pool[start:start + m]
                if chunk.dtype == src.dtype and chunk.device == src.device:
                    torch.add(_scalar(shift), src, alpha=scale, out=chunk)     # one pass: shift + scale·pool
                else:
                    chunk.copy_(src).mul_(scale).add_(shift)
                done += m
                self.offset += m + 7       # a new phase for the next chunk and the next tensor
        return t


@contextlib.contextmanager
def cheap_init() -> Iterator[None]:
    """While a model is built, ``Tensor.uniform_``/``normal_`` and ``nn.init.trunc_normal_`` draw from a seeded
    pool of random values instead of the (single-threaded, ~30 ns per value) CPU generator: every weight keeps
    the distribution its module's own init asks for (bounds, mean, std), finite and never uninitialised, at
    the cost of a copy. Other tensors (made outside the build, e.g. inputs) are untouched."""
    fill = _PoolFill()
    orig_uniform, orig_normal, orig_trunc = torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_

    def usable(t: torch.Tensor) -> bool:
        return (type(t) in (torch.Tensor, nn.Parameter) and t.is_floating_point() and t.is_contiguous()
                and t.device.type in ("cpu", "cuda"))

    def uniform_(self: torch.Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if not usable(self):
            return orig_uniform(self, a, b, generator=generator)
        return fill(self, "uniform", float(b) - float(a), float(a))

    def normal_(self: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
        if not usable(self):
            return orig_normal(self, mean, std, generator=generator)
        return fill(self, "normal", float(std), float(mean))

    def trunc_normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                      generator: Any = None) -> torch.Tensor:
        if not usable(tensor):
            return orig_trunc(tensor, mean, std, a, b, generator=generator)
        with torch.no_grad():         # normal values past the bounds (|z| > 2 at the defaults) move to the bounds
            return fill(tensor, "normal", float(std), float(mean)).clamp_(a, b)

    own = {name: name in torch.Tensor.__dict__ for name in ("uniform_", "normal_")}   # else TensorBase's
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # memory-bound copies: one thread is as fast, and immune to a busy machine
    torch.Tensor.uniform_, torch.Tensor.normal_, nn.init.trunc_normal_ = uniform_, normal_, trunc_normal_
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        nn.init.trunc_normal_ = orig_trunc
        for name, orig in (("uniform_", orig_uniform), ("normal_", orig_normal)):
            if own[name]:
                setattr(torch.Tensor, name, orig)
            else:
                delattr(torch.Tensor, name)


def materialize(spec: ArchSpec, w: Workload, device: torch.device, fake: FakeTensorMode | None = None,
                seed: int | None = None) -> nn.Module:
    """``spec``'s model for workload ``w`` on ``device``: the one way a model is built, whatever it is for.

    In one order: the architecture's module (``spec.build``), ``w``'s activation checkpointing wrapped around its
    blocks (:func:`harness.engine.checkpointing.apply_checkpointing`, from outside the model), ``w``'s dtype, then
    ``device``. Real (``fake`` None): seeded, weights drawn cheaply (:func:`cheap_init`) — what is timed, and what
    a FLOP table counts on the CPU; with ``seed``, the weights its modules' own initialisation draws from torch's
    generator seeded with ``seed`` instead — what a training starts from, or a study of a model at initialisation.
    Fake (a mode from :func:`harness.instruments.fake.new_fake_mode`, not entered): built on meta and placed as
    fake tensors on ``device`` (:func:`harness.instruments.fake.build_fake`) — what the fake pass counts and
    estimates, with no memory and no arithmetic."""
    def build() -> nn.Module:
        return apply_checkpointing(spec.build(spec.config), w.checkpointing)
    if fake is not None:
        return build_fake(lambda: build().to(dtype=torch_dtype(w)), fake, device)
    if seed is not None:
        torch.manual_seed(seed)
        model = build()
    else:
        torch.manual_seed(0)
        with cheap_init():
            model = build()
    return model.to(device=device, dtype=torch_dtype(w))


def fake_case(spec: ArchSpec, w: Workload, device: torch.device) -> tuple[nn.Module, tuple, FakeTensorMode]:
    """One case on fake tensors: the model (:func:`materialize`, fake), its inputs made inside the mode in ``w``'s
    dtype, and the mode to run them under."""
    mode = new_fake_mode()
    model = materialize(spec, w, device, mode)
    with mode:
        inputs = cast_inputs(spec.make_inputs(spec.config, w, device), torch_dtype(w))
    return model, inputs, mode


def real_case(spec: ArchSpec, w: Workload, device: torch.device) -> tuple[nn.Module, tuple]:
    """One case on real tensors: the model (:func:`materialize`) and its inputs in ``w``'s dtype."""
    model = materialize(spec, w, device)
    return model, cast_inputs(spec.make_inputs(spec.config, w, device), torch_dtype(w))


# -- model reuse ------------------------------------------------------------------------------------------
def model_key(case: Case) -> tuple:
    """Cases with the same key can share one built model: same architecture, overrides and device (and
    activation checkpointing, which wraps the model's blocks: harness.engine.checkpointing)."""
    key = (case.arch, case.overrides, case.workload.device)
    return key if case.workload.checkpointing == "none" else (*key, case.workload.checkpointing)


def _layout(model: nn.Module) -> tuple:
    """The names and shapes of a model's parameters and buffers (not their dtype): a model that grew state
    (e.g. a cached mask registered as a buffer) is not reused."""
    return tuple((n, tuple(t.shape)) for n, t in (*model.named_parameters(), *model.named_buffers()))


class ModelCache:
    """The model built for the last case, kept in this process for the next cases that differ only in the
    workload: a batch or length change reuses it as is, a dtype change casts it (unless another prepared
    case still steps it). At most one is kept; it is dropped as soon as a case needs another model, before
    that case's fake pass, so memory never holds two. Gradients are dropped on reuse (``fwd_bwd`` leaves them).
    With it, at most one compiled wrapper of it (:meth:`compiled`), dropped with it."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.model: nn.Module | None = None
        self.layout: tuple = ()
        self.hits = 0
        self.wrapper: tuple[tuple, nn.Module] | None = None    # (harness.engine.compiled.compiled_key, compiled model)
        self.compile_hits = 0

    def compiled(self, model: nn.Module, key: tuple, make: Callable[[], nn.Module]) -> nn.Module:
        """``model``'s compiled wrapper for ``key`` (:func:`harness.engine.compiled.compiled_key`: the workload but its
        batch): the kept one when ``model`` is the kept model and ``key`` is the kept wrapper's, else ``make()``
        (kept when ``model`` is the kept model). A wrapper for another key is dropped first (and collected), so
        that :func:`harness.engine.compiled.compile_model` finds nothing compiled alive and starts from a clean cache."""
        if self.wrapper is not None and model is self.model and self.wrapper[0] == key:
            self.compile_hits += 1
            return self.wrapper[1]
        if self.wrapper is not None:
            self.wrapper = None
            gc.collect()              # a compiled wrapper holds reference cycles: free it now, not at some later gc
        fast = make()
        if model is self.model:
            self.wrapper = (key, fast)
        return fast

    def keep_only(self, key: tuple) -> None:
        if self.key is not None and self.key != key:
            self.clear()

    def clear(self) -> None:
        had = self.model is not None
        self.key = self.model = self.wrapper = None
        self.layout = ()
        if had:
            release()

    def held_bytes(self, case: Case) -> int:
        """Bytes of the kept model that ``case`` would reuse (0 when it would build its own)."""
        return memory.tensor_bytes(self.model) if self.model is not None and self.key == model_key(case) else 0

    def get(self, spec: ArchSpec, case: Case, in_use: Sequence[tuple[nn.Module, str]] = ()) -> nn.Module:
        """The model for ``case``: the kept one when it fits, else a fresh build (which is then kept).
        ``in_use``: (model, mode) of prepared cases that still step their model (interleaved groups): a model in
        use is shared only as it is (same dtype and mode: the mode sets train/eval), never cast."""
        w, key = case.workload, model_key(case)
        kept = self.model if self.key == key and self.model is not None and _layout(self.model) == self.layout \
            else None
        users = [mode for m, mode in in_use if m is self.model]
        if kept is not None:
            dtype = next((t.dtype for t in kept.parameters() if t.is_floating_point()), torch_dtype(w))
            if not users or (dtype == torch_dtype(w) and all(mode == w.mode for mode in users)):
                self.hits += 1
                kept.zero_grad(set_to_none=True)
                return kept if dtype == torch_dtype(w) else kept.to(dtype=torch_dtype(w))
        if not users:
            self.clear()                 # free it before the new build (a prepared case may still hold it)
        model = materialize(spec, w, torch.device(w.device))
        self.key, self.model, self.layout, self.wrapper = key, model, _layout(model), None
        return model


MODELS = ModelCache()
"""This process's kept model (a worker runs many cases; :class:`ModelCache`)."""
