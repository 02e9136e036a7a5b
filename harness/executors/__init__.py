"""Where cases run: in this process (``inline``) or in a reused, spawned worker (``process``)."""
from __future__ import annotations

from harness.executors.base import Executor
from harness.executors.inline import InlineExecutor
from harness.executors.process import ProcessExecutor

EXECUTORS: dict[str, type[Executor]] = {"process": ProcessExecutor, "inline": InlineExecutor}


def make_executor(name: str) -> Executor:
    return EXECUTORS[name]()
