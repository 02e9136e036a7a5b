"""The SSM experiments (recall, ssm_lm) at tiny sizes and the C40/C41 probes on synthetic records and results:
the recall task's answers are right by construction, the runs return what the probes read, and each figure
moves with the quantity it measures."""
from __future__ import annotations

import json
import math

import pytest
import torch

from claims.catalog import load_catalog
from claims.experiments import recall, ssm_lm
from claims.probes import generation
from claims.probes import ssm as probe
from claims.model import Evidence
from claims.verdicts import decide
from harness.contract import registry
from harness.instruments.flops import count_params
from harness.contract.records import CaseRecord
from tests.test_claims_generation import _records as generation_records


# -- the recall task -------------------------------------------------------------------------------
def test_recall_answer_is_the_value_paired_with_the_query_key_earlier():
    task = recall.Task(n_pairs=6, n_keys=16, n_values=16)
    tokens, answers = recall.make_batch(task, 20, torch.Generator().manual_seed(3))
    assert tokens.shape == (20, 24) and answers.shape == (20, 6)
    pos = task.query_positions
    for row, ans in zip(tokens, answers):
        keys, values = row[:12:2], row[1:12:2]
        assert len(set(keys.tolist())) == 6 and int(keys.max()) < 16 and int(values.min()) >= 16
        assert sorted(row[pos].tolist()) == sorted(keys.tolist())            # every key is asked once
        for q, a, nxt in zip(row[pos], ans, row[pos + 1]):
            assert int(values[keys == q]) == int(a) == int(nxt)              # its value, given after the query
    again, _ = recall.make_batch(task, 20, torch.Generator().manual_seed(3))
    assert torch.equal(tokens, again)


def test_recall_loss_is_scored_on_the_answers():
    """A model that predicts the next token of its input (an oracle here, where the answers follow the
    queries) scores 1; scored against answers in the wrong order, it does not."""
    task = recall.Task(n_pairs=4, n_keys=8, n_values=8)
    tokens, answers = recall.make_batch(task, 8, torch.Generator().manual_seed(0))

    class Oracle(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            logits = torch.zeros(*x.shape, task.vocab)                        # (B, T, V)
            logits[:, :-1].scatter_(2, x[:, 1:, None], 10.0)
            return logits
    loss, acc = recall.recall_loss(Oracle(), tokens, answers, task)
    assert float(acc) == 1.0 and float(loss) < 1e-3
    assert float(recall.recall_loss(Oracle(), tokens, answers.roll(1, dims=1), task)[1]) < 1.0


def test_recall_setup_validates():
    with pytest.raises(ValueError):
        recall.Setup(pairs=(20,), n_keys=16)
    with pytest.raises(ValueError):
        recall.Setup(ssms=("lstm",))
    with pytest.raises(ValueError):
        recall.Task(n_pairs=9, n_keys=8)


TINY_RECALL = recall.Setup(pairs=(2, 4), n_keys=8, n_values=8, d_model=16, n_layers=1, n_heads=2, steps=3, batch=4,
                           warmup=1, eval_n=8)


def test_recall_run_returns_what_the_probe_reads():
    r = recall.run(seeds=(0, 1), setup=TINY_RECALL)
    json.dumps(r)
    assert list(r["variants"]) == ["attention", "s4d", "mamba"] and r["task"]["pairs"] == [2, 4]
    for v in r["variants"].values():
        for p in ("2", "4"):
            assert len(v["by_pairs"][p]["acc"]) == 2 and all(0 <= a <= 1 for a in v["by_pairs"][p]["acc"])
    att = r["variants"]["attention"]["by_pairs"]["4"]["acc"]
    mamba = r["variants"]["mamba"]["by_pairs"]["4"]["acc"]
    assert r["acc_gap_vs_attention"]["mamba"]["4"] == [a - b for a, b in zip(att, mamba)]
    again = recall.run(seeds=(1,), setup=TINY_RECALL)
    assert again["variants"]["mamba"]["by_pairs"]["4"]["loss"] == r["variants"]["mamba"]["by_pairs"]["4"]["loss"][1:]
    figs = probe.recall_figures(r, None)
    assert set(figs) == {f for f in probe.RECALL_FIGURES if not f.startswith("lm_")}


# -- ssm_lm ------------------------------------------------------------------------------------------
def test_ssm_params_formula_equals_the_built_model():
    over = {"d_model": 32, "n_layers": 3, "d_state": 8, "expand": 2}
    for preset in ssm_lm.SSMS.values():
        assert ssm_lm.ssm_params(preset, **over) == count_params(ssm_lm.build_ssm(preset, 0, **over))


@pytest.mark.parametrize("name", list(ssm_lm.SSMS))
def test_quick_ssms_are_parameter_matched_to_the_decoder(name):
    """Matched by width at the decoder's depth, with the preset's own N and expansion (never a bigger state)."""
    s = ssm_lm.QUICK
    target = ssm_lm.attention_params(s)
    over = ssm_lm.match(s, ssm_lm.SSMS[name], target)
    assert set(over) == {"d_model", "n_layers"} and over["n_layers"] == s.n_layers
    assert abs(ssm_lm.ssm_params(ssm_lm.SSMS[name], **over) / target - 1) <= s.match_tol
    model = ssm_lm.build_ssm(ssm_lm.SSMS[name], 0, **over)
    preset = registry.get(ssm_lm.SSMS[name]).config
    assert model.cfg.d_state == preset.d_state and model.cfg.expand == preset.expand
    tight = ssm_lm.Setup(**{**vars(s), "match_tol": 0.001})               # a tighter bar still lands near
    err = ssm_lm.ssm_params(ssm_lm.SSMS[name], **ssm_lm.match(tight, ssm_lm.SSMS[name], target)) / target - 1
    assert abs(err) <= s.match_tol


TINY_LM = dict(d_model=32, n_layers=1, n_heads=4, seq_len=8, steps=3, batch=4, warmup=1, eval_windows=4,
               eval_batch=4, corpus_bytes=200_000, match_tol=0.2)


def test_ssm_lm_run_returns_what_the_probe_reads():
    r = ssm_lm.run(seeds=(0, 1), setup=ssm_lm.Setup(**TINY_LM))
    json.dumps(r)
    assert list(r["variants"]) == ["attention", "s4d", "mamba"]
    for v in r["variants"].values():
        for key in ("val_loss", "val_acc", "rel_loss_vs_attention", "acc_diff_vs_attention"):
            assert len(v[key]) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in v[key]), key
        assert abs(v["params_rel_to_attention"]) <= 0.2
    assert r["variants"]["attention"]["rel_loss_vs_attention"] == [0.0, 0.0]
    assert r["variants"]["mamba"]["config"]["preset"] == "mamba-lm-tiny"


