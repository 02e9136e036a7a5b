"""C41 (the fair-quality side): byte-level LM quality of attention vs S4D vs Mamba at matched parameters.

The kv_heads experiment's data, tokenizer, training loop and evaluation (:mod:`claims.experiments.lm_train`):
the MHA ``decoder-tiny`` of its QUICK setup against ``s4d-lm-tiny`` and ``mamba-lm-tiny``, their parameter count
matched to the decoder's by :func:`match`: each SSM keeps its preset's state size N (S4D 64, Mamba 16) and
expansion, and its width d_model and depth are chosen so its exact parameter count is within ``match_tol`` of the
decoder's — the decoder's depth when possible, then the width nearest the decoder's. (Matching by N instead made
S4D's state 4× the preset's and its scan the whole cost of the run.) Same seeds, same batches (the loop draws its
windows from the seed), same steps; validation loss and next-token accuracy per seed, and per seed the SSM
relative to the decoder.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from claims.experiments.lm_train import LMSetup, build_lm, train_variants, val_metrics
from claims.experiments.runner import Experiment, Fields, Seeds, relative
from claims.experiments.text_data import VOCAB, load_corpus
from claims.experiments.train import CPU
from harness.engine.models import materialize
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.instruments.fake import new_fake_mode

ATTENTION = "attention"
SSMS = {"s4d": "s4d-lm-tiny", "mamba": "mamba-lm-tiny"}          # variant name -> registered preset
MAX_LAYERS = 16
WIDTHS = range(16, 1025, 8)                                       # d_model candidates of the match

DATA = ("Byte-level language modelling of CPython's standard-library source, as the kv_heads experiment (C10/C11): "
        "~2.65M training tokens from 95 files, ~0.35M validation tokens from 10 held-out files, vocab 128. "
        "The MHA decoder of kv_heads' QUICK setup (d_model 128, 2 layers, 8 heads, ~0.43M parameters) against "
        "Mamba (N=16, E=2d; and S4D, N=64, in FULL only) LMs of the decoder's depth whose width is chosen to match its parameter "
        "count within 5% (QUICK: Mamba d_model 168; counts in the result). QUICK: 80 steps × 16 windows × "
        "64 tokens per model (~82k tokens, a fifth of kv_heads' QUICK budget of 200 × 32 × 64: the SSMs' scans cost "
        "5–10× the decoder's step on the CPU, and the whole claims run must stay short), constant comparison at that "
        "budget; FULL: 400 steps × 32 × 64 (kv_heads' FULL budget) with the 4-layer decoder. Orders of magnitude "
        "smaller than Gu & Dao's models: the figures are the direction at this scale, not the papers' sizes.")


@dataclass(frozen=True)
class Setup(LMSetup):
    ssms: tuple[str, ...] = tuple(SSMS)
    match_tol: float = 0.05                    # "parameter-matched": within 5% of the decoder

    def __post_init__(self) -> None:
        unknown = set(self.ssms) - set(SSMS)
        if unknown:
            raise ValueError(f"unknown SSM variant(s) {sorted(unknown)}; known: {', '.join(SSMS)}")
        if not 0 < self.match_tol < 1:
            raise ValueError(f"match_tol must be in (0, 1), got {self.match_tol}")


QUICK = Setup(d_model=128, n_layers=2, n_heads=8, seq_len=64, steps=80, batch=16, lr=3e-3, warmup=8,
              eval_windows=128, ssms=("mamba",))      # S4D in FULL only, as in the recall experiment
FULL = Setup(d_model=128, n_layers=4, n_heads=8, seq_len=64, steps=400, batch=32, lr=3e-3, warmup=40,
             eval_windows=256)


def ssm_params(preset: str, **overrides: Any) -> int:
    """The SSM preset's exact parameter count with ``overrides`` (its cost formula; tests check it against the
    built model)."""
    spec = resolve(preset, vocab_size=VOCAB, **overrides)
    return int(spec.cost(spec.config, Workload(seq_len=1))["params"])


def attention_params(s: Setup) -> int:
    model = materialize(resolve("decoder-tiny", vocab_size=VOCAB, **s.arch()), Workload(), CPU, new_fake_mode())
    return sum(p.numel() for p in model.parameters())


def match(s: Setup, preset: str, target: int) -> dict[str, int]:
    """The SSM config overrides (d_model, n_layers) whose parameter count is nearest ``target`` with the preset's
    own N and expansion: among those within ``s.match_tol``, the decoder's depth first (else the nearest depth),
    then the width nearest the decoder's; with none within the tolerance, the nearest."""
    cands = []
    for layers, width in itertools.product(range(1, MAX_LAYERS + 1), WIDTHS):
        over = {"d_model": width, "n_layers": layers}
        err = abs(ssm_params(preset, **over) / target - 1)
        within = err <= s.match_tol
        cands.append(((0, abs(layers - s.n_layers), abs(width - s.d_model), err) if within else (1, err), over))
    return min(cands, key=lambda c: c[0])[1]


def build_ssm(preset: str, seed: int, **overrides: Any) -> nn.Module:
    """``preset`` with ``overrides`` over the byte vocabulary, initialised from ``seed``."""
    return materialize(resolve(preset, vocab_size=VOCAB, **overrides), Workload(), CPU, seed=seed)


def vs_attention(v: Fields, att: Fields) -> Fields:
    """Parameters relative to the decoder, and per seed the loss/accuracy relative to the decoder trained from the
    same seed on the same batches (+ loss = worse)."""
    return {"params_rel_to_attention": v["params"] / att["params"] - 1,
            "rel_loss_vs_attention": [relative(a, b) for a, b in zip(v["val_loss"], att["val_loss"])],
            "acc_diff_vs_attention": [a - b for a, b in zip(v["val_acc"], att["val_acc"])]}


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    corpus = load_corpus(s.corpus_bytes)
    target = attention_params(s)
    shapes = {name: match(s, SSMS[name], target) for name in s.ssms}
    builds: dict[str, Callable[[int], nn.Module]] = {ATTENTION: partial(build_lm, **s.arch())}
    builds.update({name: partial(build_ssm, SSMS[name], **over) for name, over in shapes.items()})
    trained, scale = train_variants(s, seeds, corpus, builds, partial(val_metrics, s))
    att = trained[ATTENTION]
    shape = {ATTENTION: {"preset": "decoder-tiny", **s.arch()}} | {n: {"preset": SSMS[n], **o} for n, o in shapes.items()}
    variants = {name: {"config": shape[name], **v, **vs_attention(v, att)} for name, v in trained.items()}
    return {"data": corpus.info(), "variants": variants}, scale


EXPERIMENT = Experiment("C41", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
