"""Timing across occasions (issue 25): a file baseline measured on several occasions, checked as a prediction
for one more. A fake timer with a per-occasion bias shows the process-level verdict crying wolf against a
one-occasion baseline and the occasion-level one holding; the baseline document keeps its occasions, grows
with ``--append`` and refuses what is not the same measurement; the CLI end to end on the test plug-in."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.ratios import occasion_ratio
from harness.contract.errors import BenchInputError
from reports.check.baseline import append_occasions, parse_baseline
from reports.check.timing import ALPHA, occasion_timing_verdict, process_timing_verdict, timing_verdict
from tests.helpers import invoke_fresh

PLUGIN = str(Path(__file__).with_name("plugin_drift.py"))
TRUE_MS = 1.5


class OccasionTimer:
    """Samples (seconds) of a case whose speed moves between occasions (log-normal, ``occasion_sd``), then
    between processes within an occasion (``process_sd``), then call to call (``sample_sd``)."""

    def __init__(self, seed: int, occasion_sd: float = 0.06, process_sd: float = 0.02, sample_sd: float = 0.03):
        self.rng = np.random.default_rng(seed)
        self.occasion_sd, self.process_sd, self.sample_sd = occasion_sd, process_sd, sample_sd

    def occasion(self, processes: int = 5, samples: int = 20, slowdown: float = 1.0) -> list[list[float]]:
        """One occasion: ``processes`` lists of per-call seconds."""
        occ = self.rng.normal(0.0, self.occasion_sd)
        out = []
        for _ in range(processes):
            proc = occ + self.rng.normal(0.0, self.process_sd)
            out.append(list(TRUE_MS / 1e3 * slowdown * np.exp(proc + self.rng.normal(0.0, self.sample_sd, samples))))
        return out


def _medians_ms(groups: list[list[float]]) -> list[float]:
    return [float(np.median(g)) * 1e3 for g in groups]


def test_process_level_cries_wolf_across_occasions_the_occasion_level_holds():
    trials, wolf_process, wolf_occasion = 150, 0, 0
    for seed in range(trials):
        t = OccasionTimer(seed)
        base = [t.occasion() for _ in range(5)]
        cand = t.occasion()                                    # the same code on a later occasion
        wolf_process += process_timing_verdict(base[0], cand).verdict == "regressed"
        wolf_occasion += occasion_timing_verdict([_medians_ms(o) for o in base], _medians_ms(cand)).verdict \
            == "regressed"
    # seeded: the same counts every run. Occasions 6 % apart against processes 2 % apart: a one-occasion
    # baseline calls a fifth of the A/A checks regressions; the occasion level none (alpha = 0.002, two-sided)
    assert wolf_process / trials > 0.1
    assert wolf_occasion == 0


def test_a_slowdown_beyond_the_occasion_spread_is_caught_and_the_mde_says_what_was_not():
    t = OccasionTimer(3, occasion_sd=0.005, process_sd=0.005)      # a steady case (the drifty plug-in)
    base = [_medians_ms(t.occasion()) for _ in range(5)]
    v2 = occasion_timing_verdict(base, _medians_ms(t.occasion(slowdown=2.0)))
    v10 = occasion_timing_verdict(base, _medians_ms(t.occasion(slowdown=1.10)))
    assert v2.verdict == "regressed" and v2.ratio == pytest.approx(2.0, rel=0.05) and v2.occasions == 5
    assert v10.verdict == "regressed" and v10.mde < 0.10
    noisy = OccasionTimer(3)                                      # occasions 6 % apart: 10 % is out of reach
    nb = [_medians_ms(noisy.occasion()) for _ in range(5)]
    vn = occasion_timing_verdict(nb, _medians_ms(noisy.occasion(slowdown=1.10)))
    assert vn.verdict != "regressed" and vn.mde > 0.10
    assert "5 baseline occasions" in vn.mde_text


def test_occasion_ratio_reduces_to_the_prediction_interval_and_needs_two_occasions():
    occ = [[1.0, 1.1, 0.9], [1.2, 1.3, 1.1], [0.9, 1.0, 0.8]]
    r = occasion_ratio(occ, [1.0, 1.1, 0.9], alpha=ALPHA)
    means = np.array([np.log(o).mean() for o in occ])
    # equal processes a side: se² = s_o²·(1 + 1/K) whenever s_o² ≥ s_p²/N (here it is)
    assert r.se_log == pytest.approx(np.sqrt(means.var(ddof=1) * (1 + 1 / 3)), rel=1e-9) and r.df == 2
    assert not r.significant and r.ci_low < r.ratio < r.ci_high
    with pytest.raises(ValueError):
        occasion_ratio([[1.0, 1.1]], [1.0])
    with pytest.raises(ValueError):
        occasion_ratio(occ, [])


def test_timing_verdict_goes_over_occasions_only_where_the_baseline_has_them():
    t = OccasionTimer(11)
    base = [t.occasion() for _ in range(3)]
    cand = t.occasion()
    samples = [x for g in base[0] for x in g]
    rounds = [len(g) for g in base[0]]
    cs, cr = [x for g in cand for x in g], [len(g) for g in cand]
    over_occ = timing_verdict(samples, rounds, cs, cr, base_processes=5, cand_processes=5,
                              base_occasions_ms=[_medians_ms(o) for o in base])
    over_proc = timing_verdict(samples, rounds, cs, cr, base_processes=5, cand_processes=5)
    assert over_occ.occasions == 3 and over_proc.occasions == 1
    assert "1 baseline occasion" in over_proc.mde_text and "3 baseline occasions" in over_occ.mde_text
    paired = timing_verdict(samples, rounds, cs, cr, base_processes=5, cand_processes=5, paired=True,
                            base_occasions_ms=[_medians_ms(o) for o in base])
    assert paired.occasions == 1 and paired.paired                # --against: one occasion, paired processes


def _doc(occasions: list[list[float]] | None = None, macs: float = 100.0, case: str = "k1") -> dict:
    timing = {"median_ms": 1.0, "round_cv": 0.01, "samples_s": [0.001, 0.0011], "rounds": [1, 1],
              "n_processes": 2, "process_medians_ms": [1.0, 1.1]}
    if occasions:
        timing |= {"n_occasions": len(occasions), "occasion_medians_ms": occasions}
    return {"format": 1, "suite": "s", "quick": True, "created": "t0", "run_id": "r0", "commit": "c0",
            "env": {"hard": {"torch": "2.14.1", "cpu": "x"}},
            "cases": [{"case_key": case, "line": "l", "arch": "a", "status": "ok", "workload": {}, "config": {},
                       "deterministic": {"macs": macs}, "tolerant": {}, "timing": timing}]}


def test_the_document_keeps_occasions_and_append_grows_them():
    two = _doc([[1.0, 1.1], [1.2, 1.15]])
    b = parse_baseline(two)
    assert b.cases[0].timing.n_occasions == 2 and b.cases[0].timing.occasion_medians_ms[1] == (1.2, 1.15)
    assert parse_baseline(_doc()).cases[0].timing.n_occasions == 1
    grown = append_occasions(two, {**_doc(), "created": "t1", "run_id": "r1"})
    t = grown["cases"][0]["timing"]
    assert t["n_occasions"] == 3 and t["occasion_medians_ms"][-1] == [1.0, 1.1]
    assert t["samples_s"] == two["cases"][0]["timing"]["samples_s"] and grown["run_id"] == "r0"
    assert grown["appended"] == [{"created": "t1", "run_id": "r1", "commit": "c0"}]
    assert parse_baseline(grown).cases[0].timing.n_occasions == 3


@pytest.mark.parametrize("new, says", [
    ({**_doc(), "suite": "other"}, "baseline of 's'"),
    (_doc(case="k2"), "the cases differ"),
    (_doc(macs=150.0), "macs 100.0 → 150.0"),
    ({**_doc(), "env": {"hard": {"torch": "2.15.0", "cpu": "x"}}}, "another environment (torch)"),
])
def test_append_refuses_what_is_not_the_same_measurement(new, says):
    with pytest.raises(BenchInputError, match="cannot append") as exc:
        append_occasions(_doc([[1.0, 1.1], [1.2, 1.15]]), new)
    assert says in str(exc.value)


def test_bad_occasions_in_a_file_are_one_line():
    bad = _doc([[1.0, 1.1], [1.2, -1.0]])
    with pytest.raises(BenchInputError, match="occasion_medians_ms"):
        parse_baseline(bad)


SUITE = """
name = "occ"
metrics = ["latency"]
fixed = { arch = "drifty", batch_size = 4, threads = 1 }
[lines]
narrow = { width = 80 }
"""


def test_cli_baseline_on_occasions_append_and_check(tmp_path, cli):
    """Each command in this process as if in a fresh one (tests.helpers.invoke_fresh, the inline executor): a `bench`
    process each only added its start-up (~3 CPU-s)."""
    suite = tmp_path / "occ.toml"
    suite.write_text(SUITE)
    base, store = str(tmp_path / "base.json"), f"sqlite:///{tmp_path / 's.sqlite'}"
    common = ["--quick", "--plugin", PLUGIN, "--executor", "inline", "--store", store]
    res = invoke_fresh("baseline", str(suite), "-o", base, "--occasions", "2", *common)
    assert res.exit_code == 0 and "2 occasions" in res.stdout, res.stderr
    res = invoke_fresh("baseline", str(suite), "-o", base, "--occasions", "1", "--append", *common)
    assert res.exit_code == 0 and "appended to" in res.stdout and "3 occasions" in res.stdout, res.stderr
    t = json.loads(Path(base).read_text())["cases"][0]["timing"]
    assert t["n_occasions"] == 3 and all(len(o) == 1 for o in t["occasion_medians_ms"])
    md = tmp_path / "c.md"
    res = invoke_fresh("check", str(suite), "--baseline", base, "--markdown", str(md), *common)     # A/A
    assert res.exit_code == 0, res.stdout + res.stderr
    text = md.read_text()
    assert "3 baseline occasions" in text and "over the baseline's occasions (3)" in text
    before = Path(base).read_text()
    res = invoke_fresh("baseline", str(suite), "-o", base, "--append", "--occasions", "1", *common,
                 env={"BENCH_TEST_WIDEN": "1.5"})
    assert res.exit_code == 2 and "the code changed" in res.stderr, res.stderr
    assert Path(base).read_text() == before                    # a refused append leaves the file as it was
    res = cli("baseline", str(suite), "-o", base, "--occasions", "0", *common)    # refused before anything: in process
    assert res.exit_code == 2 and "--occasions must be at least 1" in res.stderr


def test_an_inconclusive_verdict_over_occasions_is_listed_with_what_it_could_see():
    from reports.check.report import CheckReport, CheckRow
    t = OccasionTimer(5, occasion_sd=0.08)
    base = [_medians_ms(t.occasion()) for _ in range(5)]
    over_occ = occasion_timing_verdict(base, _medians_ms(t.occasion(slowdown=1.2)))
    assert over_occ.verdict == "inconclusive" and over_occ.mde > 0.2
    row = dict(line="l", arch="a", label="a", params={}, kind="both", status="ok", base_status="ok",
               timing_gated=True)
    report = CheckReport(rows=(CheckRow(case_key="occ", timing=over_occ, **row),))
    assert report.inconclusive_keys() == ["occ"] and report.blind_mde() == over_occ.mde
