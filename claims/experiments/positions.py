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

import time
from dataclasses import asdict, dataclass

from harness.claims.experiments.lm_train import (LMSetup, build_lm, eval_windows, position_losses,
                                                 train_lm)
from harness.claims.experiments.text_data import load_corpus
from harness.flops import count_params

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


def run(quick: bool = True, seeds: tuple[int, ...] = (0, 1, 2), setup: Setup | None = None) -> dict:
    s = setup or (QUICK if quick else FULL)
    if s.multiples[0] != 1:
        raise ValueError("the first evaluation multiple must be 1 (the training length)")
    t0 = time.perf_counter()
    corpus = load_corpus(s.corpus_bytes)
    L = s.seq_len
    windows = {k: eval_windows(corpus.val, k * L, s.eval_windows) for k in s.multiples}
    schemes: dict[str, dict] = {}
    for scheme in s.schemes:
        schemes[scheme] = {
            "params": count_params(build_lm(0, **arch(s, scheme))), "train_loss": [], "train_seconds": [],
            "by_multiple": {str(k): {"length": k * L, "available": True, "error": None, "loss": [], "acc": [],
                                     "loss_first_L": [], "loss_beyond_L": [] if k > 1 else None}
                            for k in s.multiples},
            # per seed: loss over each block of L positions at the longest length
            "detail": {"loss_per_block_of_L": []},
        }
    for seed in seeds:
        for scheme in s.schemes:
            entry = schemes[scheme]
            model = build_lm(seed, **arch(s, scheme))
            tr = train_lm(model, corpus.train, s, seed)
            entry["train_loss"].append(tr["final_loss"])
            entry["train_seconds"].append(tr["seconds"])
            for k in s.multiples:
                m = entry["by_multiple"][str(k)]
                try:
                    loss, acc = position_losses(model, windows[k], s.eval_batch)
                except ValueError as exc:   # learned positions past max_seq_len
                    m["available"], m["error"] = False, str(exc)
                    m["loss"].append(None)
                    m["acc"].append(None)
                    m["loss_first_L"].append(None)
                    if k > 1:
                        m["loss_beyond_L"].append(None)
                    if k == s.multiples[-1]:
                        entry["detail"]["loss_per_block_of_L"].append(None)
                    continue
                m["loss"].append(float(loss.mean()))
                m["acc"].append(float(acc.mean()))
                m["loss_first_L"].append(float(loss[:L].mean()))
                if k > 1:
                    m["loss_beyond_L"].append(float(loss[L:].mean()))
                if k == s.multiples[-1]:
                    entry["detail"]["loss_per_block_of_L"].append([float(b.mean()) for b in loss.split(L)])
    for entry in schemes.values():
        base = entry["by_multiple"]["1"]["loss"]
        for key, m in entry["by_multiple"].items():
            m["ratio_vs_1x"] = [None if x is None else x / b for x, b in zip(m["loss"], base)]
            if m["loss_beyond_L"] is not None:
                m["ratio_beyond_L_vs_1x"] = [None if x is None else x / b for x, b in zip(m["loss_beyond_L"], base)]
    return {
        "claim": "C14-C16",
        "setup": asdict(s), "seeds": list(seeds), "data": corpus.info(),
        "train_len": L, "eval_lengths": [k * L for k in s.multiples],
        "schemes": schemes,
        "scale": {"params": {n: e["params"] for n, e in schemes.items()},
                  "tokens_trained": s.steps * s.batch * L, "steps": s.steps, "seq_len": L,
                  "models_trained": len(seeds) * len(s.schemes), "wall_seconds": time.perf_counter() - t0},
    }
