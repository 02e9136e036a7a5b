"""Power of tests/test_timing.py's test_median_agrees_with_torch_benchmark (not a test: a tool, run by hand).

Runs the test's own loop (``agreement_ratio`` up to ``ATTEMPTS`` times, pass within ``TOLERANCE``) per workload, REPS
times as it is (A/A: must pass) and with measure_cpu's samples biased by +10 % (must fail), at a given sampling time
per round (default: the test's own per workload). Usage, from the repository root:

    PYTHONPATH=. python tests/power_timing_agreement.py [RUN_TIME_S|default] [REPS]
"""
from __future__ import annotations

import sys
import time
import types

import torch

import tests.test_timing as tt

WORKLOADS = {"matmul256": (tt._matmul, tt.SHORT_RUN_TIME_S), "mlp": (tt._mlp, tt.SHORT_RUN_TIME_S),
             "conv": (tt._conv, tt.SHORT_RUN_TIME_S), "decoder-tiny": (tt._decoder_case, tt.RUN_TIME_S)}


def main() -> None:
    torch.set_num_threads(1)                           # the test's one_thread fixture
    run_s = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "default" else None
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    real = tt.measure_cpu
    for label, bias in (("A/A", 1.0), ("+10%", 1.10)):
        tt.measure_cpu = real if bias == 1.0 else (
            lambda fn, c, b=bias: types.SimpleNamespace(samples_s=[s * b for s in real(fn, c).samples_s]))
        for rep in range(reps):
            out, t0 = [], time.process_time()
            for name, (make, default_s) in WORKLOADS.items():
                fn, ratios = make(), []
                for _ in range(tt.ATTEMPTS):
                    ratios.append(tt.agreement_ratio(fn, run_s or default_s))
                    if abs(ratios[-1] - 1.0) < tt.TOLERANCE:
                        break
                verdict = "PASS" if abs(ratios[-1] - 1.0) < tt.TOLERANCE else "FAIL"
                out.append(f"{name}@{run_s or default_s}s:{verdict}[{','.join(f'{r:.3f}' for r in ratios)}]")
            print(f"{label} rep{rep}: {' '.join(out)} ({time.process_time() - t0:.1f} CPU-s)", flush=True)
    tt.measure_cpu = real


if __name__ == "__main__":
    main()
