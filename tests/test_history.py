"""`bench history` and `bench bisect` on a real git history (tests/history_repo.py): a scratch repository of 16
commits whose plug-in case waits 2 ms, 4 ms from commit 11; an A/A history of 10 commits; a MAC change at one commit;
bad input. Also the CPU identity in the fingerprint, the search by halves, and the github-action-benchmark export.

The tests that judge timings (the 16-commit history, the A/A history, the bisection of its step) are ``serial``
(tests/conftest.py's PARTLY_SERIAL_MODULES); the rest run in the parallel phase."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.contract.records import hard_differences
from harness.engine.bisect import Probe, bisect
from harness.engine.commits import Commit
from harness.engine.env import cpu_identity
from harness.store.db import Store
from tests.helpers import invoke
from tests.history_repo import PLUGIN_PATH, make_repo, run_at, suite_file, use_plugin

STEP_AT = 11
N_COMMITS = 16
PAUSE_MS = 8.0      # the plug-in's pause before the step (after it, twice): see ``stepped``


def _history(d: Path, versions: list[tuple[float, int]]) -> dict:
    """A repository of ``versions``, a run at each commit, and `bench history --json` of them."""
    repo = d / "repo"
    shas = make_repo(repo, versions)
    url = f"sqlite:///{d / 's.sqlite'}"
    store = Store(url)
    suite = suite_file(d)
    runs = [run_at(store, repo, sha, suite, d / "plugins") for sha in shas]
    res = invoke("history", str(suite), "--quick", "--repo", str(repo), "--store", url, "--json",
                 "--html", str(d / "history.html"))
    assert res.exit_code == 0, res.output
    return {"shas": shas, "runs": runs, "doc": json.loads(res.stdout), "url": url, "suite": suite, "repo": repo,
            "dir": d}


def _change_points(series: dict) -> list[dict]:
    """The series' confirmed change points: not a transient (a burst of load taken back), and not the latest point's
    unconfirmed flag (one run with no next one to confirm it, flagged as such: reports.history). Only the latest point
    may be unconfirmed."""
    last = series["points"][-1]["commit"]
    assert all(f["confirmed"] or f["commit"] == last for f in series["flags"]), series["flags"]
    return [f for f in series["flags"] if f["kind"] != "transient" and f["confirmed"]]


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> dict:
    """16 commits, 2× slower from commit 11, a run at each. The pause (a wall-clock busy-wait) is 8 ms so that it
    outweighs what the machine's speed moves: the MLP and the step's own overhead, ~0.1 ms a call, slowed by half in
    phases of this shared machine (a run at 2 ms pauses once read a confirmed ×1.070 step where no code changed)."""
    return _history(tmp_path_factory.mktemp("stepped"),
                    [(PAUSE_MS if i < STEP_AT else 2 * PAUSE_MS, 16) for i in range(1, N_COMMITS + 1)])


@pytest.mark.serial
def test_history_flags_the_step_and_nothing_else(stepped):
    (series,) = stepped["doc"]["series"]
    assert [p["commit"] for p in series["points"]] == stepped["shas"]            # git order
    if series["smallest_flaggable_step"] >= 1.0:
        pytest.skip(f"the runs moved by more than the 2× step (smallest flaggable step "
                    f"{100 * series['smallest_flaggable_step']:.0f}%): a machine this busy cannot show it")
    flags = _change_points(series)
    assert [(f["commit"], f["kind"]) for f in flags] == [(stepped["shas"][STEP_AT - 1], "slower")], series["flags"]
    assert flags[0]["ratio"] > 1.5 and flags[0]["ci_low"] > 1.0
    assert series["smallest_flaggable_step"] > 0
    assert series["latest_vs_best"]["worse_by"] > 0.5
    page = (stepped["dir"] / "history.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 1 and stepped["shas"][STEP_AT - 1][:8] in page


@pytest.mark.serial
def test_aa_history_flags_nothing(tmp_path):
    doc = _history(tmp_path, [(PAUSE_MS, 16)] * 10)["doc"]
    (series,) = doc["series"]
    assert len(series["points"]) == 10
    assert _change_points(series) == [], series["flags"]


@pytest.fixture(scope="module")
def mac_changed(tmp_path_factory) -> dict:
    """3 commits, the hidden width 16 → 64 at commit 3, a run at each (the MAC test, the MAC bisection and the
    export share it)."""
    return _history(tmp_path_factory.mktemp("macs"), [(0.5, 16), (0.5, 16), (0.5, 64)])


def test_mac_change_is_flagged_at_its_commit(mac_changed):
    h = mac_changed
    (series,) = h["doc"]["series"]
    metric = [f for f in series["flags"] if f["kind"] == "metric"]
    assert [f["commit"] for f in metric] == [h["shas"][2]] and "macs" in metric[0]["text"], series["flags"]


@pytest.mark.serial
def test_bisect_names_the_commit_of_the_2x_step(stepped):
    """The 2 commits after commit 10 of the stepped history, the step (commit 11) first: the bad ref (commit 12), then
    commit 11, 2 probes of 3 processes a version (each probe costs 6 worker processes and runs in the serial phase;
    the search by halves over longer ranges is tested on a made-up probe below)."""
    repo, shas = stepped["repo"], stepped["shas"]
    good, bad = shas[STEP_AT - 2], shas[STEP_AT]                # commits 10 (good) and 12
    use_plugin(repo / PLUGIN_PATH)
    res = invoke("bisect", str(stepped["suite"]), "--good", good, "--bad", bad, "--quick", "--repo",
                 str(repo), "--plugin", str(repo / PLUGIN_PATH), "--processes", "3",
                 "--store", f"sqlite:///{stepped['dir'] / 'bisect.sqlite'}")
    if res.exit_code == 3 and "machine busy" in res.stdout.strip().splitlines()[-1]:
        pytest.skip("bisect was inconclusive because the machine was busy (a busy machine decides nothing)")
    assert res.exit_code == 0, res.output
    steps = [ln for ln in res.stdout.splitlines() if ln.startswith("step ")]
    assert len(steps) == 2, res.stdout
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith(f"first bad commit: {shas[STEP_AT - 1]} 'commit {STEP_AT}:"), last


def test_bisect_names_the_commit_that_changed_macs(mac_changed, tmp_path):
    """A MAC change is exact: the bisection finds it whatever the machine's load (timing does not decide). The
    history's 3 commits: the bad ref is probed, then the one commit between (the search by halves itself is tested
    on a made-up probe below)."""
    repo, shas = mac_changed["repo"], mac_changed["shas"]
    use_plugin(repo / PLUGIN_PATH)
    res = invoke("bisect", str(mac_changed["suite"]), "--good", shas[0], "--bad", shas[-1], "--quick", "--repo",
                 str(repo), "--plugin", str(repo / PLUGIN_PATH), "--processes", "2",
                 "--store", f"sqlite:///{tmp_path / 's.sqlite'}")
    assert res.exit_code == 0, res.output
    assert len([ln for ln in res.stdout.splitlines() if ln.startswith("step ")]) == 2, res.stdout
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith(f"first bad commit: {shas[2]} 'commit 3:") and "macs" in last, last


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("small")
    shas = make_repo(d / "repo", [(0.5, 16)] * 3)
    return {"repo": d / "repo", "shas": shas, "suite": suite_file(d)}


@pytest.mark.parametrize("args, says", [
    (("--good", "nosuchref", "--bad", "HEAD"), "no commit 'nosuchref'"),
    (("--good", "HEAD", "--bad", "HEAD~2"), "is not an ancestor"),
    (("--good", "HEAD~2", "--bad", "HEAD", "--case", "nothing-matches"), "matches 'nothing-matches'"),
])
def test_bisect_bad_input_exits_2_in_one_line(small_repo, args, says):
    use_plugin(small_repo["repo"] / PLUGIN_PATH)
    res = invoke("bisect", str(small_repo["suite"]), *args, "--quick", "--repo", str(small_repo["repo"]),
                 "--plugin", str(small_repo["repo"] / PLUGIN_PATH))
    assert res.exit_code == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and says in res.stderr, res.stderr


def test_history_of_nothing_exits_2(small_repo, tmp_path):
    res = invoke("history", "no-such-suite", "--repo", str(small_repo["repo"]),
                 "--store", f"sqlite:///{tmp_path / 's.sqlite'}")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


# --- the search by halves, on a made-up probe -----------------------------------------------------------------

def _commits(n: int) -> list[Commit]:
    return [Commit(f"{i:040x}", f"commit {i}") for i in range(1, n + 1)]


@pytest.mark.parametrize("n, first_bad", [(15, 10), (15, 0), (15, 14), (1, 0), (40, 27)])
def test_bisect_search_finds_the_first_bad_in_log2_steps(n, first_bad):
    commits = _commits(n)
    calls = []

    def probe(c: Commit) -> Probe:
        calls.append(c)
        return Probe(c, "bad" if commits.index(c) >= first_bad else "good")
    got = bisect(Commit("0" * 40, "good"), commits, probe)
    assert got.outcome == "found" and got.first_bad == commits[first_bad]
    assert len(calls) <= 1 + math.ceil(math.log2(n)) if n > 1 else len(calls) == 1


def test_bisect_search_says_none_and_inconclusive():
    commits = _commits(7)
    none = bisect(Commit("0" * 40, "good"), commits, lambda c: Probe(c, "good"))
    assert none.outcome == "none" and len(none.steps) == 1
    unsure = bisect(Commit("0" * 40, "good"), commits,
                    lambda c: Probe(c, "bad" if c == commits[-1] else "inconclusive", why="machine busy"))
    assert unsure.outcome == "inconclusive" and unsure.why == "machine busy" and unsure.first_bad == commits[-1]


# --- the CPU identity ------------------------------------------------------------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 8
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl amx_tile amx_bf16

processor\t: 1
vendor_id\t: GenuineIntel
"""


