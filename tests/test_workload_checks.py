"""Loading a suite checks trainability the same way in every interpreter: the check is passed, not registered by
an import that may or may not have happened."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SUITE = """\
name = "untrainable"
metrics = ["latency"]
fixed = { arch = "attention-core", batch_size = 1, seq_len = 16, d_model = 64, n_heads = 2 }
[lines]
"train" = { mode = "train_step" }
"""


def _fresh(code: str, tmp_path) -> subprocess.CompletedProcess:
    (tmp_path / "untrainable.toml").write_text(SUITE)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_a_fresh_interpreter_refuses_an_untrainable_training_step_on_load(tmp_path):
    done = _fresh("""
        import sys
        from harness.contract.errors import BenchInputError
        from harness.contract.suite import load_suite
        from harness.engine.checks import WORKLOAD_CHECKS
        try:
            load_suite("untrainable.toml", checks=WORKLOAD_CHECKS)
        except BenchInputError as exc:
            print(exc)
            sys.exit(3)
    """, tmp_path)
    assert done.returncode == 3, done.stderr
    assert "trainable parameters" in done.stdout


def test_the_engine_imported_or_not_the_contract_alone_runs_only_its_own_checks(tmp_path):
    done = _fresh("""
        import harness.engine.training
        from harness.contract.suite import load_suite
        print(len(load_suite("untrainable.toml").cases))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
