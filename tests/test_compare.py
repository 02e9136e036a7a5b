"""`bench compare`: per-case ratio B/A with its interval (the one comparison) and a verdict, from stored runs."""
from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from harness.contract.records import CaseRecord, RunRecord
from harness.store.db import Store
from reports.compare import compare_runs, env_differences, interleaved_rows
from tests.helpers import invoke


@pytest.fixture(scope="module")
def stored(tiny_store):
    """One real quick run of the tiny suite (conftest's ``tiny_store``: one thread, measured once per process; this
    module writes its synthetic runs into its own copy)."""
    _, url = tiny_store
    store = Store(url, create=False)
    run = store.get_run("latest")
    return url, store, run, store.records(run.id)


def _copy_run(store: Store, run: RunRecord, rows: list[CaseRecord], scale: float = 1.0, env: dict | None = None,
              drop: int = 0, samples: Callable[[CaseRecord], Sequence[float]] = lambda r: r.samples_s) -> str:
    """A synthetic run holding ``rows`` (all but the last ``drop``) with every sample (``samples(row)``,
    by default the row's own) scaled by ``scale``."""
    run_id = store.create_run(run.suite, run.suite_path, run.quick, len(rows),
                              dict(env if env is not None else run.env), {"synthetic": True})
    for r in rows[:len(rows) - drop]:
        store.add_record(run_id, replace(r, samples_s=tuple(s * scale for s in samples(r))))
    store.finish_run(run_id)
    return run_id


def test_run_against_itself_is_all_same_ratio_exactly_one(stored):
    url, _, run, rows = stored
    result = compare_runs(rows, rows)
    assert len(result.rows) == 6
    # the same samples on both sides: ratio 1 exactly; "same" only where the interval (both sides' noise) lies
    # within 5 %, else inconclusive — never faster or slower
    assert all(r["ratio"] == 1.0 and r["verdict"] in ("same", "inconclusive") for r in result.rows)
    assert result.counts["faster"] == result.counts["slower"] == 0 and result.geomean_ratio == 1.0
    assert all((r["verdict"] == "same") == (r["ci_low"] >= 1 / 1.05 and r["ci_high"] <= 1.05) for r in result.rows)
    assert result.axis == "seq_len" and sorted({r["axis_value"] for r in result.rows}) == [16, 32, 64]
    res = invoke("compare", run.id, run.id, "--store", url)
    assert res.exit_code == 0, res.stderr
    n = result.counts
    assert f"6 cases compared: 0 faster, 0 slower, {n['same']} same within 5 %, {n['inconclusive']} inconclusive" \
        in res.stdout
    assert "geometric-mean ratio B/A 1.000" in res.stdout
    assert "warning" not in res.stderr


def _steady(r: CaseRecord) -> tuple[float, ...]:
    """20 samples within ±2 % of the row's median: a real run on a loaded machine can spread its samples
    past 2×, and then no bootstrap can (or should) call a 2× change "slower"."""
    m = statistics.median(r.samples_s)
    return tuple(m * (1 + 0.01 * (i % 5 - 2)) for i in range(20))


def test_samples_scaled_by_two_are_slower(stored):
    url, store, real, _ = stored
    a_id = _copy_run(store, real, store.records(real.id), samples=_steady)
    run, rows = store.get_run(a_id), store.records(a_id)
    b_id = _copy_run(store, run, rows, scale=2.0)
    result = compare_runs(rows, store.records(b_id))
    for r in result.rows:
        assert r["verdict"] == "slower"
        assert r["ratio"] == pytest.approx(2.0, rel=1e-9)
        assert r["ci_low"] > 1.0 and r["b_median_ms"] == pytest.approx(2 * r["a_median_ms"])
    assert result.geomean_ratio == pytest.approx(2.0)
    res = invoke("compare", run.id, b_id, "--store", url)
    assert res.exit_code == 0, res.stderr
    assert "0 faster, 6 slower, 0 same within 5 %, 0 inconclusive" in res.stdout
    # and the other way round, B is faster
    back = invoke("compare", b_id, run.id, "--store", url)
    assert "6 faster, 0 slower, 0 same within 5 %" in back.stdout and "geometric-mean ratio B/A 0.500" in back.stdout


def test_cases_in_one_run_only_and_not_ok_are_counted(stored):
    url, store, run, rows = stored
    b_id = _copy_run(store, run, rows, drop=2)
    errored = replace(rows[0], status="error", message="boom", samples_s=())
    result = compare_runs([errored, *rows[1:]], store.records(b_id))
    assert (result.only_a, result.only_b, result.not_ok, len(result.rows)) == (2, 0, 1, 3)
    res = invoke("compare", run.id, b_id, "--store", url)
    assert "4 cases compared" in res.stdout and "only in A 2" in res.stdout


def test_differing_fingerprint_warns_one_line_naming_keys(stored):
    url, store, run, rows = stored
    env = copy.deepcopy(run.env)
    env["hard"]["cpu"] = "Some Other CPU"
    env["hard"]["threads"] = 64
    env["soft"]["host"] = "elsewhere"          # soft fields never warn
    b_id = _copy_run(store, run, rows, env=env)
    assert env_differences(run.env, env) == ["cpu", "threads"]
    res = invoke("compare", run.id, b_id, "--store", url)
    assert res.exit_code == 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning") and "cpu, threads" in lines[0]
    assert "host" not in lines[0]
    assert "6 cases compared: 0 faster, 0 slower" in res.stdout


def test_unknown_run_exit_2_one_line(stored):
    url, _, run, _ = stored
    res = invoke("compare", run.id, "19990101-nope", "--store", url)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "19990101-nope" in lines[0]


def test_interleaved_rows_name_each_case_as_every_view_does():
    """`bench compare --interleave`'s rows carry the case's label from reports.labels (the architecture, then
    the fields that vary within its line), and its table shows it; a failed pair keeps its label."""
    from reports.labels import param_labels
    from reports.terminal import interleaved_table
    from rich.console import Console

    def rec(key: str, seq_len: int, samples: tuple[float, ...], status: str = "ok") -> CaseRecord:
        return CaseRecord(case_key=key, suite="tiny", line="MHA", arch="decoder-tiny", status=status,
                          workload={"seq_len": seq_len, "batch_size": 1, "threads": 1},
                          metrics={"median_ms": 1e3 * statistics.median(samples)} if samples else {},
                          samples_s=samples, rounds=(2, 2) if samples else ())
    a = [rec("k1", 16, (1e-3,) * 4), rec("k2", 32, (2e-3,) * 4)]
    measured = [a[0], rec("k1", 16, (1.5e-3,) * 4), a[1], rec("k2", 32, (), status="error")]
    rows = interleaved_rows([(r, r) for r in a], measured)
    assert [r["label"] for r in rows] == param_labels(a, arch=True) == ["decoder-tiny · seq_len=16",
                                                                        "decoder-tiny · seq_len=32"]
    assert rows[0]["verdict"] == "slower" and rows[1]["verdict"] == "failed"
    console = Console(width=200, record=True)
    console.print(interleaved_table(rows, "A", "B"))
    text = console.export_text()
    assert "decoder-tiny · seq_len=16" in text and "decoder-tiny · seq_len=32" in text
