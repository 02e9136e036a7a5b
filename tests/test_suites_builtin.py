"""Every built-in suite under suites/ loads (full and --quick), expands to cases whose architectures
resolve, and dry-runs through the CLI with exit code 0."""
from __future__ import annotations

import pytest

from harness.contract import registry
from harness.contract.suite import list_suites, load_suite

SUITES = list_suites()
NEEDS = {"vision_zoo": "timm", "hf_vs_ours": "transformers"}
"""Suites whose lines need an optional extra: their tests skip without it (`make test` installs every extra)."""


def _needs(path) -> None:
    if path.stem in NEEDS:
        pytest.importorskip(NEEDS[path.stem])


def test_there_are_builtin_suites():
    assert SUITES, "no suites/*.toml found"


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_builtin_suite_loads_and_resolves(path, quick):
    _needs(path)
    suite = load_suite(str(path), quick=quick)
    assert suite.name == path.stem
    assert suite.description, f"{path.name} has no description"
    assert len(suite.cases) > 0
    assert len({c.key for c in suite.cases}) == len(suite.cases), "two cases share a key"
    for case in suite.cases:
        spec = registry.resolve(case.arch, **dict(case.overrides))
        assert spec.config is not None


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_builtin_suite_dry_run_exits_0(cli, path, quick):
    _needs(path)
    args = ["run", str(path), "--dry-run"] + (["--quick"] if quick else [])
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "nothing measured" in result.output


# ---------------------------------------------------------------- CPU runs unchanged; [cuda] expansions

import hashlib  # noqa: E402

from harness.contract.suite import SUITES_DIR  # noqa: E402

PINNED_CPU_KEYS = {
    ("attention_core", False): (24, "63b8542e58efda5f"),
    ("attention_core", True): (28, "2050356d5333e8be"),
    ("attention_scaling", False): (60, "9579cbe9aa338783"),
    ("attention_scaling", True): (30, "c45751620d9dc48b"),
    ("attention_vs_lstm", False): (28, "6c90a7a0bd7be93c"),
    ("attention_vs_lstm", True): (24, "98fab369cebae08a"),
    ("ci", False): (6, "96057a1d6d0ded0c"),
    ("ci", True): (6, "96057a1d6d0ded0c"),
    ("heads", False): (7, "accde2789074dd7b"),
    ("heads", True): (7, "e2899c22e381cd77"),
    ("kv_cache", False): (72, "2bc669504e5bee40"),
    ("kv_cache", True): (24, "98a0ea2b9f74fe02"),
    ("long_sequence", False): (35, "934c0a3386b55458"),
    ("long_sequence", True): (42, "d1ed0adfb344434b"),
    ("norm_placement", False): (20, "9268ff9521597c9f"),
    ("norm_placement", True): (12, "7b86e9dcc90be21d"),
    ("ours_vs_torch", False): (20, "ec3fb48c588a5da7"),
    ("ours_vs_torch", True): (20, "81ce0a78b717b333"),
    ("positions", False): (30, "14c93a087c9107da"),
    ("positions", True): (15, "23fe2dad8553336e"),
    ("resolution_scaling", False): (12, "0cd81f1c3105e43f"),
    ("resolution_scaling", True): (6, "2be21774f528e1e2"),
    ("rnn_vs_attention", False): (60, "35631d453e5daada"),
    ("rnn_vs_attention", True): (30, "2f02587eeb2f62e6"),
    ("vit_vs_cnn", False): (14, "e164b095ef4d148e"),
    ("vit_vs_cnn", True): (14, "0fc6453deedd6e01"),
    ("ssm_vs_attention", False): (36, "970e1dfe00ffd0d1"),
    ("ssm_vs_attention", True): (45, "998467fc4f5919f4"),
    ("vision_zoo", False): (24, "f3b75db7ccd86cd3"),
    ("vision_zoo", True): (16, "71c9f7293162f9b7"),
    ("generation", False): (54, "31b4f7744fae76d8"),
    ("generation", True): (12, "a5330781505b48a8"),
    ("vision_frontier", False): (78, "e2490467946d0c98"),
    ("vision_frontier", True): (8, "80fc96ee9b352e1b"),
    ("training", False): (44, "d6a05f2e28c72fe0"),
    ("training", True): (6, "b27538ac77d76448"),
    ("hf_vs_ours", False): (10, "a89d1b13a2464095"),
    ("hf_vs_ours", True): (10, "c1a31ff3852984af"),
    ("scaling", False): (24, "6c5b073add301f9a"),
    ("scaling", True): (12, "d94a276cabade5c8"),
}
"""(suite, --quick) -> (cases, sha1 of their keys in order) without --device cuda, taken before the [cuda] tables
were added: a CPU run of every built-in suite keeps its cases and keys (stored runs, --resume and the CI
baseline align by key). A deliberate change to a suite's CPU cases re-pins its entry here (kv_cache and long_sequence gained lines —
Mamba's state, Longformer — keeping every earlier key)."""


