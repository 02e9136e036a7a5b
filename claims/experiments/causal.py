"""C18: a decoder without the causal mask "cheats" by seeing the future.

Two byte-level decoders are trained identically, one with the mask (``causal=True``) and one without
(``causal=False``). Without the mask, position i's target (token i+1) is in its own input, so the
training loss falls far lower — by copying, not by modelling. The honest evaluation is the one
generation faces: predict token T from the prefix of T tokens alone (the final position of a
validation prefix; nothing after it exists). A direct check: change every token after position i and
measure the largest change of the logits at positions ≤ i (≈0 with the mask; not without).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from harness.claims.experiments.lm_train import (LMSetup, build_lm, eval_windows, last_position_loss,
                                                 position_losses, train_lm)
from harness.claims.experiments.text_data import VOCAB, load_corpus
from harness.flops import count_params

DATA = ("Byte-level language modelling of CPython's own standard-library source (the top-level *.py "
        "files in sorted order, first 3 MB: ~2.65M training tokens from 95 files, ~0.35M validation "
        "tokens from 10 held-out files; vocab 128). Two tiny decoders per seed, with and without the "
        "causal mask (QUICK: d_model 128, 2 layers, 8 heads, ~0.43M parameters, 200 steps × 32 windows × "
        "64 tokens ≈ 0.4M tokens each; FULL: 4 layers, 400 steps, ~4× the compute). Honest evaluation on 512 "
        "(FULL: 1024) fixed validation prefixes, predicting the token after each.")


@dataclass(frozen=True)
class Setup(LMSetup):
    prefixes: int = 512          # validation prefixes for the generation-time (last-position) loss
    check_batch: int = 4         # sequences in the future-change check


QUICK = Setup(d_model=128, n_layers=2, n_heads=8, seq_len=64, steps=200, batch=32, lr=3e-3, warmup=20,
              eval_windows=128, prefixes=512)
FULL = Setup(d_model=128, n_layers=4, n_heads=8, seq_len=64, steps=400, batch=32, lr=3e-3, warmup=40,
             eval_windows=256, prefixes=1024)


def arch(s: Setup, causal: bool) -> dict:
    return s.arch(causal=causal)


@torch.no_grad()
def future_change(model: torch.nn.Module, tokens: torch.Tensor, i: int, seed: int = 0) -> float:
    """Max |Δ logits| at positions 0..i when every token after i is replaced by random ones."""
    model.eval()
    changed = tokens.clone()
    g = torch.Generator().manual_seed(seed)
    changed[:, i + 1:] = torch.randint(0, VOCAB, changed[:, i + 1:].shape, generator=g)
    a, b = model(tokens)[:, : i + 1], model(changed)[:, : i + 1]
    return float((a - b).abs().max())


def run(quick: bool = True, seeds: tuple[int, ...] = (0, 1, 2), setup: Setup | None = None) -> dict:
    s = setup or (QUICK if quick else FULL)
    t0 = time.perf_counter()
    corpus = load_corpus(s.corpus_bytes)
    val_windows = eval_windows(corpus.val, s.seq_len, s.eval_windows)
    prefixes = eval_windows(corpus.val, s.seq_len, s.prefixes, seed=4321)
    check = val_windows[: s.check_batch, :-1]
    models: dict[str, dict] = {}
    for name, causal in (("causal", True), ("no_mask", False)):
        models[name] = {"causal": causal, "params": count_params(build_lm(0, **arch(s, causal))),
                        "train_loss": [], "loss_curve": [], "val_loss_all_positions": [],
                        "val_acc_all_positions": [], "gen_loss_last_position": [], "gen_acc_last_position": [],
                        "future_change_max_abs": [], "train_seconds": []}
    for seed in seeds:
        for name, entry in models.items():
            model = build_lm(seed, **arch(s, entry["causal"]))
            tr = train_lm(model, corpus.train, s, seed)
            loss, acc = position_losses(model, val_windows, s.eval_batch)
            gen = last_position_loss(model, prefixes, s.eval_batch)
            entry["train_loss"].append(tr["final_loss"])
            entry["loss_curve"].append(tr["losses"])
            entry["train_seconds"].append(tr["seconds"])
            entry["val_loss_all_positions"].append(float(loss.mean()))   # with the future visible if no mask
            entry["val_acc_all_positions"].append(float(acc.mean()))
            entry["gen_loss_last_position"].append(gen["loss"])
            entry["gen_acc_last_position"].append(gen["acc"])
            entry["future_change_max_abs"].append(future_change(model, check, s.seq_len // 2, seed))
    c, n = models["causal"], models["no_mask"]
    return {
        "claim": "C18",
        "setup": asdict(s), "seeds": list(seeds), "data": corpus.info(),
        "models": models,
        "no_mask_minus_causal": {
            "train_loss": [a - b for a, b in zip(n["train_loss"], c["train_loss"])],
            "gen_loss_last_position": [a - b for a, b in zip(n["gen_loss_last_position"],
                                                             c["gen_loss_last_position"])],
        },
        "scale": {"params": {k: v["params"] for k, v in models.items()},
                  "tokens_trained": s.steps * s.batch * s.seq_len, "steps": s.steps, "seq_len": s.seq_len,
                  "models_trained": 2 * len(seeds), "wall_seconds": time.perf_counter() - t0},
    }
