"""The byte-level language-model experiments' shared part (K/V heads, positions, the causal mask), CPU-sized.

:func:`train_variants` trains every variant × seed of an experiment on the same corpus with
:func:`train_lm` (AdamW β = 0.9, 0.95, linear warm-up then cosine decay to 10%, gradient clipping,
random corpus windows from a seeded generator) and returns per variant its parameter count and
per-seed lists, plus the scale record. :func:`eval_windows` gives a fixed set of validation windows
(its own seed, so every model sees the same ones), :func:`position_losses` the per-position next-token
loss and accuracy over them.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claims.experiments.runner import Fields, Seeds, sweep
from claims.experiments.text_data import VOCAB, Corpus, load_corpus, sample_batch, sample_windows
from claims.experiments.train import CPU, adamw, fit, lr_at
from harness.engine.models import materialize
from harness.instruments.flops import count_params
from harness.contract.registry import resolve
from harness.contract.spec import Workload

EVAL_SEED = 1234
FINAL_LR = 0.1                   # the cosine decays to this share of the peak learning rate


@dataclass(frozen=True)
class LMSetup:
    """Sizes shared by the LM experiments; each experiment's Setup extends it."""

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 8
    d_ff: int | None = None        # None: 4 · d_model
    seq_len: int = 64
    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    clip: float = 1.0
    weight_decay: float = 0.01
    eval_windows: int = 128
    eval_batch: int = 32
    corpus_bytes: int = 3_000_000

    def arch(self, **extra: Any) -> dict[str, Any]:
        """Decoder config overrides for these sizes (``extra`` adds or replaces fields)."""
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "d_ff": self.d_ff or 4 * self.d_model, "max_seq_len": max(self.seq_len, 64), **extra}


TRAINED: dict[tuple, tuple[dict[str, Tensor], dict[str, Any]]] = {}
"""Decoders trained in this process, by :func:`shared_key`: an experiment that trains the very model another
trained (same config, initialisation seed, data and training setup) takes its weights instead of training it
again (kv_heads' MHA is causal's masked decoder)."""


class SharedBuild:
    """A variant's builder that may reuse a training: ``build(seed)`` as before, and ``key`` naming the model."""

    def __init__(self, build: Callable[[int], nn.Module], key: tuple) -> None:
        self.build, self.key = build, key

    def __call__(self, seed: int) -> nn.Module:
        return self.build(seed)


def shared_key(**overrides: Any) -> tuple:
    """The identity of ``build_lm(seed, **overrides)``'s model: its resolved config, with ``n_kv_heads`` left unset
    or set to ``n_heads`` the same (both are MHA: the same modules, the same initialisation)."""
    cfg = resolve("decoder-tiny", **{"vocab_size": VOCAB, **overrides}).config
    if getattr(cfg, "n_kv_heads", None) == cfg.n_heads:
        cfg = dataclasses.replace(cfg, n_kv_heads=None)
    return ("decoder-tiny", repr(cfg))


def _training_key(s: LMSetup) -> tuple:
    """What decides a training besides the model and seed: the loop's fields of the setup (not evaluation's)."""
    return (s.steps, s.batch, s.seq_len, s.lr, s.warmup, s.clip, s.weight_decay, s.corpus_bytes)


def build_lm(seed: int, **overrides: Any) -> nn.Module:
    """A ``decoder-tiny`` with ``overrides`` over a byte vocabulary, initialised from ``seed``."""
    return materialize(resolve("decoder-tiny", **{"vocab_size": VOCAB, **overrides}), Workload(), CPU, seed=seed)


