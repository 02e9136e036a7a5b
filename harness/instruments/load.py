"""Machine load instrument: how much CPU work that is not ours ran while a benchmark case ran.

Over an interval (``start`` -> ``stop``) :class:`LoadMonitor` measures, in cores (CPU-seconds per wall
second):

* ``others_cores``: the CPU used by processes outside bench's own process tree. It is computed by
  difference, so short-lived processes are not missed: the system-wide busy CPU time (``psutil.cpu_times()``)
  minus the CPU time of our own tree, over the wall time, clamped at 0. Our tree is a root process and all
  its descendants; the default root is :func:`own_root_pid` (the bench CLI sets ``BENCH_ROOT_PID`` in its
  main process, so a worker's measurement excludes the main process and its sibling workers).
* ``steal_cores``: the CPU time the hypervisor gave to other guests (Linux ``steal``), ``None`` where the
  OS does not report it.
* ``yielding_cores``: the CPU used by processes at a lower priority than ours (``nice`` > 0, the kernel's
  ``nice`` time) while our process runs at nice 0 or below. The scheduler gives our case the core first (a
  nice 19 process weighs 15 against nice 0's 1,024), so that time is reported but not counted in
  ``others_cores``. A process at nice 1–9 yields much less; the kernel's counters cannot tell the levels apart,
  so background work meant to stay out of a measurement belongs at nice 19 (``nice -n 19 …``). When our own
  process is niced, every other process's time counts as ``others_cores``.

System-wide times come from ``/proc/stat`` on Linux, which in a container usually covers the whole host:
work in other containers counts as "others", which is what we want to know. The resolution is the
kernel's clock tick (10 ms), so short intervals are coarse. Cost: one pass over the process tree at start
and one at stop (a few ms); no background thread.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["BUSY_CORES", "Load", "LoadMonitor", "combine", "own_root_pid"]

BUSY_CORES: float = 0.5
"""The machine counts as busy when other processes used more than half a core over the interval."""

ROOT_PID_ENV = "BENCH_ROOT_PID"
"""Environment variable naming the root of bench's process tree (set by the CLI's main process)."""

# Fields of psutil.cpu_times() that are not busy CPU time. On Linux "guest"/"guest_nice" are already
# included in "user"/"nice" (the kernel accounts them twice), so they are left out of the sum as well;
# "steal" is time the CPU ran someone else's guest: reported separately, not as busy.
_NOT_BUSY = ("idle", "iowait", "steal", "guest", "guest_nice")


def _busy_and_steal() -> tuple[float, float, float | None]:
    """System-wide busy CPU seconds (all CPUs), the part of them spent by niced processes (``nice``; 0 where not
    reported), and steal seconds (None where not reported), since boot."""
    t = psutil.cpu_times()
    fields = t._asdict()
    busy = sum(v for k, v in fields.items() if k not in _NOT_BUSY)
    return busy, float(fields.get("nice", 0.0)), fields.get("steal")


def _own_priority_first() -> bool:
    """Whether this process runs at nice 0 or below, so that niced processes yield the CPU to it."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) <= 0
    except (AttributeError, OSError):     # no priorities on this OS: count everything as others
        return False


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def own_root_pid() -> int:
    """The root of bench's process tree: ``$BENCH_ROOT_PID`` when it names a live process that is this
    process or one of its ancestors, else this process's pid.

    (A pid that is not an ancestor, e.g. a stale value inherited by an unrelated run or a reused pid,
    would make our own work count as "others", so it is ignored.)
    """
    me = os.getpid()
    raw = os.environ.get(ROOT_PID_ENV, "").strip()
    try:
        pid = int(raw)
    except ValueError:
        return me
    if pid <= 0:
        return me
    if pid == me:
        return me
    try:
        proc = psutil.Process(pid)
        if not _is_alive(proc):
            return me
        if any(p.pid == pid for p in psutil.Process(me).parents()):
            return pid
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return me


@dataclass(frozen=True)
class Load:
    """CPU load from outside our process tree over one interval, in cores."""

    others_cores: float
    steal_cores: float | None
    wall_s: float
    yielding_cores: float = 0.0

    @property
    def busy(self) -> bool:
        """Whether other processes used more than ``BUSY_CORES`` cores."""
        return self.others_cores > BUSY_CORES

    def metrics(self) -> dict[str, float]:
        """The load as metrics: ``load_others_cores``, ``load_busy`` (1.0/0.0), ``load_yielding_cores``, and
        ``load_steal_cores`` when steal is reported."""
        out = {"load_others_cores": float(self.others_cores), "load_busy": 1.0 if self.busy else 0.0,
               "load_yielding_cores": float(self.yielding_cores)}
        if self.steal_cores is not None:
            out["load_steal_cores"] = float(self.steal_cores)
        return out

    def reason(self) -> str:
        """Why the measurement may be disturbed, for a report; "" when the machine was not busy."""
        if not self.busy:
            return ""
        return f"machine busy: other processes used {self.others_cores:.2f} cores (limit {BUSY_CORES:g})"


# A process's identity is (pid, create_time), so a reused pid is not mistaken for the old process.
_Key = tuple[int, float]


@dataclass(frozen=True)
class _Proc:
    total: float  # user + system + children_user + children_system, seconds
    ppid: int


