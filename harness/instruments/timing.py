"""Time a zero-argument callable: cold call, warm-up, blocked samples, adaptive stop.

Defaults follow torch.utils.benchmark (blocked timing, block size from a warm-up estimate),
triton's do_bench (CUDA events per sample, one synchronize per batch) and pyperf
(warm-up, minimum samples / time). Threads are not touched here: the caller pins them.
Exceptions raised by ``fn`` propagate unchanged.

What a stored ``median_ms`` means (the median of the per-call samples, ``harness.analysis.stats.summarize_rounds``):

* **CPU** (``perf_counter``): wall time per call in the steady state, caches warm — after the cold call and
  the warm-up, each sample times a block of k back-to-back calls (k so that a block lasts >= ``min_sample_s``)
  and stores block / k. This is what ``torch.utils.benchmark.Timer.blocked_autorange`` reports on a CPU
  (tests/test_timing.py and tests/test_timer_gpu.py compare the two).
* **CUDA** (``cuda_event``, the default): GPU time per call in the steady state, L2 warm — CUDA events on the
  current stream around blocks of k back-to-back calls (k so that a block lasts >= ``min_sample_s``), block / k,
  one synchronize per block (:class:`CudaClock`). One path for every device and every caller: :func:`measure`,
  :func:`measure_interleaved` and the A/B worker all sample through :class:`Sampler`, which takes the same cold
  call, warm-up, block size and stop rule on every device and only its clock from :data:`CLOCKS`.
  Where the host cannot keep the GPU fed (launch-bound work), the idle gaps between kernels lie
  between the events and are counted, as in a steady stream of calls. This is what
  ``torch.utils.benchmark.Timer.blocked_autorange`` reports on a GPU (synchronized blocks of calls).
* **CUDA with ``flush_l2``** (``bench run --flush-l2``): GPU time of ONE call with a cold L2 — before every
  timed call a buffer of ``l2_flush_bytes(device)`` (>= 256 MiB, as triton's do_bench, and >= 2x the
  device's L2) is zeroed on the same stream, outside the call's own pair of events; block size 1. This is
  ``triton.testing.do_bench``'s median (its L2-cleared number), i.e. the warm number plus the cost of
  fetching weights and inputs from HBM again; it is recorded with the run and the case
  (``TimingResult.l2_flush_bytes``). The flush buffer is allocated for the timing only.
* **CPU with ``flush_l2``** is refused (``ValueError``; ``bench run --flush-l2`` on a CPU case: one line,
  exit 2). A CPU's last-level cache cannot be flushed in a way we can defend: it is shared with every other
  process (on a shared machine their traffic refills it between our write and the call), often
  non-inclusive of the cores' private L2 (writing a buffer does not reliably evict those), and the dirty lines
  of the flush are written back during the timed call; nor is there a reference cold-cache CPU timer to
  validate the number against (do_bench is CUDA-only).

The stored interval (``ci_low_ms``/``ci_high_ms``) is the wider of the median's bootstrap interval and the
between-round interval: a timing's samples come in ``TimingConfig.rounds`` rounds (consecutive slices in
``measure``, alternating callables in ``measure_interleaved``), so the interval covers the drift between
rounds, not only the noise within one.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

PATIENCE = 2.0
"""A run whose rel-IQR stays above target stops once sampling has lasted PATIENCE * min_time_s."""
_CALIBRATION_STEPS = 3


Agree = Callable[[int], int]
"""How the processes of a group that time one step together (the ranks of a case across ranks:
:func:`harness.engine.distributed.agreement`) make the same calls, as a step's collectives pair up across them:
given this process's value (whether its warm-up or its sampling is done, its block size), the group's value — the
leader's — once every process has offered its own, so each agreement is also a barrier. Alone (:func:`alone`): the
value itself."""


def alone(value: int) -> int:
    """The :data:`Agree` of a process timing on its own: its own value."""
    return value


@dataclass(frozen=True)
class TimingConfig:
    """How long and how often to run a callable; see :func:`measure` for the stop rule."""

    warmup_calls: int = 3  # at least this many warm-up calls (unless they pass warmup_max_s)...
    warmup_s: float = 0.025  # ...and at least this long
    warmup_max_s: float = 1.0  # a slow step's warm-up ends after this long (one call at least), as triton's do_bench
    min_samples: int = 30
    min_time_s: float = 0.5
    max_time_s: float = 10.0  # cap per case, cold call and warm-up included (>= 3 samples anyway)
    target_rel_iqr: float = 0.05  # adaptive stop once IQR/median below this
    min_sample_s: float = 1e-3  # faster calls are timed in blocks of k calls, sample = block / k
    rounds: int = 5             # samples are taken (and summarized) in this many rounds: see ``measure_interleaved``
    flush_l2: bool = False      # CUDA only: zero a buffer larger than L2 before each timed call (block size 1)

    def __post_init__(self) -> None:
        if self.warmup_calls < 0 or self.min_samples < 1 or self.rounds < 1:
            raise ValueError("warmup_calls must be >= 0, min_samples and rounds >= 1")
        if min(self.warmup_s, self.warmup_max_s, self.min_time_s, self.min_sample_s) < 0 or self.max_time_s <= 0:
            raise ValueError("times must be non-negative and max_time_s positive")

    @classmethod
    def quick(cls) -> TimingConfig:
        """A short configuration for smoke runs and tests."""
        return cls(min_samples=10, min_time_s=0.2, max_time_s=2.0)


@dataclass(frozen=True)
class TimingResult:
    """Raw outcome of one ``measure`` call; summarize ``samples_s`` with ``harness.analysis.stats``."""

    cold_s: float  # the very first call, timed alone (includes lazy init)
    samples_s: tuple[float, ...]  # per-call seconds, one per sample (block time / block size)
    block_size: int  # calls per sample
    warmup_calls: int
    total_s: float  # wall time spent in measure()
    clock: str  # "perf_counter" or "cuda_event"
    rounds: tuple[int, ...] = ()  # samples per round, consecutive in samples_s (sum = len(samples_s))
    l2_flush_bytes: int = 0  # bytes zeroed before each timed call (``TimingConfig.flush_l2``); 0: L2 left warm


def consecutive_rounds(n: int, rounds: int) -> tuple[int, ...]:
    """Split ``n`` samples taken one after another into ``rounds`` consecutive rounds of near-equal size
    (fewer rounds when there are fewer samples)."""
    r = max(1, min(rounds, n))
    return tuple(n // r + (i < n % r) for i in range(r)) if n else ()


FLUSH_MIN_BYTES = 256 * 1024 * 1024
"""triton.testing.do_bench zeroes 256 MB before each call; the flush buffer is at least this large."""


def l2_flush_bytes(device: torch.device | str) -> int:
    """Bytes to write before each call to evict ``device``'s L2: max(256 MiB, 2 x its L2 size)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"flush_l2 is CUDA-only (no defensible CPU cache flush), got device {dev}")
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
    return max(FLUSH_MIN_BYTES, 2 * l2)


