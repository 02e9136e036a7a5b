"""C18: a decoder without the causal mask "cheats" by seeing the future.

Two byte-level decoders are trained identically, one with the mask (``causal=True``) and one without
(``causal=False``). Without the mask, position i's target (token i+1) is in its own input, so the
training loss falls far lower — by copying, not by modelling. The honest evaluation is the one
generation faces: predict token T from the prefix of T tokens alone (the final position of a
validation prefix; nothing after it exists). A direct check: change every token after position i and
measure the largest change of the logits at positions ≤ i (≈0 with the mask; not without).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from architectures.transformer import counterfactual
from claims.experiments.lm_train import (LMSetup, SharedBuild, build_lm, eval_windows, last_position_loss,
                                         position_losses, shared_key, train_variants)
from claims.experiments.runner import Experiment, Fields, Seeds
from claims.experiments.text_data import VOCAB, load_corpus

DATA = ("Byte-level language modelling of CPython's own standard-library source (the top-level *.py "
        "files in sorted order, first 3 MB: ~2.65M training tokens from 95 files, ~0.35M validation "
        "tokens from 10 held-out files; vocab 128). Two tiny decoders per seed, with and without the "
        "causal mask (QUICK: d_model 128, 2 layers, 8 heads, ~0.43M parameters, 200 steps × 32 windows × "
        "64 tokens ≈ 0.4M tokens each; FULL: 4 layers, 400 steps, ~4× the compute). Honest evaluation on 512 "
        "(FULL: 1024) fixed validation prefixes, predicting the token after each.")

MODELS = {"causal": True, "no_mask": False}
PREFIX_SEED = 4321


@dataclass(frozen=True)
class Setup(LMSetup):
    prefixes: int = 512          # validation prefixes for the generation-time (last-position) loss
    check_batch: int = 4         # sequences in the future-change check


QUICK = Setup(d_model=128, n_layers=2, n_heads=8, seq_len=64, steps=200, batch=32, lr=3e-3, warmup=20,
              eval_windows=128, prefixes=512)
FULL = Setup(d_model=128, n_layers=4, n_heads=8, seq_len=64, steps=400, batch=32, lr=3e-3, warmup=40,
             eval_windows=256, prefixes=1024)


def build(s: Setup, causal: bool, seed: int) -> torch.nn.Module:
    """The decoder of ``s`` initialised from ``seed``, with or without its causal mask (the same weights)."""
    return counterfactual(build_lm(seed, **s.arch()), causal=causal)


@torch.no_grad()
def future_change(model: torch.nn.Module, tokens: torch.Tensor, i: int, seed: int = 0) -> float:
    """Max |Δ logits| at positions 0..i when every token after i is replaced by random ones."""
    model.eval()
    changed = tokens.clone()
    g = torch.Generator().manual_seed(seed)
    changed[:, i + 1:] = torch.randint(0, VOCAB, changed[:, i + 1:].shape, generator=g)
    a, b = model(tokens)[:, : i + 1], model(changed)[:, : i + 1]
    return float((a - b).abs().max())


def honest_eval(s: Setup, model: torch.nn.Module, seed: int) -> Fields:
    """All-position loss (the future visible if no mask), the generation-time last-position loss on fixed
    prefixes, and the future-change check (module-level: a worker process runs it)."""
    val = load_corpus(s.corpus_bytes).val
    val_windows = eval_windows(val, s.seq_len, s.eval_windows)
    prefixes = eval_windows(val, s.seq_len, s.prefixes, seed=PREFIX_SEED)
    check = val_windows[: s.check_batch, :-1]
    loss, acc = position_losses(model, val_windows, s.eval_batch)
    gen = last_position_loss(model, prefixes, s.eval_batch)
    return {"val_loss_all_positions": float(loss.mean()), "val_acc_all_positions": float(acc.mean()),
            "gen_loss_last_position": gen["loss"], "gen_acc_last_position": gen["acc"],
            "future_change_max_abs": future_change(model, check, s.seq_len // 2, seed)}


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    corpus = load_corpus(s.corpus_bytes)
    honest = partial(honest_eval, s)
    builds = {n: partial(build, s, c) for n, c in MODELS.items()}
    builds["causal"] = SharedBuild(builds["causal"], shared_key(**s.arch()))    # kv_heads' MHA: trained once
    trained, scale = train_variants(s, seeds, corpus, builds, honest)
    models = {name: {"causal": MODELS[name], **m} for name, m in trained.items()}
    c, n = models["causal"], models["no_mask"]
    gap = {key: [a - b for a, b in zip(n[key], c[key])] for key in ("train_loss", "gen_loss_last_position")}
    return {"data": corpus.info(), "models": models, "no_mask_minus_causal": gap}, scale


EXPERIMENT = Experiment("C18", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
