"""The generation figures of C10, C11, C19 and C40 (claims/probes/generation.py) on synthetic records of the
claims' generation suite: each figure moves when the quantity it measures moves (a cache of other bytes, a decode
step of another cost), the prefill never leaks into a decode time, and a figure without its evidence says why."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from architectures.transformer_cost import decoder_params
from claims.catalog import load_catalog
from claims.model import Evidence
from claims.probes import generation as gen
from claims.probes import load_all
from claims.rules import check
from harness.executors.base import interleave_groups
from harness.contract.records import CaseRecord, RunRecord
from harness.contract.registry import resolve
from harness.contract.suite import load_suite

ROUNDS, PER_ROUND = 5, 2
DRIFT = (1.00, 1.08, 0.95, 1.15, 1.02)           # the machine's drift: the same for every case in a round


def _suite():
    return load_suite(gen.SUITE, quick=True, sets={"threads": 1})


def _records(prefill_ms: dict[str, float] | None = None, step_ms: dict[str, float] | None = None,
             kv: dict[str, float] | None = None, split: bool = False, skip: tuple[str, ...] = ()
             ) -> list[CaseRecord]:
    """One ok record per case of the suite, timed side by side (one group, 5 rounds of 2 samples): a sample is
    (prefill + (new_tokens − 1) · step) × the round's drift × a small per-sample jitter. Defaults: prefill 20 ms,
    step 2 ms, KV bytes 1000 per prompt token (Mamba: 777 whatever the prompt); ``prefill_ms``/``step_ms``/``kv``
    override by line, ``skip`` leaves lines out, ``split`` times MQA's generation in another group."""
    group = "g"
    out = []
    for c in _suite().cases:
        if c.line in skip:
            continue
        w = c.workload
        pre = (prefill_ms or {}).get(c.line, 20.0)
        step = (step_ms or {}).get(c.line, 2.0)
        total = pre + (w.new_tokens - 1) * step
        samples = tuple(total / 1e3 * d * (1 + 0.003 * (j - 0.5)) for d in DRIFT for j in range(PER_ROUND))
        is_ssm = c.arch == gen.SSM
        bytes_ = (kv or {}).get(c.line, 777.0 if is_ssm else 1000.0 * (w.prompt_len + w.new_tokens) * w.batch_size)
        metrics = {"median_ms": total, "ttft_ms": pre, "kv_cache_bytes": bytes_,
                   **({"tpot_ms": step} if w.new_tokens > 1 else {})}
        out.append(CaseRecord(c.key, "claims_generation", c.line, c.arch, "ok", config=dict(c.overrides),
                              workload={"mode": w.mode, "prompt_len": w.prompt_len, "new_tokens": w.new_tokens,
                                        "batch_size": w.batch_size, "device": "cpu"},
                              metrics=metrics, samples_s=samples, run_id="r", rounds=(PER_ROUND,) * ROUNDS,
                              group=group + "-mqa" if split and c.line == "MQA p256 params = MHA" else group))
    return out


def _rule(cid: str, figure: str):
    claim = next(c for c in load_catalog() if c.id == cid)
    return next(r for r in claim.rules if r.figure == figure)


# -- the suite -------------------------------------------------------------------------------------------
def test_the_claims_generation_suite_is_one_side_by_side_group_of_generations_with_prefill_twins():
    suite = _suite()
    assert [len(g) for g in interleave_groups(suite.cases)] == [len(suite.cases)]
    assert {c.workload.mode for c in suite.cases} == {"generate"}
    assert {c.workload.threads for c in suite.cases} == {gen.THREADS}
    gens = [c for c in suite.cases if c.workload.new_tokens > 1]
    twins = {(c.arch, c.workload.prompt_len, c.workload.batch_size, dict(c.overrides).get("n_kv_heads"))
             for c in suite.cases if c.workload.new_tokens == 1}
    timed = {(c.arch, c.workload.prompt_len, c.workload.batch_size, dict(c.overrides).get("n_kv_heads")) for c in gens
             if dict(c.overrides).get("n_kv_heads") != 2}                      # GQA-2 only gives its cache bytes
    assert timed <= twins
    params = {c.line: decoder_params(resolve(c.arch, **dict(c.overrides)).config) for c in gens
              if c.arch == gen.ATTN and c.workload.batch_size == 1 and c.workload.prompt_len == gen.LONG}
    for line in ("MQA p256 params = MHA", "GQA-2 p256 params = MHA"):
        assert abs(params[line] / params["MHA p256"] - 1) <= 1e-3, line          # FFN widened: within 0.1 %


def test_every_generation_rule_is_declared_by_its_probe_and_names_the_generate_workload():
    probes = load_all()
    seen = set()
    for claim in load_catalog():
        for rule in claim.rules:
            if rule.figure.startswith("gen_"):
                seen.add(claim.id)
                assert rule.figure in probes[claim.probe][1]
                assert "mode generate" in rule.says and not rule.central, (claim.id, rule.figure)
    assert seen == {"C10", "C11", "C19", "C40"}


