"""The executor interface: run cases, yield one Record per case as each finishes."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from harness.runner import RunOptions
from harness.records import CaseRecord
from harness.spec import Case


class Executor(Protocol):
    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]: ...

    def close(self) -> None: ...
