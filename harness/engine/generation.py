"""The generation workload (``mode = "generate"``): a real greedy autoregressive loop, timed as servers are.

A case with ``mode = "generate"``, ``prompt_len`` P and ``new_tokens`` N runs, per timed call (one sample of
:mod:`harness.instruments.timing`, with the same cold call, warm-up and rounds as any case):

1. **prefill**: the prompt (B, P) in one call into the model's generation state (a static KV cache, or Mamba's
   constant state), then the argmax of its last logits: the first new token;
2. **decode**: N - 1 steps, each feeding back the token the previous one produced (B, 1) and taking the argmax.

The model is reached only through a small protocol, :data:`harness.contract.spec.GENERATION_PROTOCOL` — ``generation_state(batch, max_len)``,
``prefill(tokens, state) -> (B, vocab)`` and ``decode(token, state) -> (B, vocab)`` — that the decoders
(:class:`architectures.transformer.Decoder`) and Mamba (:class:`architectures.ssm.SSMLM`) implement; the loop,
its clock and its compilation live here. The state also says how many bytes it holds (``nbytes()``) and how
many a decode step must at least read and write after ``context`` positions (``step_bytes(context)``).

Each call records a :class:`Trace`: the time of every token as it reached the host (a server streams each token
out; on CUDA the clock synchronizes per token). From the traces of the timed calls (:func:`summarize`):

* ``ttft_ms``: time to first token, prefill + its argmax (median over calls);
* ``tpot_ms``: time per output token after the first, the mean of a call's N - 1 step times (median over calls)
  — vLLM's TPOT = (e2e - TTFT) / (N - 1);
* ``itl_p50_ms``/``itl_p90_ms``/``itl_p99_ms``: inter-token latency, percentiles of every step time of every
  timed call (vLLM's ITL);
* ``e2e_ms``: the whole call (median), ``output_tokens_per_s`` = B·N / e2e, ``total_tokens_per_s`` =
  B·(P + N) / e2e, ``decode_tokens_per_s`` = B / tpot;
* ``kv_cache_bytes``: the state's bytes (``nbytes()``), ``decode_min_bytes``: the mean over the steps of the
  bytes a step must move at least — every weight except the embedding tables (a step reads B rows of them) +
  the state read and written (``step_bytes``) — from which the reports take the bandwidth bound
  (:func:`reports.frames.rates`: ``decode_bound_ms`` = decode_min_bytes / the run's calibrated copy bandwidth).

``compile`` ≠ "none" compiles the **decode step** (the model and its state wrapped as one module, :class:`Decoding`,
so that the state's buffers are module buffers: static addresses CUDA graphs can replay, mutated in place); the
prefill stays eager. The counted MACs come from the eager model in the fake pass, whatever the mode.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from harness.contract.spec import Workload
from harness.engine.compiled import compile_model
from harness.engine.steps import Count, Step
from harness.instruments import memory
from harness.instruments.timing import TimingResult


def inputs_workload(w: Workload) -> Workload:
    """The workload whose inputs are a generation's prompt: ``seq_len = prompt_len`` in a plain forward (the
    architecture's own ``make_inputs`` then draws the (B, P) token ids); any other workload unchanged."""
    if w.mode != "generate":
        return w
    return dataclasses.replace(w, seq_len=w.prompt_len, mode="fwd", prompt_len=None, new_tokens=None)


class Decoding(nn.Module):
    """One decode step of ``model`` on ``state`` as a module (what ``compile`` compiles): (B, 1) -> (B, vocab)."""

    def __init__(self, model: nn.Module, state: nn.Module) -> None:
        super().__init__()
        self.model, self.state = model, state

    def forward(self, token: Tensor) -> Tensor:
        return self.model.decode(token, self.state)


@dataclass(frozen=True)
class Trace:
    """One generation's clock: seconds from the start to the first token, then each decode step's seconds."""

    ttft_s: float
    step_s: tuple[float, ...]

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + sum(self.step_s)


