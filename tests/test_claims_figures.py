"""Claims' central figures that could come out otherwise (C02, C03, C11, C26, C30, C39), C30 facing LLaMA's SwiGLU,
C31 per size, quoted figures labelled (C28, C42), C41 as the project's own question decided with exact binomial
intervals, and strict JSON for the claims document."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from scipy import stats

from architectures.attention_core import AttentionCore, AttentionCoreConfig, core_inputs
from claims.catalog import load_catalog
from claims.model import Claim, Evidence, Figure, Outcome, Rule, Verdict
from claims.probes import blocks, cost, ssm, variants, vision, vision_rivals
from claims.record import claims_document, read_verdicts
from claims.rules import combine
from claims.verdicts import decide
from harness.instruments.fake import new_fake_mode
from harness.contract.spec import Workload

CATALOG = {c.id: c for c in load_catalog()}


def central(cid: str) -> Rule:
    return next(r for r in CATALOG[cid].rules if r.central)


# -- central rules measure something that could come out otherwise -----------------------------------
@pytest.mark.parametrize("cid, figure", [("C02", "qk_macs_model_n1000"), ("C03", "score_rss_bytes_n10k"),
                                         ("C11", "kv_ratio_held"), ("C26", "kib_vit_b16_model"),
                                         ("C39", "score_gb_measured_224")])
def test_central_rules_read_a_measurement_not_the_arithmetic(cid, figure):
    """Before: C02 counted q·kᵀ of two bare tensors, C03 a shape × 4 bytes, C11 the cache tensors' nbytes,
    C26 196² from the config, C39 224² from a flatten — each its own formula."""
    assert central(cid).figure == figure


def test_c02_counts_the_op_the_real_attention_dispatches():
    """The counter on the real module's op: 8 heads × 1000² × 64 = 512M for q·kᵀ; a model that split d over
    heads differently or padded n would count otherwise — a 1001-token input gives another count."""
    def qk(n: int) -> int:
        cfg = AttentionCoreConfig(d_model=512, n_heads=8, attn_impl="eager")
        model = AttentionCore(cfg).eval()
        with new_fake_mode():
            inputs = core_inputs(cfg, Workload(batch_size=1, seq_len=n), torch.device("cpu"))
            with torch.no_grad():
                return cost.first_contraction_macs(lambda: model(*inputs))[0]
    assert qk(1000) == 512_000_000 and qk(1001) == 8 * 1001 ** 2 * 64
    ev = cost.qk_macs(None)  # type: ignore[arg-type]
    assert ev.figures["qk_macs_model_n1000"].value == 512e6
    assert decide(CATALOG["C02"], ev).verdict == "supported"


def test_c03_the_operating_system_sees_the_score_tensor():
    got = cost.score_rss_bytes(4096, repeats=1)
    if got is None:
        pytest.skip("/proc refuses the resident-set reset here")
    assert all(abs(b / (4096 ** 2 * 4) - 1) < 0.1 for b in got)        # 67 MB: one fp32 (4096, 4096) tensor
    assert math.isnan(cost.rss_figure(None).value)                       # unmeasurable: NaN with the reason


def test_c11_the_allocator_sees_what_the_caches_hold():
    """After a prefill and one decode step GQA-8 of 32 heads holds 1/4 of MHA's bytes, and right after the prefill
    too: the static cache copies K/V out of the fused QKV output into its buffers (a cache keeping views of it,
    queries included, would hold (32 + 16)/96 = 1/2). Within 2 %: each cache's int64 position bookkeeping
    (8 · 18 B a layer) is held too, whatever the heads."""
    figs = variants.kv_figures(32, 8)
    assert figs["kv_ratio_held"].value == pytest.approx(0.25, rel=0.02)
    assert figs["kv_ratio_held_prefill"].value == pytest.approx(0.25, rel=0.02)   # K/V copied out of the fused QKV
    ev = Evidence(figures={**figs, "kv_ratio_held": Figure(0.5)})
    assert decide(CATALOG["C11"], ev).verdict == "contradicted"          # a cache holding more would fail it


def test_c26_reads_the_real_vit_score_tensor():
    nbytes, shape = vision.vit_score_tensor("vit-b16")
    assert shape == (12, 197, 197) and nbytes == 12 * 197 ** 2 * 4       # [CLS] included: 197², not 14⁴
    ev = vision.attention_arithmetic(None)  # type: ignore[arg-type]
    assert ev.figures["kib_vit_b16_model"].value == pytest.approx(197 ** 2 * 4 / 1024)
    assert decide(CATALOG["C26"], ev).verdict == "supported"


def test_c39_extrapolates_what_the_os_measured():
    fig = blocks.extrapolated_score_gb(50_176, ns=(4096, 5120, 6144))
    if math.isnan(fig.value):
        pytest.skip(fig.note)
    assert 1 < fig.lo <= fig.value <= fig.hi and 8 < fig.value < 13     # 50,176² × 4 B = 10.1 GB
    assert "measured by the OS" in fig.note


# -- C30: the LLaMA counter-example -------------------------------------------------------------------
def test_c30_reads_the_released_shapes_and_counts_the_crossing():
    """The norm is read over the released models' published shapes (quoted data, never our presets); the
    headline is the counted crossing, so the quoted share decides a side rule only."""
    shapes = cost.released_ffn_shapes()
    assert shapes["llama2-70b"] == {"d_model": 8192, "d_ff": 28672, "ffn": "swiglu",
                                    "source": shapes["llama2-70b"]["source"]}
    assert all(r["source"] for r in shapes.values()) and not any(k.endswith(("-micro", "-small")) and k.startswith(
        ("decoder", "encoder")) for k in shapes)
    d, hidden, macs = cost.ffn_width("decoder-llama-small")
    assert (d, hidden) == (512, 1536) and macs == 3 * 512 * 1536        # SwiGLU: three d×d_ff matrices
    assert cost.ffn_width("decoder-small")[:2] == (512, 2048)
    rule = central("C30")
    assert rule.figure == "attn_overtakes_ffn_at"
    src = "ffn_shapes.toml"
    ev = Evidence(figures={"d_ff_is_4d_share": Figure(15 / 21, quoted=src), "d_ff_all_4d": Figure(False, quoted=src),
                           "swiglu_ffn_macs_over_4d": Figure(1.0, provenance="counted"),
                           "ffn_share_n512": Figure(8 / 14, provenance="counted"),
                           "attn_overtakes_ffn_at": Figure(2.0, 1.99, 2.01, provenance="counted")})
    v = decide(CATALOG["C30"], ev)
    assert v.verdict == "partly supported" and "d_ff_is_4d_share (quoted)" in v.reason
    ev.figures["attn_overtakes_ffn_at"] = Figure(8.0, provenance="counted")
    assert decide(CATALOG["C30"], ev).verdict == "contradicted"


# -- C31: per size -------------------------------------------------------------------------------------
def test_c31_tests_what_the_document_states():
    """The document states the shapes (d_model, heads, d_k) and two sizes in names (GPT-3 175B, LLaMA-2 70B),
    never a GPT-2 size: no rule holds GPT-2 to the paper's 117M; a wrong shape fails the structural rule."""
    ev = blocks.named_sizes(None)
    assert ev.figures["params_gpt2_released"].value == 124_439_808
    assert "-1.0%" in ev.figures["params_bert_base"].note
    assert ev.figures["shapes_as_stated"].value is True and ev.figures["shapes_as_stated"].kind == "structural"
    assert ev.figures["params_gpt3"].kind == "counted"
    assert all("117" not in r.says for r in CATALOG["C31"].rules) and "117M" not in CATALOG["C31"].title
    v = decide(CATALOG["C31"], ev)
    assert v.verdict == "supported", v.reason
    assert "params_bert_base (counted)" in v.reason and "shapes_as_stated (structural)" in v.reason
    assert blocks.built_shapes("gpt2-small", n_heads=16) == {(768, 16, 48)}
    wrong = Evidence(figures={**ev.figures, "shapes_as_stated": Figure(False, provenance="structural")})
    assert decide(CATALOG["C31"], wrong).verdict == "partly supported"


