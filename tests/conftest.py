"""Shared fixtures: temporary suite files and stores, a CLI runner."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main

TINY_SUITE = """
name = "tiny"
metrics = ["latency", "memory", "flops"]
fixed = { arch = "decoder-tiny", batch_size = 1 }
sweep = { seq_len = [16, 32, 64] }
plot = { x = "seq_len", y = "median_ms" }
[lines]
MHA = { n_kv_heads = 4 }
MQA = { n_kv_heads = 1 }
"""


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture
def write_suite(tmp_path: Path):
    def write(text: str, name: str = "suite.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.sqlite'}"


def counted_cost(spec, workload) -> tuple[int, int]:
    """(parameters, forward MACs) of ``spec`` on ``workload``, counted on fake tensors (no memory)."""
    from harness.fake import build_fake, new_fake_mode
    from harness.flops import count_model, count_params

    cpu = torch.device("cpu")
    mode = new_fake_mode()
    fake = build_fake(lambda: spec.build(spec.config).eval(), mode, cpu)
    with mode:
        macs = count_model(fake, spec.make_inputs(spec.config, workload, cpu)).macs
    return count_params(fake), macs


def invoke(*args: str):
    """The CLI in this process; stderr is kept apart (``result.stderr``)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_tiny(tmp: Path, *extra: str, text: str = TINY_SUITE):
    """Write a suite (the tiny one by default) into ``tmp`` and run it --quick inline into a fresh store.

    Returns (suite_path, store_url, click_result).
    """
    suite = tmp / "tiny.toml"
    suite.write_text(textwrap.dedent(text))
    url = f"sqlite:///{tmp / 'results.sqlite'}"
    return suite, url, invoke("run", str(suite), "--quick", "--executor", "inline", "--store", url, *extra)


def store_slower_copy(store, run: dict, factor: float = 2.0) -> str:
    """Store a copy of ``run`` as if measured on another machine: every median × ``factor``. Returns its id."""
    import dataclasses
    from harness.spec import Record
    rows = store.records(run["id"])
    fields = {f.name for f in dataclasses.fields(Record)}
    copy = store.create_run(run["suite"], run["suite_path"], True, len(rows), run["env"], run["options"])
    for r in rows:
        rec = Record(**{k: r[k] for k in fields})
        rec.metrics = {**rec.metrics, "median_ms": rec.metrics["median_ms"] * factor}
        store.add_record(copy, rec)
    store.finish_run(copy)
    return copy


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke
