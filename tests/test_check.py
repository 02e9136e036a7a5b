"""The regression gate's logic (reports.check): timing verdicts, exact and tolerant metrics, the environment
rules, re-measurement, the baseline file and the views. Records are built by hand from seeded numpy draws:
nothing is measured, and no absolute time is asserted."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from reports.check.baseline import (BASELINE_FORMAT, Baseline, baseline_document, load_baseline, parse_baseline,
                                    write_baseline)
from reports.check.metrics import MetricFinding
from reports.check.render import check_table, markdown
from reports.check.report import check_run
from reports.check.timing import MIN_EFFECT, timing_verdict

ENV = {"hard": {"cpu": "Test CPU 3000", "cores": 2, "torch": "2.5.1", "python": "3.11.9", "threads": 1},
       "soft": {"host": "ci", "commit": "a" * 40, "dirty": False}}
METRICS = {"macs": 4.09e9, "flops": 8.18e9, "params": 1.2e6, "est_peak_bytes": 5.0e7, "peak_bytes": 4.0e7,
           "activation_peak_bytes": 3.0e7, "analytic_fwd_macs": 4.0e9, "rss_hwm_bytes": 3.0e8}


def timing(seed: int, rounds: int = 5, per: int = 20, median_s: float = 0.010, noise: float = 0.03,
           drift: float = 0.0, scale: float = 1.0) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Samples (seconds) of ``rounds`` rounds of ``per`` calls: lognormal noise per call, and a per-round
    offset of relative size ``drift`` (what makes rounds differ), everything × ``scale``."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for _ in range(rounds):
        offset = float(np.exp(drift * rng.standard_normal()))
        out += list(median_s * scale * offset * np.exp(noise * rng.standard_normal(per)))
    return tuple(out), (per,) * rounds


def case(key: str = "k1", line: str = "MHA", seq_len: int = 64, seed: int = 0, status: str = "ok",
         device: str = "cpu", metrics: dict | None = None, samples=None, **timing_kw) -> CaseRecord:
    s, r = samples if samples is not None else timing(seed, **timing_kw)
    return CaseRecord(case_key=key, suite="tiny", line=line, arch="decoder-tiny", status=status,
                      config={"n_kv_heads": 4 if line == "MHA" else 1},
                      workload={"seq_len": seq_len, "batch_size": 1, "dtype": "fp32", "mode": "fwd", "device": device},
                      metrics=dict(METRICS if metrics is None else metrics), samples_s=s if status == "ok" else (),
                      rounds=r if status == "ok" else ())


def run(env: dict | None = None, run_id: str = "r1", quick: bool = True) -> RunRecord:
    return RunRecord(id=run_id, suite="tiny", quick=quick, status="done", n_cases=2,
                     started_at="2025-01-01T00:00:00+00:00", env=copy.deepcopy(env or ENV),
                     finished_at="2025-01-01T00:01:00+00:00")


def baseline(records: list[CaseRecord], env: dict | None = None) -> Baseline:
    """A baseline as the file would give it (through the JSON text)."""
    return parse_baseline(json.loads(json.dumps(baseline_document(run(env), records))))


def with_metrics(rec: CaseRecord, **changes: float) -> CaseRecord:
    return replace(rec, metrics={**rec.metrics, **changes})


def other_env(**hard) -> dict:
    env = copy.deepcopy(ENV)
    env["hard"].update(hard)
    return env


# -- the rule ------------------------------------------------------------------------------------------
def test_thirty_percent_slowdown_regresses_and_fails_the_check():
    base = [case("k1", seed=1), case("k2", seq_len=128, seed=2)]
    cand = [case("k1", seed=11, scale=1.3), case("k2", seq_len=128, seed=12)]
    report = check_run(baseline(base), run(), cand)
    k1, k2 = report.row("k1"), report.row("k2")
    assert k1.verdict == "regressed" and k1.timing.verdict == "regressed"
    assert k1.timing.ratio == pytest.approx(1.3, rel=0.03)
    assert k1.timing.comparison.significant and k1.timing.ci_low > 1.2
    assert k2.verdict == "ok" and k2.timing.verdict == "unchanged"
    assert report.failed and report.summary["regressed"] == 1 and report.summary["ok"] == 1
    assert report.warnings == ()


def test_the_same_samples_scaled_by_1_3_regress():
    s, r = timing(3)
    v = timing_verdict(s, r, [x * 1.3 for x in s], r)
    assert v.verdict == "regressed" and v.ratio == pytest.approx(1.3)


def test_a_a_draws_are_unchanged_and_do_not_fail():
    base = [case("k1", seed=21), case("k2", seq_len=128, seed=22)]
    cand = [case("k1", seed=31), case("k2", seq_len=128, seed=32)]
    report = check_run(baseline(base), run(), cand)
    assert [r.verdict for r in report.rows] == ["ok", "ok"]
    assert all(r.timing.verdict == "unchanged" for r in report.rows)
    assert not report.failed and report.inconclusive_keys() == []


def test_thirty_percent_speedup_is_improved_and_passes():
    report = check_run(baseline([case(seed=41)]), run(), [case(seed=42, scale=1 / 1.3)])
    assert report.row("k1").verdict == "improved" and not report.failed


def test_drifting_rounds_widen_the_interval_the_floor_stays_five_percent():
    # rounds drift by ~4 %: the verdict is over rounds, so the drift is in the interval, not in a raised floor
    base_s, base_r = timing(51, rounds=10, per=20, drift=0.04)
    cand_s, cand_r = timing(52, rounds=10, per=20, drift=0.04, scale=1.08)
    v = timing_verdict(base_s, base_r, cand_s, cand_r)
    assert v.floor == MIN_EFFECT and v.level == "rounds" and v.verdict != "unchanged"
    steady = timing_verdict(*timing(51, rounds=10), *timing(52, rounds=10, scale=1.12))
    assert steady.floor == MIN_EFFECT and steady.verdict == "regressed"
    assert steady.ci_high / steady.ci_low < v.ci_high / v.ci_low


def test_few_samples_big_difference_is_inconclusive_and_listed():
    base = [case("k1", samples=timing(61, rounds=1, per=3)), case("k2", seq_len=128, seed=62)]
    cand = [case("k1", samples=timing(63, rounds=1, per=3, scale=1.5)), case("k2", seq_len=128, seed=64)]
    report = check_run(baseline(base), run(), cand)
    row = report.row("k1")
    assert row.timing.ratio > 1.3 and not row.timing.comparison.significant
    assert row.verdict == "inconclusive" and report.inconclusive_keys() == ["k1"]
    assert not report.failed                                  # inconclusive alone does not fail


def test_remeasured_inconclusive_case_gets_a_decided_verdict():
    base = [case("k1", samples=timing(71, rounds=1, per=3))]
    first = [case("k1", samples=timing(72, rounds=1, per=3, scale=1.5))]
    report = check_run(baseline(base), run(), first)
    assert report.inconclusive_keys() == ["k1"]
    again = case("k1", seed=73, scale=1.5)
    via_dict = check_run(baseline(base), run(), first, remeasured={"k1": again})
    via_method = report.replace_timing("k1", again.samples_s, again.rounds)
    for rep in (via_dict, via_method):
        assert rep.row("k1").verdict == "regressed" and rep.row("k1").remeasured
        assert rep.inconclusive_keys() == [] and rep.failed
    assert report.row("k1").verdict == "inconclusive"         # the report itself is unchanged (frozen)
    with pytest.raises(KeyError):
        report.replace_timing("nope", again.samples_s, again.rounds)


def _paired(seed: int, rounds: int, factor: float, drift: float = 0.02):
    """Base and candidate timed side by side, one call each per round: the round offset is shared."""
    rng = np.random.default_rng(seed)
    offsets = np.exp(drift * rng.standard_normal(rounds))
    base = 0.01 * offsets * np.exp(0.002 * rng.standard_normal(rounds))
    cand = 0.01 * factor * offsets * np.exp(0.002 * rng.standard_normal(rounds))
    return tuple(base), (1,) * rounds, tuple(cand), (1,) * rounds


def test_paired_mode_uses_the_paired_ratio_and_its_interval():
    bs, br, cs, cr = _paired(81, rounds=5, factor=1.2)
    unpaired = timing_verdict(bs, br, cs, cr)
    assert not unpaired.paired and unpaired.level == "rounds"
    paired = timing_verdict(bs, br, cs, cr, paired=True)
    assert paired.paired and paired.level == "rounds"
    assert paired.ratio == pytest.approx(1.2, rel=0.01) and paired.ci_low > 1.0
    assert paired.verdict == "regressed"
    assert paired.ci_high / paired.ci_low < unpaired.ci_high / unpaired.ci_low     # the shared drift cancels
    same = timing_verdict(*_paired(82, rounds=5, factor=1.0), paired=True)
    assert same.verdict == "unchanged"
    with pytest.raises(ValueError):
        timing_verdict(bs, (), cs, cr, paired=True)


def test_replace_timing_with_a_paired_rebaseline():
    base = [case("k1", samples=timing(91, rounds=1, per=3))]
    report = check_run(baseline(base), run(), [case("k1", samples=timing(92, rounds=1, per=3, scale=1.5))])
    assert report.inconclusive_keys() == ["k1"]
    bs, br, cs, cr = _paired(93, rounds=5, factor=1.2)
    again = report.replace_timing("k1", cs, cr, paired_base=(bs, br))
    row = again.row("k1")
    assert row.timing.paired and row.verdict == "regressed" and again.failed
    assert row.timing.base_median_ms == pytest.approx(np.exp(np.mean(np.log(bs))) * 1e3)   # over rounds: their gmean


@given(seed=st.integers(0, 2**32 - 1), factor=st.floats(0.6, 1.6), scale=st.floats(1e-6, 1e3))
def test_verdict_is_scale_free_and_antisymmetric(seed, factor, scale):
    bs, br = timing(seed, rounds=5, per=6, drift=0.02)
    cs, cr = timing(seed + 1, rounds=5, per=6, drift=0.02, scale=factor)
    v = timing_verdict(bs, br, cs, cr)
    flipped = {"regressed": "improved", "improved": "regressed"}
    assert timing_verdict(cs, cr, bs, br).verdict == flipped.get(v.verdict, v.verdict)
    scaled = timing_verdict([x * scale for x in bs], br, [x * scale for x in cs], cr)
    assert scaled.verdict == v.verdict and scaled.ratio == pytest.approx(v.ratio)


# -- metrics --------------------------------------------------------------------------------------------
def test_ten_percent_more_macs_is_changed_exactly():
    base = [case("k1", seed=101), case("k2", seq_len=128, seed=102)]
    cand = [with_metrics(case("k1", seed=103), macs=4.09e9 * 1.1), case("k2", seq_len=128, seed=104)]
    report = check_run(baseline(base), run(), cand)
    row = report.row("k1")
    assert row.verdict == "changed" and report.failed
    (f,) = row.findings
    assert (f.metric, f.old, f.new, f.gated, f.tolerance) == ("macs", 4.09e9, 4.09e9 * 1.1, True, 0.0)
    assert f.text == "macs 4.09e9 → 4.5e9 (+10.0%)"
    assert report.row("k2").verdict == "ok"
    # one MAC more is a change too: exact, and the text shows digits enough to tell them apart
    one = check_run(baseline(base), run(), [with_metrics(case("k1", seed=103), macs=4.09e9 + 1), cand[1]])
    assert one.row("k1").verdict == "changed"
    assert one.row("k1").findings[0].text == "macs 4090000000 → 4090000001 (+0.0%)"


def test_analytic_metrics_are_deterministic():
    cand = [with_metrics(case(seed=111), analytic_fwd_macs=4.1e9)]
    report = check_run(baseline([case(seed=112)]), run(), cand)
    assert report.row("k1").verdict == "changed" and report.row("k1").findings[0].metric == "analytic_fwd_macs"


def test_ten_percent_more_peak_bytes_is_changed_on_cpu():
    report = check_run(baseline([case(seed=121)]), run(), [with_metrics(case(seed=122), peak_bytes=4.4e7)])
    assert report.row("k1").verdict == "changed"
    assert [f.metric for f in report.row("k1").findings] == ["peak_bytes"]


def test_cuda_peak_bytes_get_a_tolerance():
    base = [case(seed=131, device="cuda")]
    small = check_run(baseline(base), run(), [with_metrics(case(seed=132, device="cuda"), peak_bytes=4.2e7)])
    assert small.row("k1").verdict == "ok" and small.row("k1").findings == ()
    big = check_run(baseline(base), run(), [with_metrics(case(seed=132, device="cuda"), peak_bytes=4.8e7)])
    assert big.row("k1").verdict == "changed" and big.row("k1").findings[0].tolerance > 0


def test_rss_within_tolerance_is_fine_beyond_is_changed():
    base = [case(seed=141)]
    within = check_run(baseline(base), run(), [with_metrics(case(seed=142), rss_hwm_bytes=3.0e8 * 1.4)])
    assert within.row("k1").verdict == "ok" and within.row("k1").findings == () and not within.failed
    beyond = check_run(baseline(base), run(), [with_metrics(case(seed=142), rss_hwm_bytes=3.0e8 * 1.6)])
    row = beyond.row("k1")
    assert row.verdict == "changed" and beyond.failed
    assert row.findings[0].metric == "rss_hwm_bytes" and "+60.0%" in row.findings[0].text


def test_metric_finding_text_of_a_zero_baseline():
    assert MetricFinding("peak_bytes", 0.0, 1024.0, 0.0, True).text == "peak_bytes 0 → 1024 (from 0)"


# -- statuses and case sets ----------------------------------------------------------------------------
def test_failed_missing_and_new_cases():
    base = [case("k1", seed=151), case("k2", seq_len=128, seed=152), case("k3", seq_len=256, seed=153)]
    cand = [case("k1", seed=154, status="oom"), case("k3", seq_len=256, seed=155),
            case("k4", seq_len=512, seed=156)]
    report = check_run(baseline(base), run(), cand)
    assert {r.case_key: r.verdict for r in report.rows} == {"k1": "failed", "k2": "missing", "k3": "ok",
                                                            "k4": "new"}
    assert report.failed
    assert report.row("k1").timing is None


def test_new_cases_alone_do_not_fail_and_a_case_that_recovers_is_ok():
    base = [case("k1", seed=161, status="oom")]
    cand = [case("k1", seed=162), case("k2", seq_len=128, seed=163)]
    report = check_run(baseline(base), run(), cand)
    assert report.row("k1").verdict == "ok" and "status oom → ok" in report.row("k1").notes
    assert report.row("k2").verdict == "new" and not report.failed


# -- environment ---------------------------------------------------------------------------------------
def test_another_cpu_warns_and_does_not_gate_timing():
    base = [case(seed=171)]
    slow = [case(seed=172, scale=1.3)]
    report = check_run(baseline(base, env=other_env(cpu="Other CPU 9000")), run(), slow)
    row = report.row("k1")
    assert row.timing.verdict == "regressed" and not row.timing_gated
    assert row.verdict == "ok" and not report.failed
    assert any("cpu" in w and "not gated" in w for w in report.warnings)
    assert "not gated" in markdown(report)
    # ... but a MACs change still fails (deterministic metrics do not depend on the machine)
    macs = check_run(baseline(base, env=other_env(cpu="Other CPU 9000")), run(),
                     [with_metrics(slow[0], macs=4.5e9)])
    assert macs.row("k1").verdict == "changed" and macs.failed
    # gate_timing=True gates it anyway; False never
    forced = check_run(baseline(base, env=other_env(cpu="Other CPU 9000")), run(), slow, gate_timing=True)
    assert forced.row("k1").verdict == "regressed" and forced.failed
    off = check_run(baseline(base), run(), slow, gate_timing=False)
    assert off.row("k1").verdict == "ok" and not off.failed


def test_another_machine_does_not_gate_rss():
    report = check_run(baseline([case(seed=181)], env=other_env(cores=16)), run(),
                       [with_metrics(case(seed=182), rss_hwm_bytes=6.0e8)])
    assert report.row("k1").verdict == "ok" and not report.failed
    assert any("rss_hwm_bytes" in w for w in report.warnings)


def test_another_torch_version_only_warns_on_deterministic_changes():
    report = check_run(baseline([case(seed=191)], env=other_env(torch="2.4.0")), run(),
                       [with_metrics(case(seed=192), macs=4.5e9, peak_bytes=4.4e7)])
    row = report.row("k1")
    assert row.verdict == "ok" and not report.failed
    assert {f.metric for f in row.findings} == {"macs", "peak_bytes"} and not any(f.gated for f in row.findings)
    assert any("torch" in w for w in report.warnings)
    assert any("macs 4.09e9 → 4.5e9" in w for w in report.warnings)


# -- the baseline file ---------------------------------------------------------------------------------
def test_write_load_round_trip(tmp_path):
    recs = [case("k1", seed=201), case("k2", seq_len=128, seed=202, status="timeout")]
    path = tmp_path / "base.json"
    write_baseline(path, run(), recs)
    b = load_baseline(path)
    assert b.format == BASELINE_FORMAT and b.suite == "tiny" and b.quick and b.env == ENV and b.run_id == "r1"
    assert [c.case_key for c in b.cases] == ["k1", "k2"]
    k1, k2 = b.cases
    assert k1.timing.samples_s == recs[0].samples_s and k1.timing.rounds == recs[0].rounds
    assert k1.timing.round_cv is not None and k1.timing.median_ms > 0
    assert dict(k1.deterministic) == {k: v for k, v in METRICS.items() if k != "rss_hwm_bytes"}
    assert dict(k1.tolerant) == {"rss_hwm_bytes": 3.0e8}
    assert k2.status == "timeout" and k2.timing is None
    assert k1.workload["seq_len"] == 64 and k1.config == {"n_kv_heads": 4}
    doc = json.loads(path.read_text())
    assert set(doc["cases"][0]) >= {"case_key", "line", "arch", "status", "workload", "config", "deterministic",
                                    "tolerant", "timing"}
    assert set(doc["cases"][0]["timing"]) == {"median_ms", "round_cv", "samples_s", "rounds"}
    # the loaded baseline checks its own run as unchanged
    assert not check_run(b, run(), recs).failed


@pytest.mark.parametrize("content", [
    "not json {", b"\xff\xfe\x00garbage", "[1, 2, 3]", '{"suite": "tiny"}',
    '{"format": 99, "suite": "tiny", "env": {}, "cases": []}',
    '{"format": 1, "suite": "tiny", "env": {}, "cases": [{"line": "MHA"}]}',
    '{"format": 1, "suite": "tiny", "env": {}, "cases": "nope"}',
    '{"format": 1, "suite": "tiny", "env": {}, "cases": [{"case_key": "k", "line": "l", "arch": "a", '
    '"status": "ok", "workload": {}, "config": {}, "timing": {"samples_s": [0.1, 0.2], "rounds": [3]}}]}',
])
def test_load_baseline_rejects_garbage_with_one_line(tmp_path, content):
    path = tmp_path / "base.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BenchInputError) as info:
        load_baseline(path)
    assert info.value.where == "--baseline"
    assert len(str(info.value).splitlines()) == 1 and str(path) in str(info.value)


def test_load_baseline_missing_file(tmp_path):
    with pytest.raises(BenchInputError, match="cannot read") as info:
        load_baseline(tmp_path / "absent.json")
    assert info.value.where == "--baseline"


# -- views ---------------------------------------------------------------------------------------------
def test_markdown_headline_warnings_and_tables():
    base = [case("k1", seed=211), case("k2", seq_len=128, seed=212), case("k3", seq_len=256, seed=213)]
    cand = [case("k1", seed=214, scale=1.3), with_metrics(case("k2", seq_len=128, seed=215), macs=4.5e9),
            case("k3", seq_len=256, seed=216)]
    text = markdown(check_run(baseline(base), run(), cand))
    assert text.startswith("### ❌ 1 regressed, 1 changed (of 3 cases)")
    head, details = text.split("<details>")
    header = "| case | baseline ms | candidate ms | ratio [95% CI] | over | floor | verdict | deterministic changes |"
    assert header in head
    assert "MHA · decoder-tiny · seq_len=64" in head and "regressed" in head
    assert "macs 4.09e9 → 4.5e9 (+10.0%)" in head
    assert "seq_len=256" not in head and "seq_len=256" in details        # ok cases only in the details
    assert "All 3 cases" in details and details.rstrip().endswith("</details>")

    ok = markdown(check_run(baseline(base), run(), [case("k1", seed=217), case("k2", seq_len=128, seed=218),
                                                    case("k3", seq_len=256, seed=219)]))
    assert ok.startswith("### ✅ unchanged within 5 % (3 cases: 3 ok)")
    warned = markdown(check_run(baseline(base, env=other_env(cpu="Other")), run(), cand))
    assert "> ⚠️ the baseline was measured in another environment (cpu:" in warned


def test_check_table_renders():
    base = [case("k1", seed=221), case("k2", seq_len=128, seed=222)]
    cand = [case("k1", seed=223, scale=1.3), case("k2", seq_len=128, seed=224)]
    console = Console(record=True, width=200)
    console.print(check_table(check_run(baseline(base), run(), cand)))
    text = console.export_text()
    assert "regressed" in text and "seq_len=128" in text and "ratio [95% CI]" in text
    assert text.index("seq_len=64") < text.index("seq_len=128")      # not-ok cases first


def test_a_timing_measured_on_a_busy_machine_decides_nothing():
    """A 30 % slowdown timed while other processes used more than half a core is inconclusive, with the note
    (in the check and in a re-measurement); the same slowdown on a quiet machine is a regression."""
    base = [case("k1", seed=231)]
    slow = case("k1", seed=232, scale=1.3)
    assert check_run(baseline(base), run(), [slow]).row("k1").verdict == "regressed"
    busy = with_metrics(slow, load_busy=1.0, load_others_cores=1.7)
    row = check_run(baseline(base), run(), [busy]).row("k1")
    assert row.timing.verdict == "inconclusive" and row.verdict == "inconclusive"
    assert any("machine busy: other processes used 1.70 cores" in n for n in row.notes)
    report = check_run(baseline(base), run(), [slow])
    again = report.replace_timing("k1", slow.samples_s, slow.rounds, busy="machine busy: test")
    assert again.row("k1").timing.verdict == "inconclusive" and "machine busy: test" in again.row("k1").notes