# -- C28, C42: quoted figures ----------------------------------------------------------------------------
def _ctx_without_runs() -> SimpleNamespace:
    return SimpleNamespace(suite=lambda name, sets=None: (SimpleNamespace(id="none"), []))


def test_published_accuracies_are_labelled_quoted_and_the_verdict_says_so():
    lr = vision_rivals.lrnet(_ctx_without_runs())  # type: ignore[arg-type]
    cn = vision.convnext(_ctx_without_runs())  # type: ignore[arg-type]
    for fig in (lr.figures["acc_gap_lrnet_resnet"], cn.figures["acc_gap_convnext_vit_s"]):
        assert fig.quoted and fig.text().endswith("(quoted)") and fig.as_dict()["quoted"] == fig.quoted
    v42 = decide(CATALOG["C42"], lr)
    context = v42.reason.split("context (does not decide):")[1]
    assert "published top-1" in context and "(quoted)" in context      # C42's accuracy: shown, never deciding
    v28 = decide(CATALOG["C28"], cn)
    assert "rests on QUOTED figures" in v28.reason and "acc_gap_convnext_vit_s" in v28.reason
    assert central("C28").figure == "latency_ratio_convnext_vit_s"      # the measured part is the headline
    measured = Outcome(Rule("m", "at_least", "x", lo=0, central=True), "pass", "m", Figure(1.0))
    assert "QUOTED" not in combine([measured])[1]                        # a measured figure says nothing


# -- C41: the project's own question, exact binomial intervals -----------------------------------------
def _recall(att: list[float], mamba: list[float], low: float = 922 / 1024) -> dict:
    pairs = {"4": {"attention": [1.0] * 3, "mamba": [low] * 3, "s4d": [0.25] * 3},
             "8": {"attention": att, "mamba": mamba, "s4d": [0.125] * 3}}
    return {"task": {"pairs": [4, 8], "chance_acc": 1 / 16}, "setup": {"eval_n": 256},
            "variants": {k: {"by_pairs": {p: {"acc": pairs[p][k]} for p in pairs}}
                         for k in ("attention", "mamba", "s4d")}}