# -- C10/C11 ---------------------------------------------------------------------------------------------
def test_kv_bytes_ratio_is_the_records_real_bytes_and_moves_with_them():
    rows = _records(kv={"MQA p256 params = MHA": 272_000 / 8, "GQA-2 p256 params = MHA": 272_000 / 4})
    assert gen.mqa_figures(rows, 1)["gen_kv_bytes_ratio"].value == 0.125
    assert gen.mqa_figures(rows, 2)["gen_kv_bytes_ratio"].value == 0.25
    assert check(_rule("C10", "gen_kv_bytes_ratio"), gen.mqa_figures(rows, 1)["gen_kv_bytes_ratio"]).status == "pass"
    expanded = _records(kv={"MQA p256 params = MHA": 272_000.0})        # K/V repeated to every head before caching
    assert check(_rule("C10", "gen_kv_bytes_ratio"), gen.mqa_figures(expanded, 1)["gen_kv_bytes_ratio"]).status \
        == "fail"


def test_tpot_ratio_is_the_decode_steps_ratio_whatever_the_prefill():
    faster = gen.mqa_figures(_records(step_ms={"MQA p256 params = MHA": 1.0}), 1)["gen_tpot_ratio"]
    assert faster.value == pytest.approx(0.5, rel=0.01) and faster.hi < 1
    assert check(_rule("C10", "gen_tpot_ratio"), faster).status == "pass"
    # MQA's prefill 5× MHA's, its steps the same: the ratio is 1, the rule undecided or failing, never passing
    same = gen.mqa_figures(_records(prefill_ms={"MQA p256 params = MHA": 100.0,
                                                "MQA p256 params = MHA prefill": 100.0}), 1)["gen_tpot_ratio"]
    assert same.value == pytest.approx(1.0, rel=0.01)
    assert check(_rule("C10", "gen_tpot_ratio"), same).status in ("unsure", "fail")
    slower = gen.mqa_figures(_records(step_ms={"MQA p256 params = MHA": 3.0}), 1)["gen_tpot_ratio"]
    assert check(_rule("C10", "gen_tpot_ratio"), slower).status == "fail"


def test_gqa_has_no_tpot_figure_and_a_missing_or_unpaired_case_says_why():
    assert "gen_tpot_ratio" not in gen.mqa_figures(_records(), 2)          # GQA-2 has no prefill twin
    missing = gen.mqa_figures(_records(skip=("MHA p256 prefill",)), 1)["gen_tpot_ratio"]
    assert math.isnan(missing.value) and "prefill twin" in missing.note
    split = gen.mqa_figures(_records(split=True), 1)["gen_tpot_ratio"]
    assert math.isnan(split.value) and "side by side" in split.note
    no_bytes = gen.mqa_figures(_records(skip=("MHA p256",)), 1)["gen_kv_bytes_ratio"]
    assert math.isnan(no_bytes.value)


def test_a_round_whose_decode_time_is_not_positive_is_dropped_and_said():
    rows = _records()
    twin = next(r for r in rows if r.line == "MHA p256 prefill")
    slow = tuple(s * (20.0 if i < PER_ROUND else 1.0) for i, s in enumerate(twin.samples_s))   # round 0 only
    rows = [r if r is not twin else replace(r, samples_s=slow) for r in rows]
    fig = gen.mqa_figures(rows, 1)["gen_tpot_ratio"]
    assert fig.n == ROUNDS - 1 and "1 round(s) dropped" in fig.note


# -- C19 -------------------------------------------------------------------------------------------------
def test_batch_decode_gain_is_batch_times_the_step_ratio():
    rows = _records(step_ms={"MHA p32": 2.0, "MHA p32 b=8": 4.0})
    g = gen.batch_gain(rows)
    assert g.value == pytest.approx(4.0, rel=0.01) and g.lo > 2.0
    assert check(_rule("C19", "gen_batch_decode_gain"), g).status == "pass"
    serial = gen.batch_gain(_records(step_ms={"MHA p32": 2.0, "MHA p32 b=8": 16.0}))   # no gain from batching
    assert serial.value == pytest.approx(1.0, rel=0.01)
    assert check(_rule("C19", "gen_batch_decode_gain"), serial).status == "fail"


# -- C40 -------------------------------------------------------------------------------------------------
def test_ssm_state_bytes_and_tpot_against_the_context():
    figs = gen.ssm_figures(_records())
    assert figs["gen_state_bytes_ratio"].value == 1.0 and "5.67" in figs["gen_state_bytes_ratio"].note
    assert figs["gen_tpot_ratio_ssm"].value == pytest.approx(1.0, rel=0.01)
    assert check(_rule("C40", "gen_state_bytes_ratio"), figs["gen_state_bytes_ratio"]).status == "pass"
    assert check(_rule("C40", "gen_tpot_ratio_ssm"), figs["gen_tpot_ratio_ssm"]).status == "pass"
    growing = gen.ssm_figures(_records(kv={"Mamba p256": 777.0 * 8}, step_ms={"Mamba p256": 4.0}))
    assert check(_rule("C40", "gen_state_bytes_ratio"), growing["gen_state_bytes_ratio"]).status == "fail"
    assert growing["gen_tpot_ratio_ssm"].value == pytest.approx(2.0, rel=0.01)
    assert check(_rule("C40", "gen_tpot_ratio_ssm"), growing["gen_tpot_ratio_ssm"]).status == "fail"


def test_rows_pins_one_thread_and_names_the_run_as_a_source():
    class Ctx:
        asked: list = []

        def suite(self, name, sets=None):
            self.asked.append((name, dict(sets or {})))
            return RunRecord("run-gen", "claims_generation", True, "done", 13, ""), _records()

    ctx, ev = Ctx(), Evidence()
    assert len(gen.rows(ctx, ev)) == len(_suite().cases)                # type: ignore[arg-type]
    assert ctx.asked == [(gen.SUITE, {"threads": gen.THREADS})] and ev.sources == ["run-gen"]
