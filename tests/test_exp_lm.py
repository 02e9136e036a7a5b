"""The LM accuracy experiments (C10/C11 kv_heads, C14–C16 positions, C18 causal) at tiny sizes."""
from __future__ import annotations

import json
import math

import pytest
import torch

from claims.experiments import causal, kv_heads, lm_train, positions
from architectures.transformer import counterfactual
from claims.experiments.lm_train import build_lm
from claims.experiments.text_data import VOCAB, load_corpus, recall_task, sample_batch
from harness.instruments.flops import count_params

TINY = dict(d_model=32, n_layers=1, n_heads=4, seq_len=8, steps=3, batch=4, warmup=1, eval_windows=4,
            eval_batch=4, corpus_bytes=200_000)


def test_corpus_is_deterministic_real_text_split_by_file():
    a = load_corpus(200_000)
    load_corpus.cache_clear()
    b = load_corpus(200_000)
    assert a is not b and torch.equal(a.train, b.train) and torch.equal(a.val, b.val) and a.sha256 == b.sha256
    assert a.files_train >= 9 and a.files_val >= 1
    assert a.train.numel() > 100_000 and a.val.numel() > 1_000
    assert 0 <= int(a.train.min()) and int(a.train.max()) < VOCAB
    assert len(torch.unique(a.train)) > 60                               # real text, not a constant
    text = bytes(a.train[:200_000].tolist())
    assert b"def " in text and b"import " in text
    x1, y1 = sample_batch(a.train, 3, 16, torch.Generator().manual_seed(5))
    x2, y2 = sample_batch(a.train, 3, 16, torch.Generator().manual_seed(5))
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])      # targets = inputs shifted by one


def test_recall_task_answer_is_the_value_of_the_queried_key():
    tokens, answer = recall_task(5, 4, 32, torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 9)
    for row, ans in zip(tokens, answer):
        pairs = row[:-1].view(4, 2)
        assert int(pairs[pairs[:, 0] == row[-1], 1]) == int(ans)


@pytest.mark.parametrize("kv", [2, 1])
def test_gqa_mqa_params_matched_to_mha_within_1_percent(kv):
    s = kv_heads.QUICK
    mha = kv_heads.count(s, s.n_heads)
    d_ff = kv_heads.matched_d_ff(s, kv)
    assert d_ff > 4 * s.d_model                                             # the FFN was widened
    assert abs(kv_heads.count(s, kv, d_ff) / mha - 1) < 0.01
    assert abs(kv_heads.count(s, kv) / mha - 1) > 0.01                      # unmatched it would not be


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_kv_bytes_formula_equals_real_cache(kv):
    s = kv_heads.Setup(**{**TINY, "n_layers": 2})
    model = build_lm(0, **kv_heads.arch(s, kv))
    tokens = torch.randint(0, VOCAB, (3, 5))
    assert kv_heads.measured_kv_bytes_per_token(model, tokens) == kv_heads.kv_bytes_per_token(s, kv, 4)
    assert kv_heads.kv_bytes_per_token(s, kv, 4) == 2 * 2 * kv * 8 * 4


def test_kv_heads_run_structure_and_determinism():
    s = kv_heads.Setup(**TINY, kv_heads=(4, 2, 1))
    r = kv_heads.run(seeds=(0, 1), setup=s)
    json.dumps(r)
    assert list(r["variants"]) == ["MHA", "GQA-2", "MQA"]
    for v in r["variants"].values():
        for key in ("val_loss", "val_acc", "rel_loss_vs_mha", "rel_acc_vs_mha", "train_loss"):
            assert len(v[key]) == 2 and all(isinstance(x, float) for x in v[key]), key
        assert all(math.isfinite(x) for x in v["val_loss"])
        assert v["kv_bytes_match"] and abs(v["params_rel_to_mha"]) < 0.01
    assert r["variants"]["MHA"]["rel_loss_vs_mha"] == [0.0, 0.0]
    assert r["variants"]["MQA"]["kv_cache_ratio_vs_mha"] == 0.25
    assert r["variants"]["GQA-2"]["kv_cache_ratio_vs_mha"] == 0.5
    assert set(r["scale"]) >= {"params", "tokens_trained", "steps", "seq_len", "wall_seconds"}
    assert r["variants"]["MQA"]["val_loss"][0] != r["variants"]["MQA"]["val_loss"][1]   # seeds differ
    lm_train.TRAINED.clear()                      # train again, not the weights this process keeps (SharedBuild)
    again = kv_heads.run(seeds=(1,), setup=s)
    assert again["variants"]["MQA"]["val_loss"] == r["variants"]["MQA"]["val_loss"][1:]


def test_positions_run_records_learned_past_max_len_as_unavailable():
    s = positions.Setup(**TINY, multiples=(1, 2, 4))
    r = positions.run(seeds=(0, 1), setup=s)
    json.dumps(r)
    assert list(r["schemes"]) == list(positions.SCHEMES) and r["eval_lengths"] == [8, 16, 32]
    learned = r["schemes"]["learned"]["by_multiple"]
    assert learned["1"]["available"] and all(math.isfinite(x) for x in learned["1"]["loss"])
    for k in ("2", "4"):
        assert not learned[k]["available"] and "learned positions cover 8" in learned[k]["error"]
        assert learned[k]["loss"] == [None, None] and learned[k]["loss_beyond_L"] == [None, None]
    for scheme in ("none", "sinusoidal", "rope", "alibi"):
        by = r["schemes"][scheme]["by_multiple"]
        assert by["1"]["loss_beyond_L"] is None and by["1"]["ratio_vs_1x"] == [1.0, 1.0]
        for k in ("2", "4"):
            assert by[k]["available"] and len(by[k]["loss"]) == 2 and len(by[k]["loss_beyond_L"]) == 2
            assert all(math.isfinite(x) for x in by[k]["loss"] + by[k]["loss_beyond_L"] + by[k]["ratio_vs_1x"])
        assert len(r["schemes"][scheme]["detail"]["loss_per_block_of_L"][0]) == 4


def test_causal_run_structure_and_future_check():
    s = causal.Setup(**{**TINY, "seq_len": 16}, prefixes=8)
    r = causal.run(seeds=(0, 1), setup=s)
    json.dumps(r)
    c, n = r["models"]["causal"], r["models"]["no_mask"]
    for m in (c, n):
        for key in ("train_loss", "val_loss_all_positions", "gen_loss_last_position", "future_change_max_abs"):
            assert len(m[key]) == 2 and all(isinstance(x, float) for x in m[key]), key
    assert max(c["future_change_max_abs"]) < 1e-5                           # the mask hides the future
    assert min(n["future_change_max_abs"]) > 1e-3                           # without it the past sees it
    assert len(r["no_mask_minus_causal"]["train_loss"]) == 2


def test_future_change_detects_the_mask_on_an_untrained_model():
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    masked = build_lm(0, d_model=32, n_layers=1, n_heads=4)
    open_ = counterfactual(build_lm(0, d_model=32, n_layers=1, n_heads=4), causal=False)
    assert causal.future_change(masked, tokens, 5) < 1e-5
    assert causal.future_change(open_, tokens, 5) > 1e-3
    assert count_params(masked) == count_params(open_)