def test_cpu_identity_tells_two_xeons_apart():
    ident = cpu_identity(CPUINFO)
    assert ident == {"vendor": "GenuineIntel", "family": "6", "model": "143", "stepping": "8",
                     "isa": ["amx_bf16", "amx_tile", "avx", "avx2", "avx512bw", "avx512f", "avx512vl", "fma",
                             "sse4_2"]}
    older = cpu_identity(CPUINFO.replace("143", "85").replace(" amx_tile amx_bf16", ""))
    assert hard_differences({"cpu": "x", "cpu_id": ident}, {"cpu": "x", "cpu_id": older}) == ["cpu_id"]
    assert hard_differences({"cpu": "x"}, {"cpu": "x", "cpu_id": ident}) == []     # a run stored before cpu_id
    assert cpu_identity("") == {}


# --- github-action-benchmark -----------------------------------------------------------------------------------

def test_export_github_action_benchmark(mac_changed):
    # the last commit's run by its id: runs stored within one second of each other tie for `latest`. The 3-commit
    # history, not the 16-commit one: that one is built in the serial phase, and this test judges no timing
    res = invoke("export", mac_changed["runs"][-1], "--format", "github-action-benchmark", "--store",
                 mac_changed["url"])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.stdout)
    assert set(entry) == {"name", "unit", "value", "range", "extra"} and entry["unit"] == "ms"
    assert entry["value"] > 0 and entry["range"].startswith("± ") and "interval" in entry["extra"]
    assert mac_changed["shas"][-1][:12] in entry["extra"]


