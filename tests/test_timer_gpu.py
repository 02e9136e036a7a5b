"""Our timer against the references, measured interleaved in rounds in one process.

On CUDA (``gpu``; the GPU machine has torch 2.11, torchvision and triton): ``harness.instruments.timing.measure`` against
``torch.utils.benchmark.Timer.blocked_autorange`` (both warm L2, per call) and, with ``flush_l2``, against
``triton.testing.do_bench`` (both L2 flushed before each call), on a compute-bound matmul (8192², fp32, TF32 off)
and torchvision's resnet50 and vit_b_16 (random weights, batch 16, 224², fp32 and bf16). On the CPU (not
``gpu``): ours against blocked_autorange on a matmul.

The rule (``agree``): each timer gives one median per round; the rounds run one after another with the timers
in a fresh random order each round, so machine drift hits every timer alike. Two timers agree when the ratio
of their medians over rounds is within the spread between rounds that the run itself measured — the larger
relative range (max − min) / median of either timer's round medians, at least ``FLOOR`` — and, on the
compute-bound matmul, within 5 %. No absolute time is asserted.

How it fails: a timer that measures something else — events on another stream than the work, a block not
divided by its calls, the flush inside the timed interval on a memory-bound call, host time without a
synchronize (launch time only) — moves its median by more than the rounds spread. Each test also runs a
negative control through the same rule and requires it to be rejected: on the GPU host time without a
synchronize (the launch, microseconds against 21 ms), on the CPU a reference timing two matmuls against ours
timing one.
"""
from __future__ import annotations

import dataclasses
import inspect
import random
import statistics
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils import benchmark

from harness.instruments.timing import TimingConfig, measure, measure_cpu

ROUNDS = 5
FLOOR = 0.02            # the rule's tolerance never drops below 2 % (timer resolution, block-size effects)
MATMUL_TOL = 0.05       # and on the compute-bound matmul it never exceeds 5 %
RUN_S = 0.3             # each timer's sampling per round
ATTEMPTS = 3            # the CPU box is shared: a noisy attempt is retried, the rule never widened


