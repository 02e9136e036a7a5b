"""A replicated case's later processes time it only: ``merge_processes`` keeps the first process's counts and memory,
so the memory pass, the kernel probe and the energy pass run once per case, not once per process."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from harness.contract.records import CaseRecord
from harness.contract.spec import Case, Workload
from harness.engine.runner import RunOptions, run_case, run_group
from harness.executors import ProcessExecutor
from harness.instruments.timing import TimingConfig

TIMING = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=0.5, rounds=2)
W = Workload(batch_size=1, seq_len=16)


def _case(key: str = "d", point: int = 0) -> Case:
    return Case("repeat", key, "decoder-tiny", (), W, ("latency", "memory"), point=point)


def test_a_repeat_pass_times_the_case_and_skips_its_memory_pass_and_probe():
    first, later = RunOptions(timing=TIMING), RunOptions(timing=TIMING, repeat=True)
    a, b = run_case(_case(), first), run_case(_case(), later)
    assert a.ok and b.ok, (a.message, b.message)
    assert a.metric("peak_bytes") and a.metric("time_memory_s") is not None and a.sdpa_backend
    assert b.metric("median_ms") and b.samples_s
    assert b.metric("peak_bytes") is None and b.metric("time_memory_s") is None and not b.sdpa_backend
    pair = run_group([_case("x"), _case("y")], RunOptions(timing=TIMING, interleave=True, repeat=True))
    assert all(r.ok and r.samples_s and r.metric("peak_bytes") is None for r in pair), [r.message for r in pair]


class _Spy(ProcessExecutor):
    """A process executor that notes each pass's options."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[bool] = []

    def _run_groups(self, groups: Sequence[Sequence[Case]], opts: RunOptions) -> Iterator[CaseRecord]:
        self.passes.append(opts.repeat)
        yield from super()._run_groups(groups, opts)


def test_only_the_first_process_measures_memory_and_the_merged_record_keeps_it():
    ex = _Spy()
    try:
        (rec,) = list(ex.run([_case()], RunOptions(timing=TIMING, timeout_s=120, processes=2)))
    finally:
        ex.close()
    assert ex.passes == [False, True]
    assert rec.ok and rec.metric("n_processes") == 2.0, rec.message
    assert rec.metric("peak_bytes") and rec.sdpa_backend           # the first process's, kept by the merge