# --- the rules on made-up runs ---------------------------------------------------------------------------------

def _run(i: int, hard: dict, ms: float, dirty: bool = False, status: str = "ok"):
    from harness.contract.records import CaseRecord, RunRecord
    samples = tuple(ms / 1e3 * (1 + 0.002 * ((k * 7) % 5 - 2)) for k in range(50))
    run = RunRecord(id=f"r{i}", suite="s", quick=True, status="done", n_cases=1, started_at=f"2026-01-01T00:00:{i:02d}",
                    env={"hard": hard, "soft": {"commit": f"{i:040x}", "dirty": dirty}})
    rec = CaseRecord(case_key=f"k{i}", suite="s", line="L", arch="a", status=status,
                     metrics={"median_ms": ms, "ci_low_ms": ms * 0.99, "ci_high_ms": ms * 1.01, "macs": 10.0},
                     samples_s=samples if status == "ok" else (), rounds=(10,) * 5 if status == "ok" else ())
    return run, [rec]


def test_history_cuts_at_a_changed_hard_environment_and_reads_old_runs():
    from reports.history import build_history
    old = {"cpu": "x", "torch": "2.0"}                        # stored before cpu_id existed
    new = {**old, "cpu_id": {"family": "6", "model": "143"}}
    other = {**new, "torch": "2.9"}
    runs = [_run(0, old, 2.0), _run(1, new, 2.0), _run(2, new, 2.0), _run(3, other, 4.0), _run(4, other, 4.0),
            _run(5, other, 4.0, dirty=True), _run(6, other, 4.0, status="oom")]
    order = {r.commit: (i, f"c{i}") for i, (r, _) in enumerate(runs)}
    (s,) = build_history(runs, order, suite="s", quick=True).series
    assert [p.env_change for p in s.points] == [(), (), (), ("torch",), (), (), ()]
    assert [p.cpu_unknown for p in s.points][:2] == [True, False]
    assert [(f.index, f.kind) for f in s.flags] == [(6, "status")]       # 2 → 4 ms across torch versions: no step
    assert s.points[5].dirty and not s.points[5].usable