class Generation(Step):
    """A greedy generation as a zero-argument callable (the timed unit of a ``generate`` case).

    ``model`` implements :data:`harness.contract.spec.GENERATION_PROTOCOL`; ``prompt`` (B, P) token ids; ``decode`` (default: the eager
    :class:`Decoding`) is the step the loop calls, e.g. its compiled form (:meth:`with_decode`). Every call
    appends its :class:`Trace` to ``traces`` and leaves the generated ids (B, N) in ``tokens``.
    """

    mode: ClassVar[str] = "generate"
    forward_cost: ClassVar[bool] = False     # a call is a prefill and N - 1 decode steps, not one forward

    def __init__(self, model: nn.Module, prompt: Tensor, new_tokens: int, *, compiled: bool = False) -> None:
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
        self.model, self.prompt, self.new_tokens = model, prompt, new_tokens
        batch, prompt_len = prompt.shape
        self.state = model.generation_state(batch, prompt_len + new_tokens)
        self.decoding = Decoding(model, self.state)
        self.decode: Callable[[Tensor], Tensor] = self.decoding
        self.compiled = compiled
        self.cuda = prompt.device.type == "cuda"
        self.traces: list[Trace] = []
        self.tokens: Tensor | None = None

    @classmethod
    def inputs_workload(cls, w: Workload) -> Workload:
        """The prompt's workload (:func:`inputs_workload`)."""
        return inputs_workload(w)

    @classmethod
    def for_workload(cls, model: nn.Module, inputs: tuple, w: Workload) -> Generation:
        return make_generation(model, inputs, w)

    def compile(self, w: Workload, wrap: Callable[[nn.Module], nn.Module]) -> Generation:
        """The decode step compiled (the model and its state as one module, :class:`Decoding`), the prefill eager:
        the same generation stepping through the compiled decode."""
        return self.with_decode(compile_model(self.decoding, w.compile, "fwd"), compiled=True)

    def counts(self, w: Workload, count: Count | None) -> dict[str, float]:
        """The prefill's own MACs, ``prefill_macs`` (its share of the call; left out when not countable)."""
        if count is None:
            return {}
        prefill = count(prefill_step(self))
        return {"prefill_macs": float(prefill.macs)} if prefill.complete else {}

    def with_decode(self, decode: Callable[[Tensor], Tensor], compiled: bool) -> Generation:
        """The same generation (same model, prompt and state) stepping through ``decode``; its own traces."""
        other = copy.copy(self)
        other.decode, other.compiled, other.traces = decode, compiled, []
        return other

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.prompt.device)     # the token is on the host: a server streams it out
        return time.perf_counter()

    @torch.no_grad()
    def __call__(self) -> None:
        t0 = self._now()
        token = self.model.prefill(self.prompt, self.state).argmax(dim=-1, keepdim=True)   # (B, 1)
        out = [token]
        marks = [self._now()]
        for _ in range(self.new_tokens - 1):
            if self.compiled:
                torch.compiler.cudagraph_mark_step_begin()
            token = self.decode(token).argmax(dim=-1, keepdim=True)                     # (B, 1)
            out.append(token)
            marks.append(self._now())
        self.tokens = torch.cat(out, dim=1)                                              # (B, N)
        self.traces.append(Trace(marks[0] - t0, tuple(b - a for a, b in zip(marks, marks[1:]))))


    def state_bytes(self) -> int:
        """The generation state's bytes (alive before a call, beside the model and the prompt)."""
        return memory.tensor_bytes(self.state)

    def figures(self, timed: TimingResult, w: Workload, metrics: Mapping[str, float]) -> tuple[dict[str, float], str]:
        """The timed calls' own clocks (:func:`figures`: TTFT, TPOT, ITL, tokens/s) and the state's bytes."""
        return figures(self, timed_traces(self, len(timed.samples_s), timed.block_size), w), ""


def make_generation(model: nn.Module, inputs: tuple, w: Workload) -> Generation:
    """The eager generation of a ``generate`` case: ``inputs`` are its prompt's (B, P) ids (from
    :func:`inputs_workload`); the model is put in eval mode (generation is inference)."""
    model.eval()
    return Generation(model, inputs[0], w.new_tokens)


def prefill_step(gen: Generation) -> Callable[[], None]:
    """The prefill of ``gen`` alone, as a callable (what the fake pass counts as ``prefill_macs``)."""
    def step() -> None:
        with torch.no_grad():
            gen.model.prefill(gen.prompt, gen.state)
    return step


def weight_bytes_read(model: nn.Module, batch: int) -> int:
    """Bytes of the weights a decode step must read at least: every parameter once, except the embedding
    tables, of which it reads ``batch`` rows (a tied LM head does read its table whole: left out, the bound
    only gets looser, never wrong)."""
    embeddings = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Embedding)}
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():
        if id(p) in embeddings:
            total += min(batch, p.shape[0]) * p[0].nbytes
        else:
            total += p.nbytes
    return total


def decode_min_bytes(gen: Generation) -> float:
    """The mean over the N - 1 decode steps of the bytes one must move at least: the weights
    (:func:`weight_bytes_read`) + the state read and written after ``context`` positions (``step_bytes``)."""
    batch, prompt_len = gen.prompt.shape
    steps = range(prompt_len + 1, prompt_len + gen.new_tokens)         # a step feeds position p after p earlier
    if not steps:
        return 0.0
    weights = weight_bytes_read(gen.model, batch)
    return weights + statistics.fmean(gen.state.step_bytes(c) for c in steps)


def summarize(traces: list[Trace], w: Workload) -> dict[str, float]:
    """The generation figures of ``traces`` (the timed calls of one case), as the module docstring defines them.
    Per-step figures are left out (never 0) when N = 1 (no decode step)."""
    if not traces:
        raise ValueError("no generation was timed")
    b, p, n = w.batch_size, w.prompt_len, w.new_tokens
    e2e = statistics.median(t.e2e_s for t in traces)
    out = {"ttft_ms": statistics.median(t.ttft_s for t in traces) * 1e3, "e2e_ms": e2e * 1e3,
           "output_tokens_per_s": b * n / e2e, "total_tokens_per_s": b * (p + n) / e2e,
           "generations": float(len(traces))}
    if n > 1:
        tpot = statistics.median(statistics.fmean(t.step_s) for t in traces)
        steps = np.array([s for t in traces for s in t.step_s]) * 1e3
        p50, p90, p99 = np.percentile(steps, [50, 90, 99])
        out.update(tpot_ms=tpot * 1e3, decode_tokens_per_s=b / tpot, itl_p50_ms=float(p50),
                   itl_p90_ms=float(p90), itl_p99_ms=float(p99))
    return out


def timed_traces(gen: Generation, n_samples: int, block_size: int) -> list[Trace]:
    """The traces of the timed calls: the last ``n_samples × block_size`` calls (the timer's cold call, warm-up
    and calibration come first; later passes — memory, kernel probe — run on other objects or after)."""
    n = n_samples * block_size
    return gen.traces[-n:] if n else []


def figures(gen: Generation, traces: list[Trace], w: Workload) -> dict[str, Any]:
    """Everything a ``generate`` case records beside the timing: :func:`summarize` + the state's bytes and the
    bandwidth-bound bytes."""
    out = summarize(traces, w)
    out["kv_cache_bytes"] = float(gen.state.nbytes())
    out["decode_min_bytes"] = float(decode_min_bytes(gen))
    return out
