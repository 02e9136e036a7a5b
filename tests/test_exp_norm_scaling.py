"""The C17 (norm placement) and C07 (attention scaling) experiments, at tiny sizes."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from claims.experiments import attn_scaling as AS
from claims.experiments import norm_placement as NP

TINY_TASK = NP.Task(n_symbols=6, length=4)
NP_TINY = replace(NP.QUICK, task=TINY_TASK, d_model=16, n_heads=2, grad_depths=(1, 3), grad_batch=8,
                  lrs=(1e-3, 1e-2), depth=2, steps=4, batch=8, held_out=16, repeats=2)
AS_TINY = replace(AS.QUICK, d_ks=(16, 256), n_rows=64, task=TINY_TASK, d_model=32, n_heads=1,
                  n_layers=1, steps=4, probe_at=(2,), batch=8, held_out=16)
SEEDS = (0, 1)


def _strip_wall(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "scale"}


# ------------------------------------------------------------------------------------------------
# The task
# ------------------------------------------------------------------------------------------------

def test_copy_task_batches():
    task = NP.Task(n_symbols=5, length=3)
    x = NP.make_batch(task, 10, torch.Generator().manual_seed(0))
    assert x.shape == (10, task.seq_len) == (10, 7)
    assert torch.equal(x[:, :3], x[:, 4:]) and (x[:, 3] == 0).all()
    assert x[:, :3].min() >= 1 and x[:, :3].max() <= 5
    y = NP.make_batch(task, 10, torch.Generator().manual_seed(0))
    assert torch.equal(x, y)
    assert task.trivial_loss == pytest.approx(math.log(5))


def test_a_perfect_copier_gets_zero_loss_and_full_accuracy():
    task = NP.Task(n_symbols=5, length=3)

    class Oracle(torch.nn.Module):                    # logits that put all mass on the token n back
        def forward(self, tokens):
            nxt = torch.roll(tokens, task.length, dims=1)      # nxt[p] = tokens[p - n]
            return 50.0 * torch.nn.functional.one_hot(nxt, task.vocab).float()

    x = NP.make_batch(task, 16, torch.Generator().manual_seed(1))
    loss, acc = NP.task_loss(Oracle(), x, task)
    assert float(loss) < 1e-6 and float(acc) == 1.0


def test_divergence_flag():
    task = NP.Task()
    ok = dict(nonfinite=False, init_loss=3.0, final_loss=0.5)
    assert not NP.diverged(ok, task)
    assert NP.diverged({**ok, "nonfinite": True, "final_loss": math.inf}, task)
    assert NP.diverged({**ok, "final_loss": 3.5}, task)                    # worse than at init
    stalled = {**ok, "final_loss": task.trivial_loss + 0.01}              # no better than chance
    assert not NP.diverged(stalled, task) and NP.never_learned(stalled, task)   # did not learn, did not diverge


# ------------------------------------------------------------------------------------------------
# C07 (a): numeric
# ------------------------------------------------------------------------------------------------

def test_variance_of_qk_unscaled_is_d_k_scaled_is_one():
    res = AS.numeric(AS_TINY, SEEDS)
    for d_k in AS_TINY.d_ks:
        r = res[str(d_k)]
        assert len(r["var_unscaled"]) == len(SEEDS)
        for vu, vs in zip(r["var_unscaled"], r["var_scaled"]):
            assert vu == pytest.approx(d_k, rel=0.15)
            assert vs == pytest.approx(1.0, rel=0.15)


def test_unscaled_softmax_saturates_and_its_jacobian_vanishes():
    res = AS.numeric(AS_TINY, SEEDS)
    for d_k in (k for k in AS_TINY.d_ks if k >= 256):
        r = res[str(d_k)]
        for i in range(len(SEEDS)):
            assert r["saturated_unscaled"][i] > r["saturated_scaled"][i]
            assert r["jacobian_median_unscaled"][i] < r["jacobian_median_scaled"][i]
            assert r["vanished_unscaled"][i] > r["vanished_scaled"][i]


def test_jacobian_closed_form_matches_the_matrix():
    p = torch.randn(5, 9, dtype=torch.float64).mul(3).softmax(-1)
    explicit = torch.stack([torch.linalg.matrix_norm(torch.diag(r) - torch.outer(r, r)) for r in p])
    torch.testing.assert_close(AS.jacobian_frobenius(p), explicit)
    one_hot = torch.zeros(1, 9, dtype=torch.float64)
    one_hot[0, 2] = 1.0
    assert float(AS.jacobian_frobenius(one_hot)) == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------------------------------------
# C17 (a): gradient norms at init
# ------------------------------------------------------------------------------------------------

def test_grad_norm_at_init_has_one_finite_entry_per_depth_placement_seed():
    res = NP.grad_norm_at_init(NP_TINY, SEEDS)
    assert set(res) == {str(d) for d in NP_TINY.grad_depths}
    for row in res.values():
        assert set(row) == set(NP.PLACEMENTS)
        for entry in row.values():
            for key in ("first_layer", "last_layer", "residual_growth"):
                assert len(entry[key]) == len(SEEDS)
                assert all(math.isfinite(x) and x > 0 for x in entry[key])
    # the seeds initialise differently
    assert res["1"]["pre"]["last_layer"][0] != res["1"]["pre"]["last_layer"][1]


# ------------------------------------------------------------------------------------------------
# The runs: structure, JSON, determinism
# ------------------------------------------------------------------------------------------------

def test_norm_placement_run_structure_and_determinism():
    r = NP.run(seeds=SEEDS, setup=NP_TINY)
    json.dumps(r, allow_nan=False)
    n_cells = len(NP.PLACEMENTS) * len(NP_TINY.lrs)
    assert len(r["grid"]) == n_cells
    runs = len(SEEDS) * NP_TINY.repeats                       # every learning rate × run, each placement
    assert r["run_seeds"] == [0, 1000, 1, 1001]
    for cell in r["grid"].values():
        for key in ("final_loss", "final_acc", "init_loss", "diverged", "never_learned", "failed", "nonfinite"):
            assert len(cell[key]) == runs
        assert cell["warmup"] == 0.0 and cell["depth"] == NP_TINY.depth
        assert cell["failed"] == [d or s for d, s in zip(cell["diverged"], cell["never_learned"])]
        assert cell["failure_rate"] == sum(cell["failed"]) / runs
    s = r["summary"]
    for key in ("failure_rate", "divergence_rate", "never_learned_rate"):
        assert set(s[key]) == set(NP.PLACEMENTS) and all(0.0 <= v <= 1.0 for v in s[key].values())
    assert all(len(s["lr_spread"][p]) == runs for p in NP.PLACEMENTS)
    assert all(len(s["failure_rate_by_lr"][p]) == len(NP_TINY.lrs) for p in NP.PLACEMENTS)
    sc = r["scale"]
    assert sc["steps"] == NP_TINY.steps and sc["seq_len"] == TINY_TASK.seq_len
    assert sc["wall_seconds"] > 0 and sc["params"]["2"] > sc["params"]["1"] > 0
    assert _strip_wall(NP.run(seeds=SEEDS, setup=NP_TINY)) == _strip_wall(r)


def test_attn_scaling_run_structure_and_determinism():
    r = AS.run(seeds=SEEDS, setup=AS_TINY)
    json.dumps(r, allow_nan=False)
    assert set(r["numeric"]) == {str(d) for d in AS_TINY.d_ks} | {"uniform_jacobian"}
    assert set(r["training"]) == set(AS.VARIANTS)
    for name, v in r["training"].items():
        for key in ("init_grad_q", "init_grad_k", "init_logit_std", "init_saturated", "final_loss",
                    "final_acc", "init_loss"):
            assert len(v[key]) == len(SEEDS), key
        assert set(v["loss_at"]) == {"2"} and len(v["loss_at"]["2"]) == len(SEEDS)
        assert all(math.isfinite(x) and x > 0 for x in v["init_grad_q"] + v["init_grad_k"])
    # unscaled logits are √d_head times the scaled ones at init (same seed, same weights)
    ratio = [u / s for u, s in zip(r["training"]["unscaled"]["init_logit_std"],
                                   r["training"]["scaled"]["init_logit_std"])]
    assert ratio == pytest.approx([math.sqrt(AS_TINY.d_model // AS_TINY.n_heads)] * len(SEEDS), rel=1e-4)
    assert r["scale"]["d_head"] == 32 and r["scale"]["params"] > 0
    assert _strip_wall(AS.run(seeds=SEEDS, setup=AS_TINY)) == _strip_wall(r)


def test_presets_are_within_the_contract():
    for mod in (NP, AS):
        assert isinstance(mod.DATA, str) and len(mod.DATA) > 100
        assert mod.FULL != mod.QUICK
    assert NP.FULL.steps >= NP.QUICK.steps and AS.FULL.steps >= AS.QUICK.steps
