"""`bench run --executor ray`: the same cases and deterministic metrics as locally; crashes and kills recorded.

One local Ray cluster for the module (1 CPU, and a *fake* GPU resource: Ray schedules a CUDA case onto it, and
on this CPU machine the case must end skipped, never hang). The executor joins the cluster the test started
and leaves it running; the module shuts it down. The misbehaving architecture (tests/plugin_faulty.py) is
loaded only in the measuring processes. Without ray installed these tests are skipped, unless
BENCH_REQUIRE_RAY=1 (as .ci/run sets), where they fail.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.executors.ray_executor import NO_CUDA, RAY_MISSING, Cluster, TaskResources, plan, ray_available
from harness.contract.metrics import FAKE_PASS
from harness.contract.records import CaseRecord
from harness.engine.runner import RunOptions
from harness.contract.spec import Case, Workload
from harness.store.db import Store
from harness.instruments.timing import TimingConfig
from tests.helpers import invoke

PLUGIN = str(Path(__file__).with_name("plugin_faulty.py"))
FAST = TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3, min_time_s=0.0, max_time_s=0.3)
ROOT = Path(__file__).resolve().parent.parent
TWO_POINTS = """
name = "tiny"
metrics = ["latency", "memory", "flops"]
fixed = { arch = "decoder-tiny", batch_size = 1 }
sweep = { seq_len = [16, 32] }
[lines]
MHA = { n_kv_heads = 4 }
MQA = { n_kv_heads = 1 }
"""
DETERMINISTIC = FAKE_PASS


def _need_ray() -> None:
    if ray_available():
        return
    if os.environ.get("BENCH_REQUIRE_RAY") == "1":
        pytest.fail(f"BENCH_REQUIRE_RAY=1 but {RAY_MISSING}", pytrace=False)
    pytest.skip(RAY_MISSING)


@pytest.fixture(scope="module")
def cluster():
    _need_ray()
    import ray
    ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, object_store_memory=80 * 2**20,
             logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def _faulty(line: str, behavior: str = "ok", device: str = "cpu", **over) -> Case:
    return Case("faults", line, "faulty", tuple(sorted({"behavior": behavior, **over}.items())),
                Workload(batch_size=2, device=device), ("latency",))


def _run(cases: list[Case], **opts) -> dict[str, CaseRecord]:
    from harness.executors.ray_executor import RayExecutor
    ex = RayExecutor()
    try:
        recs = list(ex.run(cases, RunOptions(timing=FAST, plugins=(PLUGIN,), **opts)))
    finally:
        ex.close()
    assert len(recs) == len({r.case_key for r in recs}) == len(cases), "a case recorded twice or lost"
    return {r.line: r for r in recs}


# -- through the CLI: the same suite locally and on Ray ------------------------------------------------------

def test_the_same_suite_through_ray_and_inline_gives_the_same_cases(cluster, tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TWO_POINTS)
    runs = {}
    for executor in ("inline", "ray"):
        url = f"sqlite:///{tmp_path / executor}.sqlite"
        res = invoke("run", str(suite), "--quick", "--executor", executor, "--store", url, "--no-calibrate",
                     "--no-report")
        assert res.exit_code == 0, res.stderr
        store = Store(url, create=False)
        runs[executor] = {r.case_key: r for r in store.records(store.get_run("latest").id)}
    local, remote = runs["inline"], runs["ray"]
    assert len(local) == 4 and set(remote) == set(local)
    for key, a in local.items():
        b = remote[key]
        assert (b.line, b.arch, b.status, dict(b.workload), dict(b.config)) == \
               (a.line, a.arch, a.status, dict(a.workload), dict(a.config))
        assert {m: b.metrics.get(m) for m in DETERMINISTIC} == {m: a.metrics.get(m) for m in DETERMINISTIC}
        assert a.metrics["macs"] > 0 and b.metrics["median_ms"] > 0
    # measured in Ray's workers' measuring processes, with the cores this process has (threads = 0)
    assert {r.metrics["threads"] for r in remote.values()} == {r.metrics["threads"] for r in local.values()}


# -- failures --------------------------------------------------------------------------------------------------

def test_crashes_are_recorded_as_locally_and_a_cuda_case_on_a_fake_gpu_is_skipped(cluster, tmp_path):
    """A case that kills its measuring process (SIGKILL, no OOM kill recorded) is ``crashed`` exactly as with ``process``
    (the Ray task measures through the same ProcessExecutor; its other deaths are tested in test_executor.py)."""
    recs = _run([_faulty("killed", "sigkill"), _faulty("after", "ok"), _faulty("gpu", device="cuda")], timeout_s=60)
    assert recs["killed"].status == "crashed" and "SIGKILL" in recs["killed"].message
    assert recs["after"].status == "ok" and recs["after"].metrics["median_ms"] > 0
    assert recs["gpu"].status == "skipped" and recs["gpu"].message == NO_CUDA


def test_a_ray_worker_killed_mid_case_is_recorded_and_the_sweep_completes(cluster, tmp_path):
    """The Ray worker running a (hanging) case is SIGKILLed from outside; its case is an error naming the dead
    worker, its measuring process goes with it, and the sweep's other case is measured."""
    pid_file = tmp_path / "built.pid"
    killed: list[int] = []

    def kill_the_ray_worker() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not pid_file.exists():
            time.sleep(0.2)
        if pid_file.exists():
            measuring = psutil.Process(int(pid_file.read_text().split()[0]))
            killed.extend([measuring.ppid(), measuring.pid])
            os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_ray_worker, daemon=True)
    killer.start()
    recs = _run([_faulty("hangs", "hang", pid_file=str(pid_file)), _faulty("next", "ok")], timeout_s=120)
    killer.join(5)
    assert killed, "the hanging case never started"
    rec = recs["hangs"]
    assert rec.status == "error" and "Ray worker died" in rec.message
    ray_worker, measuring = killed
    for pid in (ray_worker, measuring):
        try:
            psutil.Process(pid).wait(30)
        except psutil.NoSuchProcess:
            pass
    assert not psutil.pid_exists(measuring), "the measuring process outlived its Ray worker"
    assert recs["next"].status == "ok" and recs["next"].metrics["median_ms"] > 0


