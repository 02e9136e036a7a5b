"""`bench run --devices a,b,...`: one process worker per device, cases spread over them, each pinned to its device.

No machine here has several GPUs: the spreading is tested with ``--devices cpu,cpu`` (two workers splitting this
machine's cores); pinning a case to ``cuda:N`` is tested on the case and its record (the key and the stored
workload must not change, so ``--resume`` finds a case whichever worker measured it).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.contract.errors import BenchInputError
from harness.executors import make_executor
from harness.executors.devices import DevicesExecutor, check_devices, parse_devices, pin, split_cores, unpin
from harness.contract.spec import Case, Workload
from harness.store.db import Store

PLUGIN = str(Path(__file__).with_name("plugin_faulty.py"))
ROOT = Path(__file__).resolve().parent.parent


def _case(device: str = "cuda", line: str = "l") -> Case:
    return Case("s", line, "decoder-tiny", (("n_kv_heads", 1),), Workload(seq_len=16, device=device), ("latency",))


@pytest.mark.parametrize("text, expected", [("cuda:0,cuda:1", ("cuda:0", "cuda:1")), ("cpu, cpu", ("cpu", "cpu")),
                                            ("cuda", ("cuda",)), ("cpu,cuda:3", ("cpu", "cuda:3"))])
def test_parse_devices(text, expected):
    assert parse_devices(text) == expected


@pytest.mark.parametrize("text", ["", "cuda:0,", "gpu:0", "cuda:x", "cpu:1", "cuda:1,cuda:1", "cuda,cuda:0"])
def test_bad_device_lists_are_refused(text):
    with pytest.raises(BenchInputError, match="--devices"):
        parse_devices(text)


def test_an_unknown_device_is_one_line_and_exit_2(cli, tmp_path):
    res = cli("run", "attention_scaling", "--quick", "--devices", "cuda:0,tpu:1")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == ["bench: error: --devices: unknown device 'tpu:1'; expected cpu, cuda "
                                               "or cuda:N"]
    res = cli("run", "attention_scaling", "--quick", "--devices", "cuda:0", "--device", "cpu")
    assert res.exit_code == 2 and "no device in cuda:0 for the cases on cpu" in res.stderr
    res = cli("run", "attention_scaling", "--quick", "--devices", "cpu,cpu", "--executor", "inline")
    assert res.exit_code == 2 and "not with --executor inline" in res.stderr


def test_a_case_pinned_to_a_device_keeps_its_key_and_workload():
    case = _case("cuda")
    pinned = pin(case, "cuda:1")
    assert pinned.workload.device == "cuda:1" and pinned.key != case.key
    assert pin(_case("cpu"), "cpu") == _case("cpu")
    rec = pinned.record("ok", metrics={"median_ms": 1.0}, group=f"{pinned.key}+2")
    back = unpin(rec, case, pinned.key)
    assert back.case_key == case.key and back.workload["device"] == "cuda"
    assert back.group == f"{case.key}+2"
    assert back.metrics == {"median_ms": 1.0, "device_index": 1.0}
    check_devices([case], ("cuda:0", "cuda:1"))
    with pytest.raises(BenchInputError, match="cases on cpu"):
        check_devices([case, _case("cpu")], ("cuda:0", "cuda:1"))


def test_cpu_workers_split_the_cores():
    assert split_cores([0, 1, 2, 3], 2) == [(0, 2), (1, 3)]
    assert split_cores([5], 2) == [(5,), (5,)]
    ex = make_executor("devices=cpu,cpu,cuda:0")
    assert isinstance(ex, DevicesExecutor)
    cores = sorted(os.sched_getaffinity(0))
    assert [s.cores for s in ex.slots] == [*split_cores(cores, 2), ()]
    ex.close()


def test_cpu_cpu_spreads_the_cases_over_two_workers(tmp_path):
    """Six cases (one kills its worker, as the OOM killer would) through `bench run --devices cpu,cpu` (in a
    subprocess: the faulty plug-in stays out of this one): every case is stored once under the key a plain run
    gives it (its --dry-run), built in one of two worker processes (both used), each worker on its share of the
    cores; the killed case is `crashed` and the sweep completes."""
    lines = {f"w{i}": "ok" for i in range(5)} | {"killed": "sigkill"}
    body = "\n".join(f'{line} = {{ behavior = "{b}", pid_file = "{line}.pid" }}' for line, b in lines.items())
    suite = tmp_path / "spread.toml"
    suite.write_text(f'name = "spread"\nmetrics = ["latency"]\nfixed = {{ arch = "faulty" }}\n'
                     f"sweep = {{ batch_size = [2] }}\n[lines]\n{body}\n")
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    common = ["run", str(suite), "--quick", "--plugin", PLUGIN]
    runs = (common + ["--dry-run"],
            common + ["--devices", "cpu,cpu", "--store", url, "--no-calibrate", "--no-report", "--timeout", "60"])
    code = ("from cli import main\n"
            f"for args in {runs!r}:\n"
            "    try:\n        main(args)\n"
            "    except SystemExit as e:\n        print('EXIT', e.code, flush=True)\n"
            "    else:\n        print('EXIT', 0, flush=True)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    dry, _, rest = res.stdout.partition("EXIT 0\n")
    assert rest.rstrip().endswith("EXIT 1"), res.stdout + res.stderr     # a crashed case makes the run exit 1
    store = Store(url, create=False)
    recs = {r.line: r for r in store.records(store.get_run("latest").id)}
    assert set(recs) == set(lines)
    assert {r.case_key for r in recs.values()} == {line.split()[0] for line in dry.splitlines()[:-1]}
    assert recs["killed"].status == "crashed" and "SIGKILL" in recs["killed"].message
    ok = [line for line in lines if line != "killed"]
    assert all(recs[line].ok and recs[line].workload["device"] == "cpu" for line in ok)
    pids = {int((tmp_path / f"{line}.pid").read_text().split()[0]) for line in ok}
    assert len(pids) == 2, pids       # both workers measured (the killer is dealt last: no replacement measures)
    share = len(split_cores(sorted(os.sched_getaffinity(0)), 2)[0])
    assert {recs[line].metrics["threads"] for line in ok} == {float(share)}


def test_records_of_pinned_cases_come_back_under_their_own_keys(tmp_path):
    """The executor itself on a pinned-to-CPU run with interleaving: groups stay whole on one worker."""
    from harness.engine.runner import RunOptions
    from harness.instruments.timing import TimingConfig
    cases = [dataclasses.replace(_case("cpu", f"L{i}"), point=0) for i in range(2)]
    ex = DevicesExecutor(["cpu", "cpu"])
    try:
        recs = list(ex.run(cases, RunOptions(timing=TimingConfig(warmup_calls=1, warmup_s=0.0, min_samples=3,
                                                                 min_time_s=0.0, max_time_s=0.2),
                                             interleave=True, timeout_s=120)))
    finally:
        ex.close()
    assert sorted(r.case_key for r in recs) == sorted(c.key for c in cases)
    assert all(r.ok for r in recs) and recs[0].group == recs[1].group != ""
    assert len({ex.placed[c.key] for c in cases}) == 1            # one group, one worker