class L2Flush:
    """A buffer larger than ``device``'s L2; calling it zeroes the buffer on the current stream (a write of
    every line, so whatever a timed call reads next comes from device memory: do_bench's ``cache.zero_()``)."""

    def __init__(self, device: torch.device | str) -> None:
        self.nbytes = l2_flush_bytes(device)
        self._buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)  # (nbytes / 4,)

    def __call__(self) -> None:
        self._buf.zero_()


def _flusher(config: TimingConfig, device: torch.device) -> L2Flush | None:
    """The L2 flush ``config`` asks for on ``device`` (None without ``flush_l2``); a CPU device is refused."""
    if not config.flush_l2:
        return None
    return L2Flush(device)          # raises ValueError off CUDA


def _rel_iqr(samples: list[float]) -> float:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else math.inf


class _StopRule:
    """The adaptive stop rule; rel-IQR is recomputed only after n grows ~10%, so checks stay cheap."""

    def __init__(self, config: TimingConfig) -> None:
        self._cfg = config
        self._next_check = config.min_samples

    def done(self, samples: list[float], sampling_s: float, total_s: float) -> bool:
        cfg, n = self._cfg, len(samples)
        if n < 3:
            return False
        if total_s >= cfg.max_time_s:
            return True
        if n < cfg.min_samples or sampling_s < cfg.min_time_s:
            return False
        if sampling_s >= PATIENCE * cfg.min_time_s:
            return True
        if n < self._next_check:
            return False
        self._next_check = n + max(1, n // 10)
        return _rel_iqr(samples) < cfg.target_rel_iqr


def _block_size(per_call_s: float, config: TimingConfig) -> int:
    """Smallest k with k * per_call_s >= min_sample_s (at least 1); always 1 with ``flush_l2``."""
    if config.flush_l2 or per_call_s >= config.min_sample_s:
        return 1
    return max(1, math.ceil(config.min_sample_s / max(per_call_s, 1e-9)))


class HostClock:
    """The CPU's clock: ``perf_counter`` around a block of calls; nothing to synchronize."""

    name = "perf_counter"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def sync(self) -> None:
        pass

    def block(self, fn: Callable[[], object], k: int, flush: L2Flush | None = None) -> float:
        """Seconds per call over k back-to-back calls of ``fn``."""
        t0 = time.perf_counter()
        for _ in itertools.repeat(None, k):
            fn()
        return (time.perf_counter() - t0) / k


class CudaClock(HostClock):
    """A CUDA device's clock: a pair of events on the device's current stream around a block of calls, then one
    synchronize (as ``torch.utils.benchmark``'s blocked timer on a GPU); ``flush`` runs before the start event,
    outside the timed interval."""

    name = "cuda_event"

    def context(self) -> contextlib.AbstractContextManager:
        return torch.cuda.device(self.device)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def block(self, fn: Callable[[], object], k: int, flush: L2Flush | None = None) -> float:
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush is not None:
            flush()                           # enqueued before the start event: outside the timed interval
        start.record(stream)
        for _ in itertools.repeat(None, k):
            fn()
        end.record(stream)
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) * 1e-3 / k


