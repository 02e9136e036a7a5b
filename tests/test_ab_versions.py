"""Two versions of the code in alternating worker processes (harness.engine.ab, `bench check --against`): the
worktree of a commit, its worker module, and an A/A pair whose counted metrics and rounds match. Nothing here
judges a timing, so these run in `make test`'s parallel phase (the timing side of interleaving is
tests/test_interleave.py's, run alone)."""
from __future__ import annotations

import pytest

from harness.contract.errors import BenchInputError
from harness.engine import ab
from harness.engine.env import REPO
from harness.engine.runner import RunOptions, run_case
from harness.instruments.timing import TimingConfig
from tests.test_interleave import _case


def test_two_versions_alternate_in_worker_processes():
    """A/A: this checkout against itself, in two alternating workers: same counted metrics, paired rounds."""
    case = _case("MHA", 8, 0, n_kv_heads=4)
    (base, cand), = ab.interleave_versions([case], RunOptions(timing=TimingConfig.quick(), timeout_s=120), REPO)
    assert base.ok and cand.ok, (base.message, cand.message)
    assert base.metric("macs") == cand.metric("macs") and base.metric("params") == cand.metric("params")
    assert base.group == cand.group and len(base.rounds) == len(cand.rounds) == 6   # 5 rounded up: 3 per worker
    assert base.metric("n_processes") == cand.metric("n_processes") == 2 and base.metric("process_rounds") == 3
    # measured as a run measures: the memory pass and the kernel probe too
    assert base.sdpa_backend and base.sdpa_backend == cand.sdpa_backend
    assert base.metric("executed_macs") == cand.metric("executed_macs") and base.metric("executed_macs") > 0
    assert base.metric("peak_bytes") and cand.metric("peak_bytes")


def test_a_worker_record_has_the_fields_of_a_run_record():
    """The A/B worker measures a prepared step as `bench run` does (harness.engine.measure.measure_prepared): one
    worker per version, so its record is the worker's own, with the same metric names, SDPA backend and counted
    figures as a run's record of the case."""
    case = _case("MHA", 8, 0, n_kv_heads=4)
    opts = RunOptions(timing=TimingConfig.quick(), timeout_s=120)
    (base, cand), = ab.interleave_versions([case], opts, REPO, processes=1)
    run = run_case(case, opts)
    assert base.ok and cand.ok and run.ok, (base.message, cand.message, run.message)
    for rec in (base, cand):
        assert set(rec.metrics) == set(run.metrics), set(rec.metrics) ^ set(run.metrics)
        assert rec.sdpa_backend == run.sdpa_backend != ""
        assert rec.metric("time_timed_s") > 0 and rec.metric("time_warmup_s") > 0
        for k in ("macs", "params", "executed_macs", "est_peak_bytes", "peak_bytes"):
            assert rec.metric(k) == run.metric(k), k


def test_against_needs_a_real_commit_with_the_worker():
    with pytest.raises(BenchInputError, match="no commit"):
        with ab.worktree("no-such-ref-xyz"):
            pass
    with ab.worktree("HEAD") as tree:
        assert (tree / "harness" / "engine" / "ab_worker.py").exists()
        assert ab.worker_module(tree) == "harness.engine.ab_worker"
    assert not tree.exists()


def test_against_finds_the_worker_of_a_commit_before_the_regroup(tmp_path):
    """A commit from before harness/ was regrouped into folders kept its worker at harness/ab_worker.py."""
    (tmp_path / "harness").mkdir()
    assert ab.worker_module(tmp_path) is None
    (tmp_path / "harness" / "ab_worker.py").write_text("")
    assert ab.worker_module(tmp_path) == "harness.ab_worker"
