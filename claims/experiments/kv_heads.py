"""C10/C11: multi-query (1 K/V head) and grouped-query (n_heads → fewer K/V heads) attention.

Claims: MQA gives a much smaller KV cache and faster inference for ~1–2% accuracy loss; GQA
(32 Q → 8 K/V heads) gives a 4× smaller cache with minimal loss. We train byte-level decoder LMs
with MHA, GQA and MQA at matched parameter counts — as Shazeer (2019) did, the FFN of GQA/MQA is
widened to give back the parameters of the removed K/V projections — on the same data with the
same seeds, and compare validation loss / next-token accuracy per seed. The KV-cache size per
token comes from the config (2 · layers · kv_heads · d_head · bytes) and is checked against the
bytes a real generation state (a static KV cache per layer) holds after a prefill.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from architectures.transformer_cost import decoder_params, kv_cache_bytes
from claims.experiments.lm_train import LMSetup, SharedBuild, build_lm, shared_key, train_variants, val_metrics
from claims.experiments.runner import Experiment, Fields, Seeds, relative
from claims.experiments.text_data import VOCAB, load_corpus
from harness.contract.registry import resolve

DATA = ("Byte-level language modelling of CPython's own standard-library source (the top-level *.py "
        "files in sorted order, first 3 MB: ~2.65M training tokens from 95 files, ~0.35M validation "
        "tokens from 10 held-out files; vocab 128). Tiny decoders (QUICK: d_model 128, 2 layers, "
        "8 query heads, ~0.43M parameters, 200 steps × 32 windows × 64 tokens ≈ 0.4M tokens per model; "
        "FULL: 4 layers, 400 steps, ~4× the compute) with MHA (8 K/V heads), GQA (2 K/V heads) and MQA "
        "(1 K/V head), FFN widened to match MHA's parameter count within 1%. Evaluated on 128 (FULL: "
        "256) fixed validation windows. Orders of magnitude smaller than the papers' models: the "
        "accuracy differences test the direction of the claim, not its size at scale.")


@dataclass(frozen=True)
class Setup(LMSetup):
    kv_heads: tuple[int, ...] = (8, 2, 1)      # first = n_heads: the MHA reference
    cache_dtype_bytes: int = 2                 # the per-token cache size reported at bf16/fp16


QUICK = Setup(d_model=128, n_layers=2, n_heads=8, seq_len=64, steps=200, batch=32, lr=3e-3, warmup=20,
              eval_windows=128)
FULL = Setup(d_model=128, n_layers=4, n_heads=8, seq_len=64, steps=400, batch=32, lr=3e-3, warmup=40,
             eval_windows=256)


def variant_name(kv: int, n_heads: int) -> str:
    return "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}"


def arch(s: Setup, kv: int, d_ff: int | None = None) -> dict:
    return s.arch(n_kv_heads=kv, **({"d_ff": d_ff} if d_ff else {}))


def _config(s: Setup, kv: int, d_ff: int | None = None) -> Any:
    return resolve("decoder-tiny", vocab_size=VOCAB, **arch(s, kv, d_ff)).config


def count(s: Setup, kv: int, d_ff: int | None = None) -> int:
    """Parameters of the variant (the exact analytic count; tests check it against the built model)."""
    return decoder_params(_config(s, kv, d_ff))


def matched_d_ff(s: Setup, kv: int) -> int:
    """The FFN width that gives ``kv`` K/V heads the MHA parameter count (params are linear in d_ff)."""
    base_ff = _config(s, kv).ff_dim
    target = count(s, s.n_heads, base_ff)
    p0, p1 = count(s, kv, base_ff), count(s, kv, base_ff + 1)
    return base_ff + round((target - p0) / (p1 - p0))


def kv_bytes_per_token(s: Setup, kv: int, dtype_bytes: int) -> int:
    """2 (K and V) · layers · kv_heads · d_head · bytes."""
    return kv_cache_bytes(_config(s, kv), 1, 1, dtype_bytes)


@torch.no_grad()
def measured_kv_bytes_per_token(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    """Bytes held by the model's real generation state (sized for ``tokens``) after a prefill of them, per token."""
    state = model.generation_state(*tokens.shape)
    model.prefill(tokens, state)
    return state.nbytes() / tokens.numel()


def cache(s: Setup, kv: int, d_ff: int) -> Fields:
    """The variant's K/V heads, FFN width and KV-cache bytes per token (formula, and a real cache at fp32)."""
    probe = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"kv_heads": kv, "d_ff": d_ff,
            "kv_bytes_per_token_formula_fp32": kv_bytes_per_token(s, kv, 4),
            "kv_bytes_per_token_measured_fp32": measured_kv_bytes_per_token(build_lm(0, **arch(s, kv, d_ff)), probe),
            f"kv_bytes_per_token_{8 * s.cache_dtype_bytes}bit": kv_bytes_per_token(s, kv, s.cache_dtype_bytes)}


def vs_mha(v: Fields, mha: Fields) -> Fields:
    """Parameters and cache relative to MHA, and per seed the loss/accuracy relative to MHA trained from the
    same seed on the same batches (+ = worse)."""
    formula = "kv_bytes_per_token_formula_fp32"
    return {"params_rel_to_mha": v["params"] / mha["params"] - 1,
            "kv_cache_ratio_vs_mha": v[formula] / mha[formula],
            "kv_bytes_match": v[formula] == v["kv_bytes_per_token_measured_fp32"],
            "rel_loss_vs_mha": [relative(a, b) for a, b in zip(v["val_loss"], mha["val_loss"])],
            "rel_acc_vs_mha": [relative(a, b) for a, b in zip(v["val_acc"], mha["val_acc"])],
            "acc_diff_vs_mha": [a - b for a, b in zip(v["val_acc"], mha["val_acc"])]}


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    if s.kv_heads[0] != s.n_heads:
        raise ValueError(f"the first variant must be MHA (kv_heads[0] == n_heads == {s.n_heads})")
    corpus = load_corpus(s.corpus_bytes)
    shapes = {variant_name(kv, s.n_heads): (kv, matched_d_ff(s, kv)) for kv in s.kv_heads}   # MHA: base d_ff
    builds = {name: SharedBuild(partial(build_lm, **arch(s, kv, d_ff)), shared_key(**arch(s, kv, d_ff)))
              for name, (kv, d_ff) in shapes.items()}                 # MHA is causal's decoder: trained once
    trained, scale = train_variants(s, seeds, corpus, builds, partial(val_metrics, s))
    variants = {name: {**cache(s, *shapes[name]), **v} for name, v in trained.items()}
    mha = variants[variant_name(s.n_heads, s.n_heads)]
    variants = {name: {**v, **vs_mha(v, mha)} for name, v in variants.items()}
    return {"data": corpus.info(), "variants": variants}, scale


EXPERIMENT = Experiment("C10/C11", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
