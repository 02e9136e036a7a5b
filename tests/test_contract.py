"""The contract (workload, case, records, suite loading, registry) is plain data importable without torch, and one
place checks a workload against an architecture (harness.contract.spec.workload_overrides / check_workload)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.contract import registry
from harness.contract.errors import BenchInputError
from harness.contract.spec import DTYPE_BYTES, DTYPES, Workload, check_workload, workload_overrides
from harness.contract.suite import load_suite

ROOT = Path(__file__).resolve().parent.parent
TORCH_FREE = ("harness.contract.spec", "harness.contract.records", "harness.contract.errors", "harness.contract.registry", "harness.contract.suite",
              "harness.analysis.stats", "harness.analysis.ratios", "harness.engine.overhead", "reports.frames", "reports.findings", "reports.check.report",
              "reports.check.render", "reports.export", "reports.terminal", "reports.html", "harness.tools.pytest_plugin")


def test_the_contract_and_the_reports_import_without_torch():
    code = (f"import sys\nfor m in {TORCH_FREE!r}:\n    __import__(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_dtype_names_and_sizes_agree_with_torch():
    import torch
    from harness.instruments.torch_types import TORCH_DTYPES, torch_dtype
    assert set(DTYPES) == set(TORCH_DTYPES)
    for name in DTYPES:
        assert torch_dtype(name).itemsize == DTYPE_BYTES[name] == Workload(dtype=name).itemsize
    assert torch_dtype(Workload(dtype="bf16")) is torch.bfloat16


def test_a_model_with_an_image_size_takes_the_workloads():
    vit = registry.resolve("vit-micro").config
    assert workload_overrides(vit, Workload(img_size=64)) == {"img_size": 64}
    assert workload_overrides(registry.resolve("decoder-tiny").config, Workload(img_size=64)) == {}


def test_a_sequence_past_learned_positions_is_refused_naming_the_field():
    spec = registry.resolve("encoder-small")                # learned positions: max_seq_len bounds it
    check_workload(spec, Workload(seq_len=spec.config.max_seq_len))
    with pytest.raises(BenchInputError, match=r"^seq_len: .*max_seq_len"):
        check_workload(spec, Workload(seq_len=spec.config.max_seq_len + 1))
    rope = registry.resolve("decoder-rope-small")           # relative positions: any length
    check_workload(rope, Workload(seq_len=rope.config.max_seq_len * 4))


def test_a_suite_past_learned_positions_is_one_line_exit_2(cli, write_suite):
    n = registry.resolve("encoder-small").config.max_seq_len
    path = write_suite(f'name = "long"\nfixed = {{ arch = "encoder-small" }}\nsweep = {{ seq_len = [16, {2 * n}] }}\n')
    res = cli("run", str(path), "--dry-run")
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "seq_len" in res.stderr and "max_seq_len" in res.stderr
    with pytest.raises(BenchInputError):
        load_suite(str(path))
    ok = write_suite(f'name = "long2"\nfixed = {{ arch = "encoder-small", max_seq_len = {2 * n} }}\n'
                     f'sweep = {{ seq_len = [{2 * n}] }}\n', name="ok.toml")
    assert len(load_suite(str(ok)).cases) == 1          # raising max_seq_len with it is fine