def _read(proc: psutil.Process) -> tuple[_Key, _Proc] | None:
    try:
        with proc.oneshot():
            t = proc.cpu_times()
            key = (proc.pid, proc.create_time())
            ppid = proc.ppid()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    total = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return key, _Proc(total, ppid)


def _snapshot(root: int, extra: Iterable[_Key] = ()) -> dict[_Key, _Proc]:
    """CPU times of ``root`` and its descendants, and of the processes ``extra`` still running (ours at
    start, though they may have been re-parented out of the tree since)."""
    procs: list[psutil.Process] = []
    try:
        r = psutil.Process(root)
        procs.append(r)
        procs.extend(r.children(recursive=True))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        pass
    seen = {p.pid for p in procs}
    for pid, _ in extra:
        if pid not in seen:
            try:
                procs.append(psutil.Process(pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    out: dict[_Key, _Proc] = {}
    for p in procs:
        read = _read(p)
        if read is not None:
            out[read[0]] = read[1]
    return out


def _tree_cpu(start: dict[_Key, _Proc], stop: dict[_Key, _Proc]) -> float:
    """CPU seconds our tree used between the two snapshots.

    Each process's total includes the times of its children that it reaped (``children_*``), so a
    descendant that lived and died inside the interval is counted through its parent. A process seen at
    start but gone at stop has its final total counted by the ancestor that reaped it; its part from before
    the interval (its total at start) is then taken off, if its chain of parents at start leads to a process
    still in the tree at stop. A process only seen at stop is taken to have started within the interval and
    counts in full (an approximation: one that existed before but was missed at start is over-counted).
    Time lost with processes re-parented out of the tree and reaped elsewhere counts as "others".
    """
    used = 0.0
    for key, proc in stop.items():
        before = start.get(key)
        used += max(0.0, proc.total - (before.total if before is not None else 0.0))
    start_by_pid = {pid: (pid, ct) for pid, ct in start}
    stop_pids = {pid for pid, _ in stop}
    for key, proc in start.items():
        if key in stop:
            continue
        ppid, hops = proc.ppid, 0
        while hops < 64:  # walk up through parents that vanished too
            if ppid in stop_pids:
                used -= proc.total
                break
            parent_key = start_by_pid.get(ppid)
            if parent_key is None or parent_key in stop:
                break
            ppid, hops = start[parent_key].ppid, hops + 1
    return max(0.0, used)


class LoadMonitor:
    """Measures the CPU load from outside our process tree between ``start()`` and ``stop()``.

    As a context manager it starts on entry and sets ``self.result`` (a :class:`Load`) on exit.
    """

    def __init__(self, root_pid: int | None = None) -> None:
        """``root_pid``: the root of the tree counted as ours; default :func:`own_root_pid`."""
        self.root_pid = root_pid
        self.result: Load | None = None
        self._start: tuple[float, float, float, float | None, dict[_Key, _Proc], int, bool] | None = None

    def start(self) -> None:
        """Begin an interval (again, if one was running)."""
        root = own_root_pid() if self.root_pid is None else self.root_pid
        if not psutil.pid_exists(root):  # a dead root: at least don't count this process as "others"
            root = os.getpid()
        wall = time.perf_counter()
        busy, nice, steal = _busy_and_steal()
        tree = _snapshot(root)
        self._start = (wall, busy, nice, steal, tree, root, _own_priority_first())

    def stop(self) -> Load:
        """End the interval and return its :class:`Load` (also kept as ``self.result``)."""
        if self._start is None:
            raise RuntimeError("LoadMonitor.stop() called before start()")
        wall0, busy0, nice0, steal0, tree0, root, first = self._start
        self._start = None
        tree1 = _snapshot(root, extra=tree0.keys())
        busy1, nice1, steal1 = _busy_and_steal()
        wall = time.perf_counter() - wall0
        if wall <= 0:
            load = Load(0.0, None if steal0 is None or steal1 is None else 0.0, 0.0)
        else:
            yielding = max(0.0, nice1 - nice0) if first else 0.0     # niced time yields to a nice-0 case
            others = max(0.0, (busy1 - busy0) - yielding - _tree_cpu(tree0, tree1)) / wall
            steal = None if steal0 is None or steal1 is None else max(0.0, steal1 - steal0) / wall
            load = Load(others, steal, wall, yielding / wall)
        self.result = load
        return load

    def __enter__(self) -> LoadMonitor:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def combine(loads: Iterable[Load]) -> Load | None:
    """The wall-time weighted average of several intervals' loads (``None`` for none); steal is ``None``
    if any interval lacks it."""
    loads = list(loads)
    if not loads:
        return None
    wall = sum(x.wall_s for x in loads)
    if wall > 0:
        others = sum(x.others_cores * x.wall_s for x in loads) / wall
        yielding = sum(x.yielding_cores * x.wall_s for x in loads) / wall
    else:
        others = sum(x.others_cores for x in loads) / len(loads)
        yielding = sum(x.yielding_cores for x in loads) / len(loads)
    steal: float | None = None
    if all(x.steal_cores is not None for x in loads):
        steals = [x.steal_cores for x in loads]  # type: ignore[misc]
        if wall > 0:
            steal = sum(s * x.wall_s for s, x in zip(steals, loads)) / wall  # type: ignore[operator]
        else:
            steal = sum(steals) / len(loads)  # type: ignore[arg-type]
    return Load(others, steal, wall, yielding)
