"""`bench claims` measures only what some rule reads, reuses what the store holds, and says in advance how long it
will take (claims/reads.toml, claims/estimate.py, claims/timings.toml)."""
from __future__ import annotations

from pathlib import Path

import json
import tomllib
from functools import cache

import pytest

from claims.catalog import load_catalog
from claims.estimate import estimate, load_timings, minutes, pieces_of
from claims.evidence import Context
from claims.experiment_store import ExperimentStore
from claims.reads import READS, Reads, load_reads, parse, reads_of
from harness.contract.errors import BenchInputError
from harness.contract.spec import WORKLOAD_KEYS
from harness.store.db import Store
from harness.contract.suite import list_suites, load_suite
from tests.helpers import invoke

TINY = """
name = "tiny_reads"
metrics = ["flops"]
fixed = {{ arch = "lra-exact", d_model = 16, n_heads = 2, n_layers = 1, vocab_size = 16, batch_size = 1 }}
sweep = {{ seq_len = [8, 16] }}
[lines]
"exact" = {{ attn_impl = "sdpa" }}
"eager" = {{ attn_impl = "eager" }}
"""


ROOT = Path(__file__).resolve().parent.parent


@cache
def _suites_by_name() -> dict[str, object]:
    """Every suite by its name: the built-in ones and the claims' own (claims/*.toml with a name and lines)."""
    claims_suites = [p for p in (ROOT / "claims").glob("*.toml")
                     if {"name", "lines"} <= set(tomllib.loads(p.read_text()))]
    return {tomllib.loads(p.read_text()).get("name", p.stem): p for p in [*list_suites(), *claims_suites]}


@pytest.mark.parametrize("suite", sorted(load_reads()))
def test_every_cut_names_lines_and_values_the_suite_has(suite):
    """A typo in claims/reads.toml must not silently cut (or keep) a line: every label, drop key and value exists in
    the suite, the cut keeps some cases and leaves out some, and it says why."""
    paths = _suites_by_name()
    assert suite in paths, f"claims/reads.toml names {suite!r}, which is no built-in suite"
    loaded = load_suite(str(paths[suite]), quick=True)
    reads = reads_of(suite)
    labels = set(loaded.lines)
    assert set(reads.lines or ()) <= labels
    for match in (*reads.drop, *reads.processes_for):
        entry = dict(match)
        assert entry.get("line", next(iter(labels))) in labels
        for key, value in entry.items():
            if key != "line":
                seen = {getattr(c.workload, key) if key in WORKLOAD_KEYS else dict(c.overrides).get(key)
                        for c in loaded.cases}
                assert value in seen, f"{suite}: no case has {key} = {value!r}"
    kept = [c for c in loaded.cases if reads.keeps(c)]
    assert reads.why.strip()
    if reads.lines is not None or reads.drop:
        assert 0 < len(kept) < len(loaded.cases)
    else:                                           # read whole: listed only to be measured over processes
        assert kept == list(loaded.cases) and reads.processes > 1


def test_the_cuts_of_the_quick_run():
    """What the quick claims run leaves out, suite by suite (claims/reads.toml; the why of each is in the file)."""
    paths = _suites_by_name()
    counts = {}
    for suite in load_reads():
        cases = load_suite(str(paths[suite]), quick=True).cases
        if reads_of(suite).lines is not None or reads_of(suite).drop:
            counts[suite] = (len(cases), sum(reads_of(suite).keeps(c) for c in cases))
    assert counts == {"rnn_vs_attention": (30, 18), "ssm_vs_attention": (45, 30), "vit_vs_cnn": (14, 11),
                      "vision_zoo": (16, 4)}
    vit = load_suite(str(paths["vit_vs_cnn"]), quick=True).cases
    assert all(reads_of("vit_vs_cnn").keeps(c) for c in vit if c.workload.batch_size == 1)   # batch 1: every model
    big = {c.line for c in vit if c.workload.batch_size > 1 and reads_of("vit_vs_cnn").keeps(c)}
    assert big == {"resnet50", "efficientnet-b0", "vit-b16", "vit-s16"}
    assert [s for s in load_reads() if reads_of(s).peak] == ["vit_vs_cnn"]        # C23's vit_peak_share
    # over 3 processes: batch 1, which the central timing rules (C23, C27, C28) read; the larger batch in one
    assert [c.workload.batch_size for c in vit if reads_of("vit_vs_cnn").over_processes(c)] == [1] * 7
    assert reads_of("no_such_suite") == Reads()                                   # unlisted: whole, no calibration


def test_reads_file_is_checked():
    with pytest.raises(BenchInputError, match="unknown key"):
        parse({"heads": {"lines": ["MHA eager"], "why": "x", "keep": 1}})
    with pytest.raises(BenchInputError, match="why"):
        parse({"heads": {"lines": ["MHA eager"]}})
    with pytest.raises(BenchInputError, match="lines"):
        parse({"heads": {"lines": [], "why": "x"}})
    with pytest.raises(BenchInputError, match="processes_for"):
        parse({"heads": {"processes_for": [{"batch_size": 1}], "why": "x"}})      # without processes ≥ 2
    assert tomllib.loads(READS.read_text())                                        # the shipped file parses