# -- the probes ----------------------------------------------------------------------------------------
def _recall_result(att: float, mamba_by_p: dict[str, float], s4d: float = 0.1) -> dict:
    # accuracies are counts out of 256 held-out sequences × P queries (round 3: the probe decides them with an
    # exact binomial interval over those items, so they must be proportions of them, never above 1)
    seeds = (0.0, -0.01, -0.02)
    by = lambda f: {p: {"acc": [round((f(p) + e) * 1024) / 1024 for e in seeds]} for p in mamba_by_p}  # noqa: E731
    v = {"attention": {"by_pairs": by(lambda p: att)}, "mamba": {"by_pairs": by(mamba_by_p.get)},
         "s4d": {"by_pairs": by(lambda p: s4d)}}
    gap = {k: {p: [a - b for a, b in zip(v["attention"]["by_pairs"][p]["acc"], v[k]["by_pairs"][p]["acc"])]
               for p in mamba_by_p} for k in ("mamba", "s4d")}
    return {"task": {"pairs": [int(p) for p in mamba_by_p], "chance_acc": 1 / 16}, "setup": {"eval_n": 256},
            "variants": v,
            "acc_gap_vs_attention": gap}


def _lm(rel: list[float]) -> dict:
    return {"variants": {"attention": {"params": 1000}, "mamba": {"params": 990, "rel_loss_vs_attention": rel},
                         "s4d": {"params": 1010, "rel_loss_vs_attention": rel}}}


def test_recall_figures_move_with_the_accuracies():
    wide = probe.recall_figures(_recall_result(1.0, {"4": 0.95, "16": 0.4}), _lm([0.01, 0.02, 0.015]))
    assert wide["recall_gap_mamba"].value == pytest.approx(0.6, abs=1e-3) and wide["recall_gap_mamba"].has_interval
    assert wide["recall_gap_growth_mamba"].value == pytest.approx(0.55, abs=1e-3)
    assert wide["recall_acc_attention"].value == pytest.approx(0.99, abs=1e-3)
    assert wide["lm_rel_loss_mamba"].value == pytest.approx(0.015)
    closed = probe.recall_figures(_recall_result(1.0, {"4": 1.0, "16": 1.0}), None)
    assert closed["recall_gap_mamba"].value == pytest.approx(0.0, abs=1e-9) and "lm_rel_loss_mamba" not in closed
    claim = next(c for c in load_catalog() if c.id == "C41")
    assert decide(claim, Evidence(figures=wide)).verdict == "supported"
    assert decide(claim, Evidence(figures=closed)).verdict == "contradicted"


