"""Power of tests/test_timing.py's test_median_agrees_with_torch_benchmark (not a test: a tool, run by hand).

Runs the test's own rule (``agrees_within``: paired rounds added until the comparison says ``unchanged`` within
``FLOOR``, or ``MAX_ROUNDS``) per workload, REPS times as it is (A/A: must pass) and with measure_cpu's samples
biased by +10 % (must fail). Usage, from the repository root:

    PYTHONPATH=. python tests/power_timing_agreement.py [REPS]
"""
from __future__ import annotations

import sys
import time
import types

import torch

import tests.test_timing as tt

WORKLOADS = {"matmul256": tt._matmul, "mlp": tt._mlp, "conv": tt._conv, "matmul512": tt._matmul512}


def main() -> None:
    torch.set_num_threads(1)                           # the test's one_thread fixture
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    real = tt.measure_cpu
    for label, bias in (("A/A", 1.0), ("+10%", 1.10)):
        tt.measure_cpu = real if bias == 1.0 else (
            lambda fn, c, b=bias: types.SimpleNamespace(samples_s=[s * b for s in real(fn, c).samples_s]))
        for rep in range(reps):
            out, t0 = [], time.perf_counter()
            for name, make in WORKLOADS.items():
                last = tt.agrees_within(make())[-1]
                verdict = "PASS" if last.verdict == "unchanged" else "FAIL"
                out.append(f"{name}:{verdict}[{last.interval_text}, {last.n_a} rounds]")
            print(f"{label} rep{rep}: {' '.join(out)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    tt.measure_cpu = real


if __name__ == "__main__":
    main()