CLOCKS: dict[str, type[HostClock]] = {"cpu": HostClock, "cuda": CudaClock}
"""The one clock of each device type; every timing (:func:`measure`, :func:`measure_interleaved`, the A/B worker)
samples through :class:`Sampler` with it."""


def clock_for(device: torch.device | str) -> HostClock:
    """The clock of ``device`` (:data:`CLOCKS`); ValueError for a device type with none."""
    dev = torch.device(device)
    if dev.type not in CLOCKS:
        raise ValueError(f"unsupported device type for timing: {dev.type!r}")
    return CLOCKS[dev.type](dev)


def measure(fn: Callable[[], object], config: TimingConfig, device: torch.device | str = "cpu",
            agree: Agree = alone) -> TimingResult:
    """Time ``fn`` on ``device`` (the same steps on every device, with its clock: :data:`CLOCKS`).

    1. Cold: the first call is timed alone (``cold_s``; on CUDA between two synchronizes).
    2. Warm-up: calls until at least ``warmup_calls`` were made AND ``warmup_s`` elapsed — or, for a slow step,
       until ``warmup_max_s`` elapsed (one call at least after the cold one: triton's do_bench likewise warms up
       for a time, ``max(1, warmup / estimate)`` calls).
    3. Block size k = ceil(min_sample_s / warm-up mean per call), at least 1. When k > 1
       the warm-up mean is inflated by its per-call clock reads (and synchronizes), so a block of k calls is
       timed and k rescaled from it until a block lasts >= min_sample_s (at most
       _CALIBRATION_STEPS blocks, counted in ``warmup_calls``).
    4. Samples: each sample times a block of k calls with the device's clock (perf_counter; CUDA events and one
       synchronize per block) and stores block_time / k. After each sample, stop when (checked in this order):
       a. n >= 3 and total time in measure() >= max_time_s  (hard cap; n may be < min_samples);
       b. n >= min_samples and sampling time >= min_time_s and
          (sampling time >= PATIENCE * min_time_s or IQR/median < target_rel_iqr).
       IQR/median is a property of the noise, not of n, so a noisy run is only extended
       to PATIENCE * min_time_s (to ride out transients and narrow the median's CI);
       it is re-evaluated only when n has grown by ~10% since the last evaluation.

    ``fn`` must enqueue its work on the current stream of ``device``. With ``config.flush_l2`` (CUDA only:
    ValueError on a CPU) every sample is ONE call (k = 1) preceded on the stream by a write of
    ``l2_flush_bytes(device)`` outside its events: triton do_bench's cold-L2 timing.

    ``agree`` (:data:`Agree`): several processes timing one step together (the ranks of a case) agree before the
    cold call, on the end of the warm-up, on the block size and calibration, and after each sample on whether to
    take another — the leader's stop rule decides, and every process makes the same calls, each sample starting
    after the same barrier.
    """
    clock = clock_for(device)
    if config.flush_l2 and clock.device.type != "cuda":
        raise ValueError("flush_l2 is CUDA-only (no defensible CPU cache flush: see harness.instruments.timing)")
    with clock.context():
        t_start = time.perf_counter()
        prepared = Sampler(fn, config, clock.device, agree=agree)        # steps 1-3
        samples = prepared.samples
        stop = _StopRule(config)
        s_start = time.perf_counter()
        while True:
            prepared.sample()
            t1 = time.perf_counter()
            if agree(int(stop.done(samples, t1 - s_start, t1 - t_start))):
                break
        prepared.rounds = list(consecutive_rounds(len(samples), config.rounds))
        return prepared.result(time.perf_counter() - t_start)


