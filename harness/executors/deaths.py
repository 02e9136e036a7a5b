"""What a worker's death means for the case it was measuring: ``oom`` only on evidence, else ``crashed``.

A worker that dies mid-case (killed by a signal, or exiting by itself) is the case's result and the sweep goes on
in a new worker. SIGKILL is what the kernel's out-of-memory killer sends, but so do ``kill -9``, a supervisor and
a container runtime: the case is called ``oom`` only when an out-of-memory kill was *recorded* while it ran — the
kernel's ``oom_kill`` counter moved, system-wide (``/proc/vmstat``) or in this process's memory cgroup (v2
``memory.events``, v1 ``memory.oom_control``). Otherwise the death is ``crashed``, with the signal or exit code.
(An out-of-memory the allocator raises inside the worker is caught there and is ``oom`` already:
:func:`harness.engine.measure.is_oom`.)
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from harness.contract.records import CaseRecord
from harness.contract.spec import Case

PROC_VMSTAT = Path("/proc/vmstat")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class OomKills:
    """The kernel's out-of-memory kill counters readable here, by source (a file path): {} where none is."""

    counts: tuple[tuple[str, int], ...] = ()

    def moved_since(self, before: OomKills) -> str | None:
        """The first counter that grew since ``before``, as "SOURCE a → b", or None."""
        old = dict(before.counts)
        for source, n in self.counts:
            if source in old and n > old[source]:
                return f"{source} oom_kill {old[source]} → {n}"
        return None


def _field(path: Path, name: str) -> int | None:
    """The integer after ``name`` on its line of ``path`` (``oom_kill 3``), or None where unreadable."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _memory_cgroup_files(proc_cgroup: Path = Path("/proc/self/cgroup"),
                         root: Path = CGROUP_ROOT) -> list[Path]:
    """This process's memory cgroup's files holding ``oom_kill``: v2 ``memory.events``, v1 ``memory.oom_control``."""
    out: list[Path] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":                                   # cgroup v2 (unified)
            out += [root / rel / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):                # cgroup v1
            out += [root / "memory" / rel / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return out


def read_oom_kills(sources: list[Path] | None = None) -> OomKills:
    """Snapshot of every readable ``oom_kill`` counter (``sources``: the files to read; default /proc/vmstat and
    this process's memory cgroup)."""
    paths = sources if sources is not None else [PROC_VMSTAT, *_memory_cgroup_files()]
    counts = []
    for p in paths:
        n = _field(p, "oom_kill")
        if n is not None and str(p) not in dict(counts):
            counts.append((str(p), n))
    return OomKills(tuple(counts))


def death_record(case: Case, exitcode: int | None, before: OomKills, after: OomKills) -> CaseRecord:
    """The record of ``case`` whose worker died with ``exitcode`` (negative: killed by that signal)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        moved = after.moved_since(before)
        if moved is not None:
            return case.record("oom", f"worker was killed ({name}) by the kernel's out-of-memory killer ({moved})")
        evidence = ("no out-of-memory kill was recorded (" + ", ".join(s for s, _ in after.counts) + " unchanged)"
                    if after.counts else "no out-of-memory counter is readable here")
        return case.record("crashed", f"worker was killed by {name} (signal {-exitcode}) during the case; "
                                      + evidence)
    how = "with no exit code" if exitcode is None else f"with exit code {exitcode}"
    return case.record("crashed", f"worker process exited {how} during the case")