def train_lm(model: nn.Module, data: Tensor, s: LMSetup, seed: int, log_every: int = 10) -> dict[str, Any]:
    """Train next-token prediction on random windows of ``data``; returns ``losses`` (the mean over
    each ``log_every`` steps), ``final_loss`` (mean of the last 10% of steps), tokens and seconds."""
    g = torch.Generator().manual_seed(10_000 + seed)

    def loss_at(step: int) -> Tensor:
        x, y = sample_batch(data, s.batch, s.seq_len, g)                      # (B, T), (B, T)
        logits = model(x)                                                     # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    t0 = time.perf_counter()
    per_step = fit(model, adamw(model, s.lr, s.weight_decay, betas=(0.9, 0.95)), s.steps,
                   lambda step: lr_at(step, s.steps, s.lr, s.warmup, FINAL_LR), loss_at, clip=s.clip)
    seconds = time.perf_counter() - t0
    curve = [sum(per_step[i:i + log_every]) / len(per_step[i:i + log_every])
             for i in range(0, len(per_step), log_every)]
    tail = per_step[-max(1, len(per_step) // 10):]
    return {"losses": curve, "log_every": log_every, "final_loss": sum(tail) / len(tail),
            "tokens": s.steps * s.batch * s.seq_len, "seconds": seconds}


@dataclass(frozen=True)
class LMTrial:
    """One (variant, seed) of :func:`train_variants`: ``build(seed)`` trained on the training split of
    ``load_corpus(s.corpus_bytes)`` (loaded where it runs: the corpus is not shipped to a worker), then
    ``evaluate(model, seed)``; a :class:`SharedBuild` whose training is in ``cached`` takes its weights instead. Module-level and
    picklable (a worker process runs it), so ``evaluate`` must be too (a ``functools.partial`` of a module-level
    function). A shared build's result carries ``_trained`` = (key, weights, training) for :data:`TRAINED`."""

    s: LMSetup
    evaluate: Callable[[nn.Module, int], Fields]
    cached: Mapping[tuple, tuple[dict[str, Tensor], dict[str, Any]]]

    def __call__(self, build: Callable[[int], nn.Module], seed: int) -> Fields:
        model = build(seed)
        key = (build.key, _training_key(self.s), seed) if isinstance(build, SharedBuild) else None
        trained = None
        if key is not None and key in self.cached:             # the same model trained the same way: its weights
            state, tr = self.cached[key]
            model.load_state_dict(state)
        else:
            tr = train_lm(model, load_corpus(self.s.corpus_bytes).train, self.s, seed)
            if key is not None:
                trained = (key, copy.deepcopy(model.state_dict()), tr)
        return {"train_loss": tr["final_loss"], "loss_curve": tr["losses"], "train_seconds": tr["seconds"],
                **self.evaluate(model, seed), "_trained": trained}


def train_variants(s: LMSetup, seeds: Seeds, corpus: Corpus, builds: Mapping[str, Callable[[int], nn.Module]],
                   evaluate: Callable[[nn.Module, int], Fields]) -> tuple[dict[str, Fields], Fields]:
    """Every variant (``builds[name](seed)`` makes its model) × seed trained on ``corpus.train``, then
    ``evaluate(model, seed)`` (:class:`LMTrial`, through :func:`~claims.experiments.runner.sweep`: in worker
    processes under a pooled plan, so builds and ``evaluate`` must be picklable). Returns per variant ``params``
    and the per-seed lists ``train_loss``, ``loss_curve``, ``train_seconds`` and ``evaluate``'s keys; and the
    scale record."""
    if corpus is not load_corpus(s.corpus_bytes):
        raise ValueError("train_variants trains on load_corpus(s.corpus_bytes): pass that corpus")
    keys = {(b.key, _training_key(s), seed) for b in builds.values() if isinstance(b, SharedBuild) for seed in seeds}
    trial = LMTrial(s, evaluate, {k: TRAINED[k] for k in keys if k in TRAINED})
    trained = sweep(builds, seeds, trial)
    for fields in trained.values():
        for done in fields.pop("_trained"):
            if done is not None:
                TRAINED[done[0]] = (done[1], done[2])
    variants = {name: {"params": count_params(build(0)), **trained[name]} for name, build in builds.items()}
    scale = {"params": {name: v["params"] for name, v in variants.items()},
             "tokens_trained": s.steps * s.batch * s.seq_len, "steps": s.steps, "seq_len": s.seq_len,
             "models_trained": len(seeds) * len(builds)}
    return variants, scale


def val_metrics(s: LMSetup, model: nn.Module, seed: int) -> Fields:
    """``val_loss`` and ``val_acc`` of :func:`evaluate` on ``s.eval_windows`` windows of ``s.seq_len`` of the
    validation split (module-level: ``partial(val_metrics, s)`` is a picklable ``evaluate``)."""
    ev = evaluate(model, load_corpus(s.corpus_bytes).val, s.seq_len, s.eval_windows, s.eval_batch)
    return {"val_loss": ev["loss"], "val_acc": ev["acc"]}


def eval_windows(data: Tensor, length: int, n: int, seed: int = EVAL_SEED) -> Tensor:
    """``n`` fixed windows of ``length + 1`` tokens (inputs + shifted targets) from ``data``."""
    return sample_windows(data, n, length + 1, torch.Generator().manual_seed(seed))


@torch.no_grad()
def position_losses(model: nn.Module, windows: Tensor, batch: int = 32) -> tuple[Tensor, Tensor]:
    """Per-position mean next-token loss and accuracy over ``windows`` (N, T+1): two (T,) tensors."""
    model.eval()
    loss_sum = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    hit_sum = torch.zeros_like(loss_sum)
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        logits = model(w[:, :-1]).float()                                  # (b, T, V)
        nll = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none")   # (b, T)
        loss_sum += nll.sum(0).double()
        hit_sum += (logits.argmax(-1) == w[:, 1:]).sum(0).double()
    return loss_sum / windows.shape[0], hit_sum / windows.shape[0]


def evaluate(model: nn.Module, data: Tensor, length: int, n: int, batch: int = 32) -> dict[str, float]:
    """Mean next-token loss (nats) and accuracy over ``n`` fixed validation windows of ``length``."""
    loss, acc = position_losses(model, eval_windows(data, length, n), batch)
    return {"loss": float(loss.mean()), "acc": float(acc.mean())}


@torch.no_grad()
def last_position_loss(model: nn.Module, windows: Tensor, batch: int = 32) -> dict[str, float]:
    """Loss/accuracy of predicting token T from the prefix of T tokens alone (windows (N, T+1)):
    the generation-time setting, where nothing after the prediction point exists."""
    model.eval()
    nll, hits = [], []
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        logits = model(w[:, :-1])[:, -1].float()                           # (b, V)
        nll.append(F.cross_entropy(logits, w[:, -1], reduction="none"))
        hits.append((logits.argmax(-1) == w[:, -1]).float())
    return {"loss": float(torch.cat(nll).mean()), "acc": float(torch.cat(hits).mean())}
