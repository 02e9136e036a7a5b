"""A scratch git repository for `bench history` and `bench bisect`: this checkout's harness and architectures, and a
plug-in (``plugins/sleepy.py``: a busy-wait of its pause, then an MLP) committed once per commit, each version with
its own pause and hidden width. Runs "at" a commit are measured in this process with that commit's plug-in (the
inline executor) and stored with that commit, as a CI job at that commit would store them."""
from __future__ import annotations

import shutil
import subprocess
import textwrap
from collections.abc import Sequence
from pathlib import Path

from harness.contract import plugins, registry
from harness.contract.suite import load_suite
from harness.engine.env import fingerprint
from harness.engine.models import MODELS
from harness.session import Run, run_options
from harness.store.db import Store

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sleepy"
PLUGIN_PATH = "plugins/sleepy.py"
SUITE = """
name = "sleepy"
metrics = ["latency", "flops"]
fixed = { arch = "sleepy", batch_size = 1, threads = 1 }
[lines]
spin = { width = 8 }
"""

PLUGIN = '''"""Test-only plug-in: a {pause_ms} ms busy-wait and an MLP of hidden width {hidden} (revision {rev})."""
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from harness.contract.registry import register
from harness.contract.spec import ArchSpec

REVISION = {rev}
PAUSE_MS = {pause_ms}
HIDDEN = {hidden}


@dataclass(frozen=True)
class SleepyConfig:
    width: int = 8


class Sleepy(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up, self.down = nn.Linear(cfg.width, HIDDEN), nn.Linear(HIDDEN, cfg.width)

    def forward(self, x):
        if not is_fake(x):
            end = time.perf_counter() + PAUSE_MS / 1e3
            while time.perf_counter() < end:    # a busy-wait: a sleep overshoots by ~0.1 ms, by more or less
                pass                            # from one minute to the next (an 8 % step at 2 ms, once)
        return self.down(torch.relu(self.up(x)))


def sleepy_inputs(cfg, w, device):
    return (torch.randn(w.batch_size, cfg.width, device=device),)


register(ArchSpec("sleepy", "test", SleepyConfig(), Sleepy, sleepy_inputs, "test-only: a pause and an MLP"))
'''


def git(repo: Path, *args: str) -> str:
    got = subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", *args], cwd=repo,
                         capture_output=True, text=True, check=True)
    return got.stdout.strip()


def make_repo(repo: Path, versions: Sequence[tuple[float, int]]) -> list[str]:
    """A repository whose commit i (1-based) holds the plug-in with ``versions[i-1]`` = (pause ms, hidden width);
    the first commit also holds this checkout's harness and architectures. Returns the commits, oldest first."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for top in ("harness", "architectures"):
        for rel in subprocess.run(["git", "ls-files", top], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.split():
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, dst)
    (repo / "plugins").mkdir()
    shas = []
    for i, (pause, hidden) in enumerate(versions, start=1):
        (repo / PLUGIN_PATH).write_text(PLUGIN.format(rev=i, pause_ms=pause, hidden=hidden))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}: pause {pause} ms, hidden {hidden}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


def use_plugin(path: Path) -> None:
    """Register ``sleepy`` from ``path`` in this process (replacing any other version) and forget built models."""
    registry._ARCHS.pop(ARCH, None)
    plugins._loaded_files.pop(str(path.resolve()), None)
    plugins.load_file(path)
    MODELS.clear()


def suite_file(where: Path) -> Path:
    path = where / "sleepy.toml"
    path.write_text(textwrap.dedent(SUITE))
    return path


def run_at(store: Store, repo: Path, sha: str, suite_path: Path, scratch: Path, source: str | None = None) -> str:
    """Measure the suite with commit ``sha``'s plug-in in this process (--quick timing) and store the run at
    ``sha``; returns the run id. ``source``: the plug-in's text, when ``repo`` does not hold it."""
    copy = scratch / sha[:12] / "sleepy.py"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(source if source is not None else git(repo, "show", f"{sha}:{PLUGIN_PATH}") + "\n")
    use_plugin(copy)
    suite = load_suite(str(suite_path), quick=True)
    env = fingerprint(threads=1)
    env["soft"] = {**env["soft"], "commit": sha, "dirty": False}
    with Run.open(store, suite.name, list(suite.cases), quick=True, env=env, suite_path=suite.path,
                  suite_text=suite.text, spec=suite.spec) as run:
        run.execute("inline", run_options(True, plugins=(str(copy),)))
    return run.record().id