@dataclasses.dataclass(frozen=True)
class Agreement:
    """median(A) / median(B) over rounds, and the tolerance the rounds gave."""

    ratio: float
    tolerance: float
    a_rounds_ms: tuple[float, ...]
    b_rounds_ms: tuple[float, ...]

    @property
    def ok(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance


def spread(rounds: list[float]) -> float:
    """Relative range of round medians: (max − min) / median."""
    return (max(rounds) - min(rounds)) / statistics.median(rounds)


def agree(a: list[float], b: list[float], floor: float = FLOOR, cap: float | None = None) -> Agreement:
    """Do timers A and B (their per-round medians, seconds) agree within the spread between rounds?"""
    tol = max(spread(a), spread(b), floor)
    if cap is not None:
        tol = min(tol, cap)
    return Agreement(statistics.median(a) / statistics.median(b), tol,
                     tuple(x * 1e3 for x in a), tuple(x * 1e3 for x in b))


def interleaved(timers: dict[str, Callable[[], float]], rounds: int = ROUNDS, seed: int = 0) -> dict[str, list[float]]:
    """Each timer once per round, in a fresh random order per round; returns its per-round medians (seconds)."""
    out: dict[str, list[float]] = {name: [] for name in timers}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(timers)
        rng.shuffle(order)
        for name in order:
            out[name].append(timers[name]())
    return out


def test_agree_rule() -> None:
    same = agree([1.00, 1.02, 0.99], [1.01, 1.00, 1.03])
    assert same.ok and same.tolerance == pytest.approx(0.03, abs=1e-9)
    assert not agree([1.0, 1.0, 1.0], [1.1, 1.1, 1.1]).ok                    # 10 % apart, no spread: the floor
    assert agree([1.0, 1.3, 1.0], [1.1, 1.1, 1.1]).ok                        # the spread between rounds covers it
    assert not agree([1.0, 1.3, 1.0], [1.1, 1.1, 1.1], cap=MATMUL_TOL).ok    # ...but not past the cap


# ---------------------------------------------------------------- CPU: ours vs torch.utils.benchmark


def test_cpu_median_agrees_with_torch_benchmark_within_round_spread(one_thread: None,
                                                                    record_property: Callable[[str, object], None]
                                                                    ) -> None:
    # 1024² (~50 ms a call on one core): both timers then time one call per block. A small op is timed by ours in
    # blocks of ~1 ms and by blocked_autorange in blocks of >= 10 ms; on an overloaded shared box (load 7 on 2
    # cores here) the long blocks always contain time sliced away and the short ones mostly not (0.43 vs 0.90 ms
    # for 256², measured) — a property of the box, not of either timer.
    a = torch.randn(1024, 1024)                                               # (1024, 1024) fp32
    one, two = (lambda: torch.mm(a, a)), (lambda: (torch.mm(a, a), torch.mm(a, a)))
    cfg = TimingConfig(min_time_s=RUN_S, max_time_s=4 * RUN_S)

    def tub(fn: Callable[[], object]) -> Callable[[], float]:
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
        return lambda: timer.blocked_autorange(min_run_time=RUN_S).median

    tries = []
    for attempt in range(ATTEMPTS):
        got = interleaved({"ours": lambda: statistics.median(measure_cpu(one, cfg).samples_s),
                           "tub": tub(one), "tub_twice": tub(two)}, seed=attempt)
        tries.append((agree(got["ours"], got["tub"]), agree(got["ours"], got["tub_twice"])))
        # an attempt whose rounds spread so widely that twice the work passes too could tell nothing: try again
        if tries[-1][0].ok and not tries[-1][1].ok:
            break
    record_property("agreements", [(t[0].ratio, t[0].tolerance) for t in tries])
    good, control = tries[-1]
    assert good.ok, f"ours / blocked_autorange: {good}"
    assert not control.ok, f"the rule must reject twice the work: {control}"


# ---------------------------------------------------------------- CUDA: ours vs torch.utils.benchmark and do_bench

def _matmul() -> Callable[[], object]:
    a = torch.randn(8192, 8192, device="cuda")                                # (8192, 8192) fp32, TF32 off
    return lambda: torch.mm(a, a)


def _torchvision(name: str, dtype: torch.dtype) -> Callable[[], Callable[[], object]]:
    def make() -> Callable[[], object]:
        torchvision = pytest.importorskip("torchvision")
        model = getattr(torchvision.models, name)().eval().to("cuda", dtype)  # random weights
        x = torch.randn(16, 3, 224, 224, device="cuda", dtype=dtype)          # (16, 3, 224, 224)

        def fn() -> object:
            with torch.no_grad():
                return model(x)
        return fn
    return make


WORKLOADS = {"matmul8192-fp32": _matmul,
             "resnet50-fp32": _torchvision("resnet50", torch.float32),
             "resnet50-bf16": _torchvision("resnet50", torch.bfloat16),
             "vit_b_16-fp32": _torchvision("vit_b_16", torch.float32),
             "vit_b_16-bf16": _torchvision("vit_b_16", torch.bfloat16)}


@pytest.fixture
def no_tf32() -> Iterator[None]:
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def _do_bench(fn: Callable[[], object]) -> Callable[[], float]:
    """triton's do_bench (it zeroes a 256 MB buffer before each call), its median, in seconds."""
    testing = pytest.importorskip("triton.testing")
    kw = {"return_mode": "median"} if "return_mode" in inspect.signature(testing.do_bench).parameters else {}
    return lambda: float(testing.do_bench(fn, warmup=25, rep=int(RUN_S * 1e3), **kw)) * 1e-3


def _launch_only(fn: Callable[[], object]) -> Callable[[], float]:
    """The classic bug, as a negative control: host time around a call without a synchronize."""
    def once() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        torch.cuda.synchronize()
        return t
    return lambda: statistics.median(once() for _ in range(5))


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.usefixtures("no_tf32")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_medians_agree_with_torch_benchmark_and_do_bench(name: str,
                                                              record_property: Callable[[str, object], None]) -> None:
    fn = WORKLOADS[name]()
    cfg = TimingConfig(min_time_s=RUN_S, max_time_s=4 * RUN_S)
    flushed = dataclasses.replace(cfg, flush_l2=True)
    tub = benchmark.Timer(stmt="fn()", globals={"fn": fn})                   # its timer synchronizes
    timers = {"ours": lambda: statistics.median(measure(fn, cfg, "cuda").samples_s),
              "tub": lambda: tub.blocked_autorange(min_run_time=RUN_S).median,
              "ours_flush": lambda: statistics.median(measure(fn, flushed, "cuda").samples_s),
              "do_bench": _do_bench(fn)}
    matmul = name.startswith("matmul")
    if matmul:
        timers["launch_only"] = _launch_only(fn)
    got = interleaved(timers)
    cap = MATMUL_TOL if matmul else None
    pairs = {"ours/tub": agree(got["ours"], got["tub"], cap=cap),
             "ours_flush/do_bench": agree(got["ours_flush"], got["do_bench"], cap=cap)}
    if matmul:      # compute-bound: a cold L2 cannot matter, so all four agree
        pairs["ours/do_bench"] = agree(got["ours"], got["do_bench"], cap=cap)
    record_property("rounds_ms", {k: [round(x * 1e3, 3) for x in v] for k, v in got.items()})
    record_property("ratios", {k: (round(v.ratio, 4), round(v.tolerance, 4)) for k, v in pairs.items()})
    bad = {k: v for k, v in pairs.items() if not v.ok}
    assert not bad, f"{name}: medians disagree beyond the spread between rounds: {bad}"
    if matmul:
        control = agree(got["launch_only"], got["tub"], cap=cap)
        assert not control.ok, f"the rule must reject launch-only timing: {control}"
