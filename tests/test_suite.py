"""Suite loading: expansion, and every kind of bad input named by file and key."""
from __future__ import annotations

import pytest

from harness.contract.errors import BenchInputError
from harness.contract.suite import load_suite, parse_set
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


def test_set_compile_reaches_every_case_and_a_bad_value_names_the_key(write_suite):
    """``--set compile=...`` is a workload field like the others; a value the device cannot run is refused at
    load (one line, the file and the key), before anything is measured."""
    path = write_suite(TINY_SUITE)
    compiled = load_suite(str(path), sets={"compile": "default"})
    assert {c.workload.compile for c in compiled.cases} == {"default"}
    assert {c.key for c in compiled.cases}.isdisjoint(c.key for c in load_suite(str(path)).cases)
    graphs = load_suite(str(path), sets={"compile": "cudagraphs", "device": "cuda"})
    assert {(c.workload.compile, c.workload.device) for c in graphs.cases} == {("cudagraphs", "cuda")}
    for sets, needle in (({"compile": "cudagraphs"}, "needs a CUDA device"), ({"compile": "jit"}, "unknown compile")):
        with pytest.raises(BenchInputError, match=needle) as info:
            load_suite(str(path), sets=sets)
        assert str(path) in str(info.value) and "compile" in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------- [cuda]: the suite on a CUDA device

CUDA_SUITE = TINY_SUITE + """
[quick]
sweep = { seq_len = [8] }
lines = ["MQA"]
[cuda]
fixed = { batch_size = 4 }
sweep = { seq_len = [128, 256] }
dtypes = ["bf16", "fp32"]
"""


def test_cuda_table_applies_only_on_a_cuda_device(write_suite):
    path = str(write_suite(CUDA_SUITE))
    cpu = load_suite(path)
    assert not cpu.cuda and {c.workload.dtype for c in cpu.cases} == {"fp32"}
    assert sorted({c.workload.seq_len for c in cpu.cases}) == [16, 32, 64] and {c.line for c in cpu.cases} == {"MHA", "MQA"}
    gpu = load_suite(path, sets={"device": "cuda"})
    assert gpu.cuda and len(gpu.cases) == 2 * 2 * 2
    assert {(c.line, c.workload.dtype) for c in gpu.cases} == {
        ("MHA bf16", "bf16"), ("MHA fp32", "fp32"), ("MQA bf16", "bf16"), ("MQA fp32", "fp32")}
    assert {(c.workload.seq_len, c.workload.batch_size, c.workload.device) for c in gpu.cases} == {
        (128, 4, "cuda"), (256, 4, "cuda")}
    assert gpu.spec.lines["MQA bf16"] == {"n_kv_heads": 1, "dtype": "bf16"} and gpu.spec.sweep == {"seq_len": [128, 256]}
    assert {c.point for c in gpu.cases} == {0, 1}            # one sweep axis: the dtype is part of the line
    on_file = load_suite(str(write_suite(CUDA_SUITE.replace("batch_size = 1 }", 'batch_size = 1, device = "cuda:0" }'),
                                         name="own.toml")))
    assert on_file.cuda and {c.workload.dtype for c in on_file.cases} == {"bf16", "fp32"}   # fixed.device counts too


def test_cuda_and_quick_combine(write_suite):
    """On CUDA --quick applies [cuda.quick] after [cuda] when the suite has one, else [quick] after [cuda]."""
    after_quick = load_suite(str(write_suite(CUDA_SUITE)), quick=True, sets={"device": "cuda"})
    assert {(c.line, c.workload.seq_len, c.workload.batch_size) for c in after_quick.cases} == {
        ("MQA bf16", 8, 4), ("MQA fp32", 8, 4)}
    own = CUDA_SUITE + '[cuda.quick]\nsweep = { seq_len = [32] }\nlines = ["MHA"]\ndtypes = ["bf16"]\n'
    cuda_quick = load_suite(str(write_suite(own, name="own.toml")), quick=True, sets={"device": "cuda"})
    assert {(c.line, c.workload.seq_len, c.workload.batch_size, c.workload.dtype) for c in cuda_quick.cases} == {
        ("MHA bf16", 32, 4, "bf16")}
    cpu_quick = load_suite(str(write_suite(own, name="own.toml")), quick=True)
    assert {(c.line, c.workload.seq_len) for c in cpu_quick.cases} == {("MQA", 8)}
    disjoint = CUDA_SUITE.replace("[cuda]\n", '[cuda]\nlines = ["MHA"]\n')
    with pytest.raises(BenchInputError, match="selects none") as info:
        load_suite(str(write_suite(disjoint, name="disjoint.toml")), quick=True, sets={"device": "cuda"})
    assert "quick.lines" in str(info.value) and "disjoint.toml" in str(info.value)


def test_a_pinned_dtype_wins_over_the_dtypes_list(write_suite):
    suite = load_suite(str(write_suite(CUDA_SUITE)), sets={"device": "cuda", "dtype": "fp16"})
    assert {(c.line, c.workload.dtype) for c in suite.cases} == {("MHA", "fp16"), ("MQA", "fp16")}


BAD_CUDA = {
    "not a table": ("cuda = 3\n", "cuda"),
    "unknown key": ("[cuda]\ncolour = 1\n", "cuda.colour"),
    "unknown quick key": ("[cuda.quick]\ncolour = 1\n", "cuda.quick.colour"),
    "no such line": ('[cuda]\nlines = ["GQA"]\n', "cuda.lines"),
    "lines not a list": ('[cuda]\nlines = "MHA"\n', "cuda.lines"),
    "unknown dtype": ('[cuda]\ndtypes = ["fp8"]\n', "cuda.dtypes"),
    "empty dtypes": ("[cuda]\ndtypes = []\n", "cuda.dtypes"),
    "repeated dtype": ('[cuda]\ndtypes = ["bf16", "bf16"]\n', "cuda.dtypes"),
    "bad quick dtype": ('[cuda.quick]\ndtypes = ["int4"]\n', "cuda.quick.dtypes"),
    "fixed not a table": ("[cuda]\nfixed = 3\n", "cuda.fixed"),
    "unknown config key": ("[cuda]\nfixed = { n_kv_headz = 2 }\n", "cuda.fixed"),
    "bad sweep value": ("[cuda]\nsweep = { seq_len = [16, -1] }\n", "cuda.sweep"),
    "empty sweep": ("[cuda]\nsweep = { seq_len = [] }\n", "cuda.sweep.seq_len"),
    "dtype swept and listed": ('[cuda]\nsweep = { dtype = ["bf16"] }\ndtypes = ["fp32"]\n', "cuda.dtypes"),
    "line sets its dtype": ('[cuda]\ndtypes = ["bf16"]\n', "cuda.dtypes"),
}


@pytest.mark.parametrize("name", list(BAD_CUDA))
def test_bad_cuda_table_is_one_clear_error_on_any_device(write_suite, name):
    """A [cuda] table is validated on every load (a typo surfaces on the CPU, not first on the GPU machine)."""
    extra, where = BAD_CUDA[name]
    text = TINY_SUITE.replace("n_kv_heads = 1 }", 'n_kv_heads = 1, dtype = "fp32" }') if name == "line sets its dtype" \
        else TINY_SUITE
    path = write_suite(text + extra)
    for sets in ({}, {"device": "cuda"}):
        with pytest.raises(BenchInputError) as info:
            load_suite(str(path), sets=sets)
        message = str(info.value)
        assert str(path) in message and where in message and "\n" not in message, message