def test_c41_is_labelled_the_projects_own_question():
    c = CATALOG["C41"]
    assert c.own_question and "Arora" in c.own_question and "Jelassi" in c.own_question
    assert c.where.startswith("not in the documents") and "own question" in c.title
    from reports.claims_view import render_claims
    v = decide(c, Evidence(figures=ssm.recall_figures(_recall([1.0] * 3, [0.5] * 3), None),
                           unavailable={"lm_rel_loss_mamba": "not trained"}))
    from harness.engine.env import fingerprint
    doc = claims_document([v], fingerprint(threads=1), {"quick": True, "seeds": [0, 1, 2], "threads": 1, "used": [], "force": False,
                                     "device": "cpu", "wall_s": 1.0})
    assert doc["claims"][0]["own_question"] == c.own_question
    assert "drawn from Arora et al. 2023" in render_claims(doc)


def test_c41_accuracies_get_exact_binomial_intervals_inside_0_1():
    """Attention solved recall in 2 of 3 seeds (1, 0.47, 1): a Student-t over the seeds reached past 1 and below
    0; the pooled exact interval stays in [0, 1] and equals scipy's Clopper–Pearson over the 3 × 2048 items."""
    att, mamba = [1.0, 481 / 1024, 1.0], [0.5, 0.5, 0.5]
    figs = ssm.recall_figures(_recall(att, mamba), None)
    acc = figs["recall_acc_attention"]
    k = sum(round(a * 2048) for a in att)
    ci = stats.binomtest(k, 6144).proportion_ci(method="exact")
    assert acc.value == pytest.approx(k / 6144) and (acc.lo, acc.hi) == pytest.approx((ci.low, ci.high))
    assert 0 <= acc.lo <= acc.hi <= 1 and acc.n == 6144
    gap = figs["recall_gap_mamba"]
    assert gap.lo < gap.value < gap.hi and gap.lo > 0.05                # the gap holds over the items
    v = decide(CATALOG["C41"], Evidence(figures=figs, unavailable={"lm_rel_loss_mamba": "not trained"}))
    assert v.verdict == "partly supported"                              # attention ≥ 90 % fails: 0.82 pooled
    assert any(o.rule.figure == "recall_acc_attention" and o.status == "fail" for o in v.outcomes)
    with pytest.raises(ValueError, match="not counts"):
        ssm.recall_figures(_recall([0.3333333], mamba), None)           # not a proportion of the items


# -- strict JSON ----------------------------------------------------------------------------------------
def _verdict_with(fig: Figure) -> Verdict:
    rule = Rule("x", "at_least", "x", lo=1.0, central=True)
    claim = Claim("C99", "t", "q", "w", "s", "p", (rule,))
    ev = Evidence(figures={"x": fig})
    v = decide(claim, ev)
    return Verdict(claim, v.verdict, v.reason, v.outcomes, ev)


def test_claims_document_is_strict_json_with_null_and_a_reason():
    v = _verdict_with(Figure(float("inf"), float("nan"), None, "×", note="division by zero: no baseline"))
    doc = claims_document([v], {}, {"wall_s": float("nan")})
    text = json.dumps(doc, allow_nan=False)                             # before: ValueError (Infinity, NaN)
    back = json.loads(text)
    fig = back["claims"][0]["figures"]["x"]
    assert fig["value"] is None and fig["value_not_finite"] == "Infinity: division by zero: no baseline"
    assert fig["lo"] is None and fig["lo_not_finite"].startswith("NaN")
    assert back["context"]["wall_s"] is None
    paths = {d["path"]: d["was"] for d in back["not_finite"]}
    assert paths["claims[0].figures.x.value"] == "Infinity" and paths["context.wall_s"] == "NaN"
    again = read_verdicts(back, [v.claim])[0]                           # and it reads back (as NaN)
    assert math.isnan(again.evidence.figures["x"].value)


def test_bench_claims_writes_strict_json(tmp_path, monkeypatch):
    from cli import claims as cli_claims
    from tests.helpers import invoke

    def fake_run(chosen, ctx, progress):
        rule = chosen[0].rules[0]
        ev = Evidence(figures={r.figure: Figure(float("nan"), note="not measured here") for r in chosen[0].rules})
        out = [decide(chosen[0], ev)]
        assert rule.figure in ev.figures
        return out
    monkeypatch.setattr(cli_claims, "run_claims", fake_run)
    out = tmp_path / "c.html"
    result = invoke("claims", "--quick", "--only", "C20", "--store", f"sqlite:///{tmp_path / 'r.sqlite'}",
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.with_suffix(".json").read_text()
    assert ": NaN" not in text and ": Infinity" not in text             # as JSON values (reasons may name them)
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert doc["not_finite"] and all(d["why"] for d in doc["not_finite"])