def measure_cpu(fn: Callable[[], object], config: TimingConfig) -> TimingResult:
    """:func:`measure` on the CPU."""
    return measure(fn, config, "cpu")


def measure_cuda(fn: Callable[[], object], config: TimingConfig, device: torch.device | str = "cuda"
                 ) -> TimingResult:
    """:func:`measure` on a CUDA device (ValueError for another device)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"measure_cuda needs a cuda device, got {dev}")
    return measure(fn, config, dev)


class Sampler:
    """One callable prepared for timing — cold call, warm-up and block size, as :func:`measure` describes —
    then ``sample()`` times one block of k calls with the device's clock (:func:`clock_for`; with ``flush_l2``,
    k = 1 and ``flush`` — shared by callables timed side by side, else made here — runs before the start event).
    :func:`measure`, :func:`measure_interleaved` and the A/B worker (``harness.engine.ab_worker``) all sample through it.
    ``agree``: the group's agreement on each of these steps (:data:`Agree`; a process alone by default)."""

    def __init__(self, fn: Callable[[], object], config: TimingConfig, device: torch.device,
                 flush: L2Flush | None = None, agree: Agree = alone) -> None:
        self.fn, self.device, self.samples, self.rounds = fn, device, [], []
        self.clock = clock_for(device)
        self.flush = (flush or _flusher(config, device)) if config.flush_l2 else None
        self.clock.sync()
        agree(0)                                  # a group starts its cold calls together
        c0 = time.perf_counter()
        fn()
        self.clock.sync()
        self.cold_s = time.perf_counter() - c0
        self.n_warm, w_start = 0, time.perf_counter()
        while True:
            fn()
            self.n_warm += 1
            self.clock.sync()
            elapsed = time.perf_counter() - w_start
            enough = self.n_warm >= config.warmup_calls or elapsed >= config.warmup_max_s
            if agree(int(enough and elapsed >= config.warmup_s)):
                break
        self.k = agree(_block_size(elapsed / self.n_warm, config))
        for _ in range(_CALIBRATION_STEPS if self.k > 1 else 0):
            block_s = self.sample(keep=False)
            self.n_warm += self.k
            if agree(int(block_s * self.k >= config.min_sample_s)):
                break
            self.k = agree(_block_size(block_s, config))

    def sample(self, keep: bool = True) -> float:
        """Seconds per call over one block of k calls."""
        per_call = self.clock.block(self.fn, self.k, self.flush)
        if keep:
            self.samples.append(per_call)
        return per_call

    def take_round(self, config: TimingConfig) -> None:
        """One round of blocked samples: at least ceil(min_samples / rounds) samples AND min_time_s / rounds of
        sampling, or max_time_s / rounds (with at least one sample)."""
        r = config.rounds
        per_min_n = max(1, math.ceil(config.min_samples / r))
        per_min_s, per_max_s = config.min_time_s / r, config.max_time_s / r
        n0, t0 = len(self.samples), time.perf_counter()
        while True:
            self.sample()
            elapsed = time.perf_counter() - t0
            if (len(self.samples) - n0 >= per_min_n and elapsed >= per_min_s) or elapsed >= per_max_s:
                break
        self.rounds.append(len(self.samples) - n0)

    def result(self, total_s: float) -> TimingResult:
        return TimingResult(cold_s=self.cold_s, samples_s=tuple(self.samples), block_size=self.k,
                            warmup_calls=self.n_warm, total_s=total_s,
                            clock=self.clock.name, rounds=tuple(self.rounds),
                            l2_flush_bytes=self.flush.nbytes if self.flush is not None else 0)


