"""The worker side of an A/B timing across two versions of the code (``bench check --against REF``).

Started by :mod:`harness.engine.ab` as ``python -c "from harness.engine.ab_worker import serve; serve()"`` with
``PYTHONPATH`` at one checkout, so every import below is that checkout's code. It talks over a socket whose
file descriptor is in ``BENCH_AB_FD``, in plain dicts (no class crosses between the two versions):

- ``("prepare", case, {"timing": ..., "memory": bool})``: fake pass, build (:func:`harness.engine.runner.prepare`),
  cold call and warm-up (:class:`harness.instruments.timing.Sampler`); replies ``("ready", None)`` or
  ``("done", record)`` when the case ends there (skipped, failed);
- ``("round", None, None)``: one round of samples (as :func:`harness.instruments.timing.measure_interleaved` takes them);
- ``("finish", group, None)``: the case measured on with those samples, as every run measures a prepared step
  (:func:`harness.engine.measure.measure_prepared`: the memory and counting passes — ``sdpa_backend``,
  ``executed_macs`` — unless ``prepare`` said ``"memory": False``, which the workers whose records only lend their
  samples are told); replies ``("done", record)``. ``("stop", ...)`` ends the worker.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

import torch

from harness.contract import registry
from harness.engine.env import freeze_heap
from harness.instruments.load import LoadMonitor
from harness.contract.records import CaseRecord
from harness.engine.measure import Prepared, Timed, failed_record, measure_prepared
from harness.engine.runner import RunOptions, prepare
from harness.contract.spec import Case, Workload
from harness.instruments.timing import TimingConfig, Sampler


def case_from(d: dict[str, Any]) -> Case:
    return Case(d["suite"], d["line"], d["arch"], tuple(tuple(kv) for kv in d["overrides"]),
                Workload(**d["workload"]), tuple(d["metrics"]), d.get("point", 0))


def _exit_now() -> None:
    """End the worker without the interpreter's teardown (torch's and every module's finalizers: ~0.8 s for an idle
    worker, more after a case: at the end of every `bench check --against`, four of them side by side, and beside the
    fresh workers of a re-measurement). Every answer has already gone over the socket; the standard streams are
    flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve() -> None:
    sock = socket.socket(fileno=int(os.environ["BENCH_AB_FD"]))
    conn = Connection(sock.detach())
    plugins = tuple(p for p in os.environ.get("BENCH_AB_PLUGINS", "").split(os.pathsep) if p)
    registry.list_archs()
    freeze_heap()             # the imports stay out of the collections before each measurement
    held: dict[str, Any] = {}
    while True:
        try:
            cmd, arg, extra = conn.recv()
        except (EOFError, OSError):
            return
        if cmd == "stop":
            _exit_now()
        p: Prepared | None = held.get("p")
        try:
            if cmd == "prepare":
                held.clear()
                case, timing = case_from(arg), TimingConfig(**extra["timing"])
                opts = RunOptions(timing=timing, plugins=plugins, replica=not extra.get("memory", True))
                got = prepare(case, opts)
                if isinstance(got, CaseRecord):
                    conn.send(("done", asdict(got)))
                    continue
                held.update(p=got, opts=opts, spent=0.0)
                if "latency" in case.metrics:
                    monitor = LoadMonitor()
                    monitor.start()
                    t0 = time.perf_counter()
                    held.update(monitor=monitor, sampler=Sampler(got.step, timing, torch.device(case.workload.device)))
                    held["spent"] += time.perf_counter() - t0
                conn.send(("ready", None))
            elif cmd == "round":
                if "sampler" in held:
                    t0 = time.perf_counter()
                    held["sampler"].take_round(held["opts"].timing)
                    held["spent"] += time.perf_counter() - t0
                conn.send(("ok", None))
            elif cmd == "finish":
                timed = None
                if "sampler" in held:      # the seconds spent in the sampler: its time parts (harness.engine.overhead)
                    timed = Timed(held["sampler"].result(held["spent"]), held["monitor"].stop(), group=arg or "")
                rec = measure_prepared(p, held["opts"], timed)
                conn.send(("done", asdict(rec)))
                held.clear()
        except Exception as exc:  # noqa: BLE001 — the case's failure is its record
            p = held.get("p", p)
            rec = failed_record(p.case if p else case_from(arg), exc, held.get("opts") or RunOptions(plugins=plugins),
                                config=p.config if p else {}, metrics=p.metrics if p else {})
            held.clear()
            conn.send(("done", asdict(rec)))