def _rec(arch: str, n: int, ms: float, peak: float = 1.0, macs: float = 1.0, batch: int = 1, **values) -> CaseRecord:
    metrics = {"median_ms": ms, "activation_peak_bytes": peak, "macs": macs, "throughput_per_s": 1e3 / ms,
               **{k: v for k, v in values.items() if k.startswith("analytic_")}}
    config = {k: v for k, v in values.items() if not k.startswith("analytic_")}
    samples = tuple(ms / 1e3 * (1 + 0.01 * (i % 5 - 2)) for i in range(20))
    return CaseRecord(f"{arch}-{n}-{batch}", "s", arch, arch, "ok", config=config,
                      workload={"seq_len": n, "batch_size": batch}, metrics=metrics, samples_s=samples)


def _suite(ssm_power: float, ssm_peak: float = 5e4) -> list[CaseRecord]:
    """Exact attention ∝ n² (eager) / n^1.8 time (SDPA), the SSMs ∝ n^ssm_power (activation peak
    ``ssm_peak``·k^ssm_power against SDPA's 1e5·k), plus decode lines."""
    rows = []
    for n in (1024, 2048, 4096, 8192, 16384):
        k = n / 1024
        rows.append(_rec("lra-exact", n, 10 * k ** 2, peak=1e6 * k ** 2, macs=1e9 * k ** 2, attn_impl="eager"))
        rows.append(_rec("lra-exact", n, 8 * k ** 1.8, peak=1e5 * k, macs=1e9 * k ** 2, attn_impl="sdpa"))
        for arch, _ in probe.SSM_ARCHS.values():
            rows.append(_rec(arch, n, 20 * k ** ssm_power, peak=ssm_peak * k ** ssm_power, macs=5e8 * k ** ssm_power))
        rows.append(_rec(probe.SSM_DECODE, n, 1.0, batch=8, analytic_state_bytes=4096.0, kind="mamba"))
        rows.append(_rec(probe.SSM_DECODE, n, 3.0 * k, batch=8, analytic_state_bytes=8192.0, kind="s4d"))
        rows.append(_rec(probe.ATTN_DECODE, n, 0.5 * k ** 0.5, batch=8, use_cache=True, n_kv_heads=8,
                         analytic_kv_cache_bytes=100.0 * n))
    return rows


def test_long_figures_read_linear_ssms_and_quadratic_attention():
    rows = _suite(1.0)
    figs = probe.long_figures(probe.long_lines(rows))
    assert figs["latency_exp_mamba"].value == pytest.approx(1.0, abs=0.02)
    assert figs["latency_exp_exact_eager"].value == pytest.approx(2.0, abs=0.02)
    assert figs["memory_exp_exact_sdpa"].value == pytest.approx(1.0, abs=0.02)
    assert figs["macs_exp_mamba"].value == pytest.approx(1.0) and figs["macs_exp_exact"].value == pytest.approx(2.0)
    assert figs["latency_saving_vs_sdpa"].value == pytest.approx(8 * 16 ** 1.8 / (20 * 16), rel=0.02)
    quadratic = probe.long_figures(probe.long_lines(_suite(2.0)))
    assert quadratic["latency_exp_mamba"].value == pytest.approx(2.0, abs=0.02)
    assert quadratic["latency_saving_vs_sdpa"].value < 1


def test_decode_figures_flat_state_and_growing_cache():
    rows = _suite(1.0)
    figs = probe.decode_figures(*probe.decode_lines(rows, rows))
    assert figs["decode_exp_ssm"].value == pytest.approx(0.0, abs=0.02)
    assert figs["decode_exp_attention"].value == pytest.approx(0.5, abs=0.05)
    assert figs["state_bytes_exp"].value == 0.0 and figs["kv_bytes_exp"].value == pytest.approx(1.0)
    assert figs["decode_speedup"].value == pytest.approx(0.5 * 4, rel=0.02)      # 2 ms vs 1 ms at n=16384
    none = probe.decode_figures(*probe.decode_lines(rows, []))                      # no attention decode line
    assert all(math.isnan(f.value) for f in none.values())


def test_c40_unmeasured_rules_are_never_supported():
    claim = next(c for c in load_catalog() if c.id == "C40")
    rows = [r for r in _suite(1.0) if r.arch not in (probe.SSM_DECODE, probe.ATTN_DECODE)]
    figs = {**probe.long_figures(probe.long_lines(rows)), **probe.decode_figures(*probe.decode_lines(rows, rows))}
    v = decide(claim, Evidence(figures=figs))
    assert v.verdict == "partly supported" and "not tested" in v.reason
    full = {**probe.long_figures(probe.long_lines(_suite(1.0))),
            **probe.decode_figures(*probe.decode_lines(_suite(1.0), _suite(1.0))),
            **generation.ssm_figures(generation_records())}          # a real generation's state bytes and TPOT
    assert decide(claim, Evidence(figures=full)).verdict == "supported"
    assert decide(claim, Evidence(figures={})).verdict == "inconclusive"
