"""Helpers the tests share (fixtures stay in conftest.py): the tiny suite, the CLI in-process, a tiny
run into a fresh store, a copy of a run as if measured elsewhere, and a model's counted cost."""
from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import torch
from click.testing import CliRunner, Result

from cli import main
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_model, count_params
from harness.contract.records import RunRecord
from harness.contract.spec import ArchSpec, Workload
from harness.store.db import Store

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


def counted_cost(spec: ArchSpec, workload: Workload) -> tuple[int, int]:
    """(parameters, forward MACs) of ``spec`` on ``workload``, counted on fake tensors (no memory)."""
    cpu = torch.device("cpu")
    mode = new_fake_mode()
    fake = build_fake(lambda: spec.build(spec.config).eval(), mode, cpu)
    with mode:
        macs = count_model(fake, spec.make_inputs(spec.config, workload, cpu)).macs
    return count_params(fake), macs


def invoke(*args: str) -> Result:
    """The CLI in this process; stderr is kept apart (``result.stderr``)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def invoke_fresh(*args: str, env: dict[str, str] | None = None) -> Result:
    """:func:`invoke` as if in a fresh `bench` process, for commands that measure (a `bench` process only adds its
    start-up, ~3 CPU-s). What a separate process gave for free is restored around it: the environment variables
    ``env`` sets (test plug-ins read them), torch's thread count (a case sets its own), and the model kept between
    cases (harness.engine.models.MODELS: a plug-in whose build reads the environment must be built again). A
    plug-in file it loads stays registered in this process (by its test-only name)."""
    import os
    from unittest import mock

    from harness.engine.models import MODELS
    threads = torch.get_num_threads()
    MODELS.clear()
    try:
        with mock.patch.dict(os.environ, env or {}):
            return invoke(*args)
    finally:
        MODELS.clear()
        torch.set_num_threads(threads)


def run_tiny(tmp: Path, *extra: str, text: str = TINY_SUITE) -> tuple[Path, str, Result]:
    """Write a suite (the tiny one by default) into ``tmp`` and run it --quick inline into a fresh store.

    Returns (suite_path, store_url, click_result).
    """
    suite = tmp / "tiny.toml"
    suite.write_text(textwrap.dedent(text))
    url = f"sqlite:///{tmp / 'results.sqlite'}"
    return suite, url, invoke("run", str(suite), "--quick", "--executor", "inline", "--store", url,
                              "--report", str(tmp / "report.html"), *extra)


def store_slower_copy(store: Store, run: RunRecord, factor: float = 2.0) -> str:
    """Store a copy of ``run`` as if measured on another machine: every median × ``factor``. Returns its id."""
    records = store.records(run.id)
    copy = store.create_run(run.suite, run.suite_path, True, len(records), dict(run.env), dict(run.options),
                            suite_text=run.suite_text, spec=run.spec)
    for r in records:
        metrics = {**r.metrics, "median_ms": r.metrics["median_ms"] * factor}
        store.add_record(copy, dataclasses.replace(r, metrics=metrics, run_id=""))
    store.finish_run(copy)
    return copy


@torch.no_grad()
def greedy_without_cache(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The definition the generation loop must meet: greedy decoding that reruns the whole sequence (B, T) through
    ``model``'s plain forward at every step -> the ``new_tokens`` new ids (B, N)."""
    out = prompt
    for _ in range(new_tokens):
        out = torch.cat([out, model(out)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)   # (B, T + 1)
    return out[:, prompt.shape[1]:]
