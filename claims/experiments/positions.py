"""C14–C16: position schemes and length extrapolation.

Claims: sinusoidal encodings extrapolate to lengths unseen in training; learned embeddings cannot go
beyond ``max_seq_len``; ALiBi extrapolates best; RoPE encodes relative position. The same byte-level
decoder is trained with each scheme at a short length L (learned: ``max_seq_len = L``), plus
``none`` as a control (a causal decoder can infer position from the mask), then evaluated at
1×, 2×, 4×, 8× L on the same validation windows: the mean loss over all positions, and the loss over
positions ≥ L alone (the first L positions of a long window are in-distribution and dilute the
effect). Learned positions past ``max_seq_len`` raise; that is recorded as unavailable (loss None)
with the error message.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from torch import Tensor, nn

from claims.experiments.lm_train import LMSetup, build_lm, eval_windows, position_losses, train_variants
from claims.experiments.runner import Experiment, Fields, Seeds
from claims.experiments.text_data import load_corpus

DATA = ("Byte-level language modelling of CPython's own standard-library source (the top-level *.py "
        "files in sorted order, first 3 MB: ~2.65M training tokens from 95 files, ~0.35M validation "
        "tokens from 10 held-out files; vocab 128). One tiny decoder per position scheme (none, learned, "
        "sinusoidal, rope, alibi; QUICK: d_model 128, 2 layers, 8 heads, ~0.43M parameters, trained at "
        "L = 32 tokens for 200 steps × 32 windows ≈ 0.2M tokens; FULL: 4 layers, 400 steps, ~4× the compute), "
        "evaluated on 64 (FULL: 128) fixed validation windows at 1×, 2×, 4× and 8× L. Far smaller than "
        "the papers' models and lengths: a check of the direction of each claim.")

SCHEMES = ("none", "learned", "sinusoidal", "rope", "alibi")


@dataclass(frozen=True)
class Setup(LMSetup):
    schemes: tuple[str, ...] = SCHEMES
    multiples: tuple[int, ...] = (1, 2, 4, 8)    # evaluation lengths in units of seq_len (the first must be 1)


QUICK = Setup(d_model=128, n_layers=2, n_heads=8, seq_len=32, steps=200, batch=32, lr=3e-3, warmup=20,
              eval_windows=64, eval_batch=16)
FULL = Setup(d_model=128, n_layers=4, n_heads=8, seq_len=32, steps=400, batch=32, lr=3e-3, warmup=40,
             eval_windows=128, eval_batch=16)


def arch(s: Setup, scheme: str) -> dict:
    return s.arch(positions=scheme, max_seq_len=s.seq_len)     # learned table exactly L long


def at_length(model: nn.Module, windows: Tensor, L: int, batch: int) -> Fields:
    """Loss and accuracy over all positions of ``windows``, over the first L and past L (None at 1×L),
    and per block of L; all None, with the error, where the model cannot run that long."""
    try:
        loss, acc = position_losses(model, windows, batch)
    except ValueError as exc:                   # learned positions past max_seq_len
        return {"loss": None, "acc": None, "loss_first_L": None, "loss_beyond_L": None, "blocks": None,
                "error": str(exc)}
    return {"loss": float(loss.mean()), "acc": float(acc.mean()), "loss_first_L": float(loss[:L].mean()),
            "loss_beyond_L": float(loss[L:].mean()) if len(loss) > L else None,
            "blocks": [float(b.mean()) for b in loss.split(L)], "error": None}


def by_multiple(seeds: Fields, k: int, L: int, base: list[float]) -> Fields:
    """One evaluation length's per-seed lists (from :func:`at_length`), with the ratios to the loss at 1×L."""
    errors = [e for e in seeds["error"] if e]
    m = {"length": k * L, "available": not errors, "error": errors[-1] if errors else None,
         "loss": seeds["loss"], "acc": seeds["acc"], "loss_first_L": seeds["loss_first_L"],
         "loss_beyond_L": seeds["loss_beyond_L"] if k > 1 else None,
         "ratio_vs_1x": [None if x is None else x / b for x, b in zip(seeds["loss"], base)]}
    if k > 1:
        m["ratio_beyond_L_vs_1x"] = [None if x is None else x / b for x, b in zip(seeds["loss_beyond_L"], base)]
    return m


def lengths(s: Setup, model: nn.Module, seed: int) -> Fields:
    """:func:`at_length` at every evaluation length's fixed validation windows (module-level: a worker runs it)."""
    val = load_corpus(s.corpus_bytes).val
    return {"at": {str(k): at_length(model, eval_windows(val, k * s.seq_len, s.eval_windows), s.seq_len, s.eval_batch)
                   for k in s.multiples}}


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    if s.multiples[0] != 1:
        raise ValueError("the first evaluation multiple must be 1 (the training length)")
    corpus = load_corpus(s.corpus_bytes)
    L = s.seq_len
    trained, scale = train_variants(s, seeds, corpus, {x: partial(build_lm, **arch(s, x)) for x in s.schemes},
                                    partial(lengths, s))
    schemes = {}
    for name, t in trained.items():
        at = t.pop("at")
        schemes[name] = {**t, "by_multiple": {str(k): by_multiple(at[str(k)], k, L, at["1"]["loss"])
                                              for k in s.multiples},
                         # per seed: loss over each block of L positions at the longest length
                         "detail": {"loss_per_block_of_L": at[str(s.multiples[-1])]["blocks"]}}
    return {"data": corpus.info(), "train_len": L, "eval_lengths": [k * L for k in s.multiples],
            "schemes": schemes}, scale


EXPERIMENT = Experiment("C14-C16", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