def measure_interleaved(fns: Sequence[Callable[[], object]], config: TimingConfig,
                        device: torch.device | str = "cpu", seed: int = 0,
                        before: Sequence[Callable[[], object]] | None = None) -> list[TimingResult | BaseException]:
    """Time several callables side by side: A and B (and C...) alternate in rounds, so drift of the machine
    (another job starting, clock or thermal changes) hits every side alike and a ratio of round medians
    cancels it.

    1. Each callable is prepared in turn: cold call, warm-up and block size as in :func:`measure`.
    2. ``config.rounds`` rounds; in each, the callables run in a fresh random order (``random.Random(seed)``),
       each taking blocked samples until it has at least ceil(min_samples / rounds) samples AND
       min_time_s / rounds of sampling (or max_time_s / rounds has passed, with at least one sample).
    3. Each result's ``rounds`` says how many of its samples each round holds; round i of every callable ran
       within the same round. ``harness.analysis.ratios.paired_ratio`` turns two of them into a ratio whose interval is
       the spread of the per-round ratios (drift included); ``round_summary`` gives one side's drift.
    With ``config.flush_l2`` (CUDA only) every sample is one call after a write of one shared flush buffer.
    A callable that raises is reported by its exception in place of a result and leaves the later rounds;
    the others go on. ``before[i]``, when given, runs untimed before callable i is prepared and before each of
    its rounds (e.g. its thread count: cases of one group may differ in it).
    """
    clock = clock_for(device)
    dev = clock.device
    with clock.context():             # CUDA: the device current, as for measure()
        t_start = time.perf_counter()
        flush = _flusher(config, dev)           # one flush buffer for all sides (ValueError on a CPU)
        out: list[Sampler | BaseException] = []
        setup = list(before) if before is not None else [lambda: None] * len(fns)
        for fn, pre in zip(fns, setup):
            try:
                pre()
                out.append(Sampler(fn, config, dev, flush))
            except Exception as exc:  # noqa: BLE001 — one side's failure is its result
                out.append(exc)
        rng = random.Random(seed)
        for _ in range(config.rounds):
            order = list(range(len(out)))
            rng.shuffle(order)
            for i in order:
                s = out[i]
                if isinstance(s, BaseException):
                    continue
                try:
                    setup[i]()
                    s.take_round(config)
                except Exception as exc:  # noqa: BLE001
                    out[i] = exc
        total = time.perf_counter() - t_start
        return [s if isinstance(s, BaseException) else s.result(total) for s in out]
