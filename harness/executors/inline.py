"""Run cases in the calling process: no isolation and no timeout; for tests and debugging."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from harness.executors.base import interleave_groups
from harness.contract.records import CaseRecord
from harness.engine.runner import RunOptions, run_case, run_group
from harness.contract.spec import Case


class InlineExecutor:
    startup_s: float = 0.0
    starts: int = 0

    def run(self, cases: Sequence[Case], opts: RunOptions) -> Iterator[CaseRecord]:
        if opts.interleave:
            for group in interleave_groups(cases):
                yield from run_group(group, opts)
            return
        for case in cases:
            yield run_case(case, opts)

    def close(self) -> None:
        pass
