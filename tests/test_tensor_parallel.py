"""Tensor parallelism (``parallel = "tp"``) on 2 gloo ranks: the split decoder's logits equal the whole model's (a
forward, and a generation's prefill and decode step), each rank holds its share of the weights and of the KV cache,
the all-reduce bytes counted equal those derived, and a model the ranks cannot split is refused before anything
runs. A wrong shard ending as an error: tests/test_ranks.py (the fault sweep, through the process executor)."""
from __future__ import annotations

import pytest
import torch

from harness.contract.errors import BenchInputError
from harness.contract.registry import resolve
from harness.contract.spec import Case, Workload
from harness.engine import ranks
from harness.engine.models import materialize
from harness.engine.runner import RunOptions, run_case
from harness.engine.tensor_parallel import LOGIT_TOLERANCE
from harness.instruments.timing import TimingConfig
from reports.ranks_view import rank_rows
from tests.helpers import invoke

FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=5.0, rounds=1)
# grouped k/v heads (2 over 4 query heads), a gated MLP and RoPE: every part of the split that has a layout
GQA = (("n_kv_heads", 2), ("activation", "swiglu"), ("d_ff", 256), ("positions", "rope"))
B, T, P, N = 2, 16, 8, 4


def tp_case(mode: str, overrides: tuple = ()) -> Case:
    kw = {"seq_len": T} if mode == "fwd" else {"prompt_len": P, "new_tokens": N}
    w = Workload(batch_size=B, mode=mode, world_size=2, parallel="tp", **kw)
    return Case("tp", mode, "decoder-tiny", overrides, w, ("latency", "memory"))


@pytest.fixture(scope="module")
def measured() -> dict:
    """decoder-tiny's forward (MHA) and a generation (GQA, SwiGLU, RoPE) on 2 gloo ranks, split."""
    opts = RunOptions(timing=FAST, timeout_s=240)
    return {"fwd": run_case(tp_case("fwd"), opts), "generate": run_case(tp_case("generate", GQA), opts)}


def whole_and_split_weights(overrides: tuple) -> tuple[int, int]:
    """The whole model's parameter bytes and rank 0's after the split (split here, with no ranks: the reduction is
    never called while splitting)."""
    spec = resolve("decoder-tiny", **dict(overrides))
    model = materialize(spec, Workload(seq_len=T), torch.device("cpu"))
    whole = sum(p.nbytes for p in model.parameters())
    model.split_heads(0, 2, lambda t: t)
    return whole, sum(p.nbytes for p in model.parameters())


@pytest.mark.parametrize("mode", ["fwd", "generate"])
def test_logits_equal_the_whole_models(measured, mode):
    rec = measured[mode]
    assert rec.status == "ok", rec.message
    assert rec.metrics["logit_max_rel_err"] <= LOGIT_TOLERANCE["fp32"] == 1e-5
    assert "share this machine's" in rec.message and "not speed" in rec.message


@pytest.mark.parametrize("mode", ["fwd", "generate"])
def test_each_rank_holds_its_share_of_the_weights(measured, mode):
    m = measured[mode].metrics
    whole, split = whole_and_split_weights(GQA if mode == "generate" else ())
    assert split < whole
    assert m["rank0_weight_bytes"] == m["rank1_weight_bytes"] == split     # the blocks halved, embeddings whole
    assert m["peak_bytes"] == max(m["rank0_peak_bytes"], m["rank1_peak_bytes"])


def test_counted_all_reduce_bytes_equal_the_derived(measured):
    cfg = resolve("decoder-tiny").config
    fwd, gen = measured["fwd"].metrics, measured["generate"].metrics
    # two all-reduces per layer of the (B, tokens, d) activations, fp32
    assert fwd["comm_counted_bytes"] == fwd["comm_payload_bytes"] == 2 * cfg.n_layers * B * T * cfg.d_model * 4
    assert fwd["comm_calls"] == 2 * cfg.n_layers
    assert gen["comm_counted_bytes"] == gen["comm_payload_bytes"] == 2 * cfg.n_layers * B * (P + N - 1) * cfg.d_model * 4
    assert gen["comm_calls"] == 2 * cfg.n_layers * N                         # the prefill, then N - 1 decode steps
    assert fwd["comm_counted_bytes_per_rank"] == fwd["comm_counted_bytes"]   # ring all-reduce, N = 2: 2 (N-1)/N


def test_rates_count_one_batch_for_all_ranks(measured):
    fwd, gen = measured["fwd"].metrics, measured["generate"].metrics
    assert fwd["tokens_per_s"] == pytest.approx(B * T / (fwd["median_ms"] / 1e3))
    assert fwd["tokens_per_s_per_rank"] == pytest.approx(fwd["tokens_per_s"] / 2)
    assert "flops_all_ranks" not in fwd
    assert gen["output_tokens_per_s_per_rank"] == pytest.approx(gen["output_tokens_per_s"] / 2)
    assert gen["tpot_ms"] > 0 and gen["ttft_ms"] > 0
    cfg = resolve("decoder-tiny", **dict(GQA)).config                     # each rank caches its own k/v heads
    assert gen["kv_cache_bytes"] == 2 * cfg.n_layers * B * (cfg.n_kv_heads // 2) * (P + N) * cfg.head_dim * 4


def test_the_report_shows_tp_cases(measured):
    rows = rank_rows([measured["fwd"], measured["generate"]])
    assert [r["parallel"] for r in rows] == ["tp", "tp"]
    assert rows[1]["unit"] == "output tokens/s"
    assert rows[0]["check"].startswith("logits")


def test_a_model_tp_cannot_split_is_refused(tmp_path):
    w = Workload(batch_size=2, seq_len=16, mode="fwd", world_size=2, parallel="tp")
    with pytest.raises(BenchInputError, match="cannot split over ranks"):
        ranks.check_ranks(resolve("vit-micro"), w)
    with pytest.raises(BenchInputError, match="do not divide its 1 k/v heads"):
        ranks.check_ranks(resolve("decoder-tiny", n_kv_heads=1), w)
    with pytest.raises(BenchInputError, match="runs mode fwd or generate"):
        Workload(mode="train_step", world_size=2, parallel="tp")
    suite = tmp_path / "tp.toml"
    suite.write_text('name = "tp"\nfixed = { batch_size = 2, mode = "fwd", world_size = 2, parallel = "tp" }\n'
                     '[lines]\n"vit" = { arch = "vit-micro" }\n')
    result = invoke("run", str(suite), "--dry-run", "--store", f"sqlite:///{tmp_path / 'r.db'}")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "vit-micro (vit) cannot split over ranks" in lines[0], lines