def test_a_second_run_on_the_same_store_measures_no_case_again(write_suite, tmp_path):
    """Context.suite measures only the kept cases, once: a second context on the same store (a second `bench
    claims --only X`) reuses the run, measuring nothing; the pieces say what was measured and what reused."""
    path = write_suite(TINY.format())
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    reads = {"tiny_reads": Reads(lines=("exact",), why="test")}
    measured: list[str] = []

    def context() -> Context:
        return Context(store=store, quick=True, threads=1, executor="inline", calibrate=True,
                       on_record=lambda r: measured.append(r.line))

    import claims.evidence as evidence
    original = evidence.reads_of
    evidence.reads_of = lambda name: reads.get(name, Reads())
    try:
        first = context()
        run, rows = first.suite(str(path))
        assert measured == ["exact", "exact"] and {r.line for r in rows} == {"exact"}
        assert not run.peak                                        # no rule reads this suite's peak: none calibrated
        assert first.pieces["suite tiny_reads"]["reused"] is False and first.pieces["suite tiny_reads"]["cases"] == 2
        again = context()
        run2, rows2 = again.suite(str(path))
        assert measured == ["exact", "exact"]                      # nothing measured the second time
        assert run2.id == run.id and [r.case_key for r in rows2] == [r.case_key for r in rows]
        assert again.pieces["suite tiny_reads"]["reused"] is True
        reads["tiny_reads"] = Reads(lines=("exact", "eager"), why="test")
        third = context()
        run3, _ = third.suite(str(path))                           # a case the stored run lacks: measured again
        assert run3.id != run.id and measured.count("eager") == 2
        reads["tiny_reads"] = Reads(lines=("eager",), why="test")
        fourth = context()
        run4, rows4 = fourth.suite(str(path))                      # a run holding more than is read serves
        assert run4.id == run3.id and {r.line for r in rows4} == {"eager"} and len(measured) == 6
    finally:
        evidence.reads_of = original


def test_pieces_of_a_claim_come_from_its_needs():
    by_id = {c.id: c for c in load_catalog()}
    assert pieces_of(by_id["C10"]) == ["probe mqa", "suite kv_cache", "experiment kv_heads", "suite claims_generation"]
    assert pieces_of(by_id["C23"]) == ["probe matmul_friendly", "suite vit_vs_cnn"]              # the GPU suite: cuda
    assert pieces_of(by_id["C23"], "cuda") == ["probe matmul_friendly", "suite vit_vs_cnn", "suite claims_gpu_rate"]
    assert pieces_of(by_id["C02"]) == ["probe qk_macs"]


def test_estimates_count_each_piece_once_and_never_invent_a_zero(tmp_path):
    by_id = {c.id: c for c in load_catalog()}
    table = {"probe mqa": 1.0, "probe gqa": 2.0, "suite kv_cache": 60.0, "experiment kv_heads": 120.0}
    per, total, unknown = estimate([by_id["C10"], by_id["C11"]], None, table=table)
    assert total == 1 + 2 + 60 + 120                                # kv_cache and kv_heads counted once
    assert unknown == ["suite claims_generation"]
    assert minutes(per["C10"]).startswith("≥ 3.0 min (no estimate for suite claims_generation")
    per, total, _ = estimate([by_id["C02"]], None, table={"probe qk_macs": 90.0})
    assert minutes(per["C02"]) == "~1.5 min" and total == 90.0
    assert all(v >= 0 for v in load_timings().values())            # the shipped table parses


def test_a_stored_experiment_costs_nothing_in_the_estimate(tmp_path, monkeypatch):
    import claims.evidence as evidence
    from harness.engine.env import fingerprint
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    ctx = Context(store=store, quick=True, threads=1, seeds=(0,))
    by_id = {c.id: c for c in load_catalog()}
    table = {"probe ssm_recall": 1.0, "experiment recall": 300.0, "experiment ssm_lm": 200.0}
    _, total, _ = estimate([by_id["C41"]], ctx, table=table)
    assert total == 501.0
    ExperimentStore(store).add("recall", True, [0], fingerprint(threads=1),
                               {"code_hash": evidence.experiments_code_hash()})
    per, total, _ = estimate([by_id["C41"]], ctx, table=table)
    assert total == 201.0 and [p.source for p in per["C41"]] == ["table", "stored", "table"]


def test_bench_claims_list_shows_each_claims_estimated_minutes(tmp_path):
    r = invoke("claims", "--quick", "--list", "--only", "C02,C10", "--store", f"sqlite:///{tmp_path / 'none.sqlite'}")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["C02", "C10"]
    assert "~0.0 min" in lines[0] and " min" in lines[1]
    assert "estimated" in r.stderr and "counted once" in r.stderr and "timings.toml" in r.stderr
    assert not (tmp_path / "none.sqlite").exists()                  # --list creates no store


