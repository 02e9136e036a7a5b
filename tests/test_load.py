"""harness.instruments.load: CPU load from outside our process tree. The live tests compare two monitors over the same
interval (one whose tree holds the busy process, one whose does not) or use wide margins, so that other
work on a loaded machine cannot make them flake; none asserts an absolute time."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from harness.instruments.load import BUSY_CORES, ROOT_PID_ENV, Load, LoadMonitor, combine, own_root_pid

BUSY_LOOP = "while True: pass"


def _spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


def _sleeper() -> subprocess.Popen:
    return _spawn("import time; time.sleep(30)")


def _kill(*procs: subprocess.Popen | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
    for p in procs:
        if p is not None:
            p.wait(timeout=10)


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _wait_cpu(pid: int, at_least_s: float, timeout_s: float = 10.0) -> None:
    """Wait until process ``pid`` has used ``at_least_s`` CPU seconds (it is past start-up and running)."""
    deadline = time.monotonic() + timeout_s
    while _cpu_s(pid) < at_least_s:
        assert time.monotonic() < deadline, "the child never got the CPU"
        time.sleep(0.01)


def test_competing_process_outside_the_tree_is_seen():
    sleeper = busy = None
    try:
        sleeper = _sleeper()
        busy = _spawn(BUSY_LOOP)
        _wait_cpu(busy.pid, 0.1)
        busy0 = _cpu_s(busy.pid)
        with LoadMonitor(root_pid=sleeper.pid) as mon:  # the busy loop is not in the sleeper's tree
            time.sleep(1.0)
        busy_cpu_s = _cpu_s(busy.pid) - busy0
        load = mon.result
    finally:
        _kill(busy, sleeper)
    print(f"others_cores={load.others_cores:.3f} steal={load.steal_cores} busy={busy_cpu_s:.3f} CPU-s")
    assert load.wall_s > 0
    # counted, not timed: the CPU-seconds seen as others' hold the busy loop's own (what the kernel charged it)
    assert busy_cpu_s > 0.1 and load.others_cores * load.wall_s >= 0.85 * busy_cpu_s
    assert load.busy
    assert "machine busy" in load.reason()


def test_busy_child_inside_our_tree_is_not_counted():
    sleeper = busy = None
    try:
        sleeper = _sleeper()
        busy = _spawn(BUSY_LOOP)  # our child
        _wait_cpu(busy.pid, 0.1)
        ours, theirs = LoadMonitor(root_pid=os.getpid()), LoadMonitor(root_pid=sleeper.pid)
        child0 = _cpu_s(busy.pid)
        ours.start(), theirs.start()
        time.sleep(0.8)
        b, a = theirs.stop(), ours.stop()
        child_cores = (_cpu_s(busy.pid) - child0) / a.wall_s
    finally:
        _kill(busy, sleeper)
    print(f"ours={a.others_cores:.3f} theirs={b.others_cores:.3f} child={child_cores:.3f}")
    # Same interval, same system-wide time: the two differ by exactly the busy child's CPU.
    assert child_cores > 0.3
    assert b.others_cores - a.others_cores == pytest.approx(child_cores, abs=0.15)
    if child_cores > 0.8:  # the child had (nearly) a core to itself
        assert a.others_cores <= b.others_cores - 0.5


def test_short_lived_child_reaped_within_the_interval_is_ours():
    sleeper = None
    try:
        sleeper = _sleeper()
        ours, theirs = LoadMonitor(root_pid=os.getpid()), LoadMonitor(root_pid=sleeper.pid)
        ours.start(), theirs.start()
        # Born, busy for 0.5 CPU-seconds, and reaped (by us) inside the interval: never seen by a snapshot.
        subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"], check=True)
        b, a = theirs.stop(), ours.stop()
    finally:
        _kill(sleeper)
    print(f"ours={a.others_cores:.3f} theirs={b.others_cores:.3f} wall={a.wall_s:.3f}")
    # The child used >= 0.5 CPU-s over the interval: seen by the outside monitor, not by ours.
    assert (b.others_cores - a.others_cores) * a.wall_s > 0.4


def test_child_exiting_within_the_interval_counts_only_its_time_inside_it():
    sleeper = child = None
    try:
        sleeper = _sleeper()
        # Burns ~0.5 CPU-s before the interval, then idles until killed (and reaped) inside it.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass\nprint('ready', flush=True)\n"
             "time.sleep(30)"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert _cpu_s(child.pid) > 0.4
        ours, theirs = LoadMonitor(root_pid=os.getpid()), LoadMonitor(root_pid=sleeper.pid)
        ours.start(), theirs.start()
        time.sleep(0.1)
        child.kill()
        child.wait(timeout=10)
        time.sleep(0.1)
        b, a = theirs.stop(), ours.stop()
    finally:
        _kill(child, sleeper)
    print(f"ours={a.others_cores:.3f} theirs={b.others_cores:.3f} wall={a.wall_s:.3f}")
    # The child's 0.5 CPU-s from before the interval (in our children_* once reaped) is not counted as
    # ours in the interval: were it, ours would be ~2.5 cores below theirs (floored at 0).
    assert abs((b.others_cores - a.others_cores) * a.wall_s) < 0.1


def test_load_metrics_reason_and_busy():
    idle = Load(others_cores=0.2, steal_cores=None, wall_s=1.0)
    assert not idle.busy
    assert idle.reason() == ""
    assert idle.metrics() == {"load_others_cores": 0.2, "load_busy": 0.0, "load_yielding_cores": 0.0}

    busy = Load(others_cores=0.93, steal_cores=0.01, wall_s=2.0)
    assert busy.busy
    assert busy.reason() == "machine busy: other processes used 0.93 cores (limit 0.5)"
    assert busy.metrics() == {"load_others_cores": 0.93, "load_busy": 1.0, "load_yielding_cores": 0.0,
                              "load_steal_cores": 0.01}

    assert not Load(BUSY_CORES, 0.0, 1.0).busy  # "more than" the limit
    assert Load(BUSY_CORES + 1e-9, 0.0, 1.0).busy
    with pytest.raises(Exception):
        busy.others_cores = 0.0  # frozen


def test_combine_weights_by_wall_time():
    assert combine([]) is None
    c = combine([Load(1.0, 0.1, 1.0), Load(0.0, 0.4, 3.0)])
    assert c is not None
    assert c.wall_s == pytest.approx(4.0)
    assert c.others_cores == pytest.approx(0.25)
    assert c.steal_cores == pytest.approx((0.1 + 1.2) / 4)
    assert not c.busy
    c = combine(iter([Load(1.0, 0.1, 1.0), Load(0.8, None, 1.0)]))
    assert c is not None and c.steal_cores is None and c.others_cores == pytest.approx(0.9) and c.busy
    one = Load(0.7, None, 0.5)
    assert combine([one]) == one
    assert combine([Load(1.0, 0.0, 0.0), Load(0.0, 0.0, 0.0)]) == Load(0.5, 0.0, 0.0)


def test_monitor_reports_steal_where_the_os_does_and_stop_needs_start():
    mon = LoadMonitor()
    with pytest.raises(RuntimeError):
        mon.stop()
    mon.start()
    time.sleep(0.05)
    load = mon.stop()
    assert mon.result == load
    assert load.wall_s > 0 and load.others_cores >= 0
    if hasattr(psutil.cpu_times(), "steal"):
        assert isinstance(load.steal_cores, float) and load.steal_cores >= 0
        assert "load_steal_cores" in load.metrics()
    else:
        assert load.steal_cores is None


def test_own_root_pid(monkeypatch):
    me = os.getpid()
    monkeypatch.delenv(ROOT_PID_ENV, raising=False)
    assert own_root_pid() == me

    monkeypatch.setenv(ROOT_PID_ENV, str(os.getppid()))  # a live ancestor: honoured
    assert own_root_pid() == os.getppid()
    monkeypatch.setenv(ROOT_PID_ENV, str(me))
    assert own_root_pid() == me

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    monkeypatch.setenv(ROOT_PID_ENV, str(dead.pid))  # gone: fall back
    assert own_root_pid() == me

    for junk in ("", "abc", "-5", "0"):
        monkeypatch.setenv(ROOT_PID_ENV, junk)
        assert own_root_pid() == me

    sleeper = None
    try:
        sleeper = _sleeper()
        monkeypatch.setenv(ROOT_PID_ENV, str(sleeper.pid))  # alive but not an ancestor: ignored
        assert own_root_pid() == me
    finally:
        _kill(sleeper)


def test_default_root_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(ROOT_PID_ENV, str(os.getppid()))
    mon = LoadMonitor()
    mon.start()
    assert mon._start is not None and mon._start[5] == os.getppid()
    mon.stop()


def test_niced_process_yields_and_is_reported_not_counted():
    """A busy loop at nice 19 is load that yields to a nice-0 case: reported as yielding, not as others (when
    this test itself runs niced, nothing yields to it and the loop counts as others)."""
    sleeper = busy = None
    try:
        sleeper = _sleeper()
        busy = _spawn("import os\nos.nice(19)\nwhile True: pass")
        _wait_cpu(busy.pid, 0.1)
        busy0 = _cpu_s(busy.pid)
        with LoadMonitor(root_pid=sleeper.pid) as mon:
            time.sleep(1.0)
        busy_cpu_s = _cpu_s(busy.pid) - busy0
        load = mon.result
    finally:
        _kill(busy, sleeper)
    assert busy_cpu_s > 0.1
    if os.getpriority(os.PRIO_PROCESS, 0) <= 0:
        assert load.yielding_cores * load.wall_s >= 0.85 * busy_cpu_s
        assert load.metrics()["load_yielding_cores"] == load.yielding_cores
    else:
        assert load.yielding_cores == 0.0 and load.others_cores * load.wall_s >= 0.85 * busy_cpu_s


def test_niced_time_is_subtracted_only_when_we_run_first(monkeypatch):
    """Counted from the kernel's fields: 3 busy CPU-s of which 2 niced over 1 s, our tree idle."""
    from harness.instruments import load as L

    times = iter([(10.0, 4.0, None), (13.0, 6.0, None)] * 2)
    monkeypatch.setattr(L, "_busy_and_steal", lambda: next(times))
    monkeypatch.setattr(L, "_tree_cpu", lambda a, b: 0.0)
    clock = iter([100.0, 101.0, 200.0, 201.0])
    monkeypatch.setattr(L.time, "perf_counter", lambda: next(clock))
    for first, others, yielding in ((True, 1.0, 2.0), (False, 3.0, 0.0)):
        monkeypatch.setattr(L, "_own_priority_first", lambda f=first: f)
        mon = LoadMonitor(root_pid=os.getpid())
        mon.start()
        load = mon.stop()
        assert (load.others_cores, load.yielding_cores) == (others, yielding)
    assert combine([Load(1.0, None, 1.0, 2.0), Load(0.0, None, 3.0, 0.0)]).yielding_cores == 0.5
