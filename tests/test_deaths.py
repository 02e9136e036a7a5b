"""A dead worker's case: ``oom`` only when the kernel's out-of-memory kill counter moved, else ``crashed``."""
from __future__ import annotations

import signal
from pathlib import Path

from harness.executors.deaths import _memory_cgroup_files, death_record, read_oom_kills
from harness.contract.spec import Case, Workload

CASE = Case("s", "line", "decoder-tiny", (), Workload(), ("latency",))


def _counter(path: Path, n: int) -> Path:
    path.write_text(f"pgfault 12\noom_kill {n}\nother 3\n")
    return path


def test_sigkill_with_a_moved_counter_is_oom(tmp_path):
    vmstat = _counter(tmp_path / "vmstat", 4)
    before = read_oom_kills([vmstat])
    _counter(vmstat, 5)
    rec = death_record(CASE, -signal.SIGKILL, before, read_oom_kills([vmstat]))
    assert rec.status == "oom"
    assert "SIGKILL" in rec.message and "4 → 5" in rec.message


def test_sigkill_with_an_unchanged_counter_is_crashed(tmp_path):
    vmstat = _counter(tmp_path / "vmstat", 4)
    snap = read_oom_kills([vmstat])
    rec = death_record(CASE, -signal.SIGKILL, snap, read_oom_kills([vmstat]))
    assert rec.status == "crashed"
    assert "SIGKILL" in rec.message and "unchanged" in rec.message


def test_no_counter_is_crashed_and_says_so(tmp_path):
    none = read_oom_kills([tmp_path / "missing"])
    assert none.counts == ()
    rec = death_record(CASE, -signal.SIGSEGV, none, none)
    assert rec.status == "crashed" and "SIGSEGV" in rec.message and "no out-of-memory counter" in rec.message


def test_an_exit_is_crashed_with_its_code():
    rec = death_record(CASE, 3, read_oom_kills([]), read_oom_kills([]))
    assert rec.status == "crashed" and "exit code 3" in rec.message


def test_cgroup_files_v1_and_v2(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job/abc\n1:cpu:/\n0::/user.slice/x\n")
    files = [str(p.relative_to(tmp_path)) for p in _memory_cgroup_files(proc, tmp_path)]
    assert "memory/job/abc/memory.oom_control" in files and "user.slice/x/memory.events" in files


def test_this_machine_has_a_readable_counter():
    """Linux ≥ 4.13 exposes oom_kill in /proc/vmstat: the evidence the classification rests on."""
    assert any(src == "/proc/vmstat" for src, _ in read_oom_kills().counts)
