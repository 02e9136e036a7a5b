"""Suite loading: expansion, and every kind of bad input named by file and key."""
from __future__ import annotations

import pytest

from harness.errors import BenchInputError
from harness.suite import load_suite, parse_set
from tests.helpers import TINY_SUITE


def test_expands_lines_times_sweep(write_suite):
    suite = load_suite(str(write_suite(TINY_SUITE)))
    assert len(suite.cases) == 6
    assert {c.line for c in suite.cases} == {"MHA", "MQA"}
    assert sorted({c.workload.seq_len for c in suite.cases}) == [16, 32, 64]
    assert len({c.key for c in suite.cases}) == 6
    assert dict(suite.cases[0].overrides) == {"n_kv_heads": 4}


def test_a_suite_of_only_lines_is_valid(write_suite):
    """No sweep: one case per line (a sweep without lines is one line, "default")."""
    text = ('fixed = { arch = "decoder-tiny", seq_len = 16 }\n[lines]\n'
            'MHA = { n_kv_heads = 4 }\nMQA = { n_kv_heads = 1 }\n')
    suite = load_suite(str(write_suite(text)))
    assert [(c.line, dict(c.overrides)["n_kv_heads"], c.workload.seq_len) for c in suite.cases] == [
        ("MHA", 4, 16), ("MQA", 1, 16)]
    assert suite.spec.sweep == {} and set(suite.spec.lines) == {"MHA", "MQA"} and suite.text == text


def test_the_suite_as_run_is_kept_with_its_text(write_suite):
    path = write_suite(TINY_SUITE + '[quick]\nsweep = { seq_len = [8] }\n')
    suite = load_suite(str(path), quick=True, sets={"batch_size": 2})
    assert suite.text == path.read_text()
    assert suite.spec.sweep == {"seq_len": [8]} and suite.spec.fixed == {"arch": "decoder-tiny", "batch_size": 2}
    assert suite.spec.lines == {"MHA": {"n_kv_heads": 4}, "MQA": {"n_kv_heads": 1}}
    assert suite.spec.plot == {"x": "seq_len", "y": "median_ms"} and suite.spec.metrics == ("latency", "memory", "flops")


def test_quick_may_run_a_subset_of_the_lines(write_suite):
    path = write_suite(TINY_SUITE + '[quick]\nlines = ["MQA"]\n')
    assert {c.line for c in load_suite(str(path), quick=True).cases} == {"MQA"}
    assert {c.line for c in load_suite(str(path)).cases} == {"MHA", "MQA"}
    for bad, needle in (('["GQA"]', "no such line 'GQA'"), ("[]", "non-empty list"), ('"MQA"', "non-empty list")):
        with pytest.raises(BenchInputError, match=needle) as info:
            load_suite(str(write_suite(TINY_SUITE + f"[quick]\nlines = {bad}\n", name="bad.toml")))
        assert "quick.lines" in str(info.value)


def test_quick_and_set_override(write_suite):
    path = write_suite(TINY_SUITE + '[quick]\nsweep = { seq_len = [8] }\n')
    assert {c.workload.seq_len for c in load_suite(str(path), quick=True).cases} == {8}
    pinned = load_suite(str(path), sets={"seq_len": 24, "batch_size": 2})
    assert {(c.workload.seq_len, c.workload.batch_size) for c in pinned.cases} == {(24, 2)}


def test_builtin_suites_load():
    for ref in ("suites/attention_scaling", "attention_scaling"):
        suite = load_suite(ref, quick=True)
        assert suite.name == "attention_scaling" and len(suite.cases) >= 12


BAD = {
    "toml syntax": ("name = 'x'\nfixed = {arch = }\n", "TOML syntax error"),
    "unknown top key": (TINY_SUITE + "colour = 'red'\n", "colour"),
    "unknown config key": (TINY_SUITE.replace("n_kv_heads = 1", "n_kv_headz = 1"), "n_kv_headz"),
    "wrong type": (TINY_SUITE.replace("n_kv_heads = 1", "n_kv_heads = 'one'"), "n_kv_heads"),
    "unknown arch": (TINY_SUITE.replace("decoder-tiny", "decoder-nope"), "decoder-nope"),
    "heads not dividing": (TINY_SUITE.replace("n_kv_heads = 1 }", "n_kv_heads = 1, n_heads = 5 }"),
                           "must divide d_model"),
    "kv heads not dividing": (TINY_SUITE.replace("n_kv_heads = 1", "n_kv_heads = 3"), "n_kv_heads"),
    "negative size": (TINY_SUITE.replace("[16, 32, 64]", "[16, -32]"), "seq_len"),
    "zero size": (TINY_SUITE.replace("batch_size = 1", "batch_size = 0"), "batch_size"),
    "empty sweep list": (TINY_SUITE.replace("[16, 32, 64]", "[]"), "sweep.seq_len"),
    "neither sweep nor lines": ('fixed = { arch = "decoder-tiny", seq_len = 8 }\nsweep = {}\n', "nothing to run"),
    "unknown metric": (TINY_SUITE.replace('"flops"]', '"flops", "joy"]'), "joy"),
    "unknown dtype": (TINY_SUITE.replace("batch_size = 1", "batch_size = 1, dtype = 'fp8'"), "dtype"),
    "unknown mode": (TINY_SUITE.replace("batch_size = 1", "batch_size = 1, mode = 'train'"), "mode"),
    "line overrides swept key": (TINY_SUITE.replace("n_kv_heads = 1", "seq_len = 4"), "lines.MQA.seq_len"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_suite_is_one_clear_error(write_suite, name):
    text, needle = BAD[name]
    path = write_suite(text)
    with pytest.raises(BenchInputError) as info:
        load_suite(str(path))
    message = str(info.value)
    assert str(path) in message and needle in message
    assert "\n" not in message


def test_missing_suite():
    with pytest.raises(BenchInputError, match="no suite file"):
        load_suite("suites/does_not_exist")


def test_parse_set():
    assert parse_set(["seq_len=8", "attn_impl=eager", 'dtype="bf16"', "x=true"]) == {
        "seq_len": 8, "attn_impl": "eager", "dtype": "bf16", "x": True}
    with pytest.raises(BenchInputError):
        parse_set(["novalue"])