def test_timings_in_the_claims_json_context(tmp_path):
    """A claims run records what each piece took (context.pieces), the data timings.toml is refreshed from."""
    out = tmp_path / "c.html"
    r = invoke("claims", "--quick", "--only", "C02,C26", "--store", f"sqlite:///{tmp_path / 's.sqlite'}",
               "-o", str(out))
    assert r.exit_code == 0, r.output
    pieces = json.loads(out.with_suffix(".json").read_text())["context"]["pieces"]
    assert set(pieces) == {"probe qk_macs", "probe attention_arithmetic"}
    assert all(p["seconds"] >= 0 and p["reused"] is False for p in pieces.values())


def test_kv_heads_mha_and_causal_share_one_training(monkeypatch):
    """causal's masked decoder is kv_heads' MHA (same config, seed, data and loop): trained once per process, with
    results identical to training it twice."""
    import dataclasses

    from claims.experiments import causal, kv_heads, lm_train

    def tiny(mod):
        return dataclasses.replace(mod.QUICK, steps=2, warmup=1, batch=2, seq_len=16, eval_windows=4, eval_batch=4,
                                   corpus_bytes=100_000, d_model=32,
                                   **({"prefixes": 4} if mod is causal else {}))

    trained = []
    real = lm_train.train_lm
    monkeypatch.setattr(lm_train, "train_lm", lambda *a, **k: trained.append(1) or real(*a, **k))
    monkeypatch.setattr(lm_train, "TRAINED", {})

    def clean(r):
        r = json.loads(json.dumps(r))
        r["scale"].pop("wall_seconds")
        for m in r["models"].values():
            m.pop("train_seconds")
        return r

    kv_heads.EXPERIMENT.run(seeds=(0,), setup=tiny(kv_heads))
    shared = clean(causal.EXPERIMENT.run(seeds=(0,), setup=tiny(causal)))
    assert len(trained) == 3 + 1                                   # MHA, GQA-2, MQA; then only causal's no_mask
    lm_train.TRAINED.clear()
    alone = clean(causal.EXPERIMENT.run(seeds=(0,), setup=tiny(causal)))
    assert len(trained) == 4 + 2 and shared == alone
    assert lm_train.shared_key(d_model=128, n_heads=8, n_kv_heads=8) == lm_train.shared_key(d_model=128, n_heads=8)
    assert lm_train.shared_key(n_heads=8, n_kv_heads=2) != lm_train.shared_key(n_heads=8)


def test_the_table_is_refreshed_from_a_runs_pieces(tmp_path):
    from claims.estimate import table_from_run
    doc = {"context": {"quick": True, "threads": 2, "seeds": [0], "wall_s": 60.0,
                       "pieces": {"suite heads": {"seconds": 42.04, "reused": False},
                                  "suite kv_cache": {"seconds": 0.2, "reused": True},
                                  "probe heads": {"seconds": 1.25, "reused": False},
                                  "experiment claims_generation": {"seconds": 7.0, "reused": False}}},
           "env": {"hard": {"cpu": "x", "torch": "2"}}}
    path = tmp_path / "t.toml"
    path.write_text(table_from_run(doc, "measured on a test"))
    assert load_timings(path) == {"suite heads": 42.0, "probe heads": 1.2, "experiment claims_generation": 7.0}


def test_only_the_cases_a_deciding_timing_rule_reads_run_over_processes(write_suite, tmp_path, monkeypatch):
    """``processes_for``: the cases it matches are measured in the reads' worker processes, the others as the run
    asks (one process): what a rule over processes reads has its interval over them, and nothing else pays for it."""
    path = write_suite(TINY.format().replace('metrics = ["flops"]', 'metrics = ["latency"]'))
    store = Store(f"sqlite:///{tmp_path / 's.sqlite'}")
    reads = Reads(lines=("exact",), processes=2, processes_for=((("seq_len", 16),),), why="test")
    import claims.evidence as evidence
    monkeypatch.setattr(evidence, "reads_of", lambda name: reads)
    ctx = Context(store=store, quick=True, threads=1, executor="process", calibrate=False)
    _, rows = ctx.suite(str(path))
    assert {r.value("seq_len"): r.metric("n_processes") for r in rows} == {8: 1.0, 16: 2.0}


def test_the_suites_of_a_claims_run_share_one_worker(write_suite, tmp_path):
    """One worker process measures every one-process suite of a context (it starts once, not per suite), and each
    run accounts only its own worker start."""
    first = write_suite(TINY.format(), "a.toml")
    second = write_suite(TINY.format().replace("tiny_reads", "tiny_reads_2"), "b.toml")
    ctx = Context(store=Store(f"sqlite:///{tmp_path / 's.sqlite'}"), quick=True, threads=1, executor="process",
                  calibrate=False)
    try:
        runs = [ctx.suite(str(p))[0] for p in (first, second)]
        assert ctx.kept_executor().starts == 1
        assert [r.options["overhead"]["worker_starts"] for r in runs] == [1, 0]
    finally:
        ctx.close()
