"""scripts/machine-drift: it times the 2 ms busy-wait call in windows and says how far the windows' medians moved;
bad arguments are exit 2 (the figures it gives are a benchmark's, quoted in tests/test_ci_gate.py's A/A test)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "machine-drift"


def test_windows_are_timed_and_their_spread_printed(tmp_path):
    out = tmp_path / "w.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "0.6", "--window", "0.2", "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert 1 <= len(doc["windows"]) <= 3 and doc["window_s"] == 0.2        # each window lasts 0.2 s or more
    assert all(ms >= 2.0 for ms, _, _ in doc["windows"])           # the call busy-waits 2 ms on the wall clock
    m = re.search(r"median call ([\d.]+) ms", res.stdout)
    assert m and float(m.group(1)) == round(doc["median_ms"], 4)
    assert re.search(r"1st-99th percentile: [\d.]+-[\d.]+", res.stdout)


def test_bad_arguments_are_exit_2():
    for args in (["-1"], ["1", "--window", "2"], ["x"]):
        res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