# -- planning and the CLI, without a cluster ------------------------------------------------------------------

def test_a_cuda_case_without_a_gpu_in_the_cluster_is_skipped_with_the_local_reason():
    no_gpu = Cluster(max_cpus=8, max_memory=2**34, gpus=0)
    assert plan([_faulty("g", device="cuda")], no_gpu) == NO_CUDA
    assert plan([_faulty("g", device="cuda:1")], Cluster(8, 2**34, 2)) == TaskResources(num_cpus=1, num_gpus=1)


def test_cpu_resources_follow_the_workload_threads_capped_at_the_largest_node():
    whole = Case("s", "l", "decoder-tiny", (), Workload(seq_len=16), ("latency",))
    four = Case("s", "l", "decoder-tiny", (), Workload(seq_len=16, threads=4), ("latency",))
    big = Cluster(max_cpus=16, max_memory=2**34, gpus=0)
    assert plan([whole], big).num_cpus == 16            # threads = 0: every core, as locally: a node to itself
    assert plan([four], big).num_cpus == 4
    assert plan([four], Cluster(max_cpus=2, max_memory=2**34, gpus=0)).num_cpus == 2
    mem = plan([whole], big).memory
    assert mem is not None and 0 < mem < 2**34          # the fake pass's estimate, made here
    assert plan([whole], Cluster(16, 1000.0, 0)).memory == 1000   # capped: the case's own guard then skips it


def test_without_ray_the_cli_says_so_in_one_line_and_exits_2(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)       # `import ray` fails, as when it is not installed
    suite = tmp_path / "tiny.toml"
    suite.write_text(TWO_POINTS)
    res = invoke("run", str(suite), "--quick", "--executor", "ray", "--store", f"sqlite:///{tmp_path / 'r.sqlite'}")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [f"bench: error: {RAY_MISSING}"]
    res = invoke("run", str(suite), "--address", "10.0.0.1:6379")
    assert res.exit_code == 2 and "--address: only with --executor ray" in res.stderr


def test_the_default_path_never_imports_ray():
    code = ("import sys, cli, harness.session; from harness.executors import make_executor; "
            "make_executor('process').close(); make_executor('devices=cpu').close(); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