def _digest(keys: list[str]) -> str:
    return hashlib.sha1(" ".join(keys).encode()).hexdigest()[:16]


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_cpu_cases_are_pinned(path, quick):
    _needs(path)
    if (path.stem, quick) not in PINNED_CPU_KEYS:
        pytest.fail(f"{path.name} is new: pin its CPU case keys in PINNED_CPU_KEYS")
    keys = [c.key for c in load_suite(str(path), quick=quick).cases]
    assert (len(keys), _digest(keys)) == PINNED_CPU_KEYS[(path.stem, quick)]
    assert [c.key for c in load_suite(str(path), quick=quick, sets={"device": "cpu"}).cases] == keys


CUDA_SUITES = ("attention_scaling", "vit_vs_cnn", "long_sequence", "kv_cache", "heads", "generation", "training",
               "scaling")
AMP_SUITES = ("training", "scaling")   # [cuda] trains under bf16 autocast over fp32 master weights (dtype fp32, amp bf16)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_builtin_suite_expands_for_cuda(path, quick):
    """Expanding for CUDA needs no GPU. A suite with [cuda] runs its GPU sizes in bf16 (and fp32 in the full
    run), every line labelled with its dtype; a suite without one runs its CPU cases on the GPU."""
    _needs(path)
    cpu = load_suite(str(path), quick=quick)
    gpu = load_suite(str(path), quick=quick, sets={"device": "cuda"})
    assert gpu.cases and len({c.key for c in gpu.cases}) == len(gpu.cases)
    assert {c.workload.device for c in gpu.cases} == {"cuda"}
    assert gpu.cuda == (path.stem in CUDA_SUITES)
    if not gpu.cuda:
        assert [(c.line, c.arch, c.overrides, c.workload.dtype) for c in gpu.cases] == [
            (c.line, c.arch, c.overrides, c.workload.dtype) for c in cpu.cases]
        return
    if path.stem in AMP_SUITES:
        assert {(c.workload.dtype, c.workload.amp) for c in gpu.cases} == {("fp32", "bf16")}
        assert not {c.key for c in gpu.cases} & {c.key for c in cpu.cases}
        return
    dtypes = {c.workload.dtype for c in gpu.cases}
    bf16_only = quick or path.stem == "vit_vs_cnn"         # its full [cuda] run is bf16 too (under 60 s on an H100)
    assert dtypes == ({"bf16"} if bf16_only else {"bf16", "fp32"})
    assert all(c.line.endswith(" " + c.workload.dtype) for c in gpu.cases)
    assert not {c.key for c in gpu.cases} & {c.key for c in cpu.cases}


def test_cuda_sizes_are_gpu_sized():
    """What a GPU user expects: lengths past 16k where memory allows, batches that fill the device."""
    def most(name: str, field: str) -> int:
        return max(getattr(c.workload, field) for c in load_suite(name, sets={"device": "cuda"}).cases)
    assert most("attention_scaling", "seq_len") >= 32768
    assert most("long_sequence", "seq_len") >= 65536
    assert most("kv_cache", "seq_len") >= 32768
    assert most("vit_vs_cnn", "batch_size") >= 256
    assert {c.workload.batch_size for c in load_suite("vit_vs_cnn", sets={"device": "cuda"}).cases} >= {1, 256}


def test_every_builtin_cuda_table_is_documented():
    for name in CUDA_SUITES:
        text = (SUITES_DIR / f"{name}.toml").read_text()
        assert "[cuda]" in text and "[cuda.quick]" in text and "On a CUDA device" in text, name
