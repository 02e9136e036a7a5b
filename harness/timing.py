"""Time a zero-argument callable: cold call, warm-up, blocked samples, adaptive stop.

Defaults follow torch.utils.benchmark (blocked timing, block size from a warm-up estimate),
triton's do_bench (CUDA events per sample, one synchronize per batch) and pyperf
(warm-up, minimum samples / time). Threads are not touched here: the caller pins them.
Exceptions raised by ``fn`` propagate unchanged.

What a stored ``median_ms`` means (the median of the per-call samples, ``harness.stats.summarize_rounds``):

* **CPU** (``perf_counter``): wall time per call in the steady state, caches warm — after the cold call and
  the warm-up, each sample times a block of k back-to-back calls (k so that a block lasts >= ``min_sample_s``)
  and stores block / k. This is what ``torch.utils.benchmark.Timer.blocked_autorange`` reports on a CPU
  (tests/test_timing.py and tests/test_timer_gpu.py compare the two).
* **CUDA** (``cuda_event``, the default): GPU time per call in the steady state, L2 warm — CUDA events on the
  current stream around blocks of k back-to-back calls (k so that a block lasts >= ``min_sample_s``), block / k;
  the host queues work ahead and synchronizes once per batch of samples (``measure_cuda``) or per block
  (``Sampler``). Where the host cannot keep the GPU fed (launch-bound work), the idle gaps between kernels lie
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


@dataclass(frozen=True)
class TimingConfig:
    """How long and how often to run a callable; see ``measure_cpu`` for the stop rule."""

    warmup_calls: int = 3  # at least this many warm-up calls...
    warmup_s: float = 0.025  # ...and at least this long
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
        if min(self.warmup_s, self.min_time_s, self.min_sample_s) < 0 or self.max_time_s <= 0:
            raise ValueError("times must be non-negative and max_time_s positive")

    @classmethod
    def quick(cls) -> TimingConfig:
        """A short configuration for smoke runs and tests."""
        return cls(min_samples=10, min_time_s=0.2, max_time_s=2.0)


@dataclass(frozen=True)
class TimingResult:
    """Raw outcome of one ``measure`` call; summarize ``samples_s`` with ``harness.stats``."""

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


def measure_cpu(fn: Callable[[], object], config: TimingConfig) -> TimingResult:
    """Time ``fn`` with ``time.perf_counter``.

    1. Cold: the first call is timed alone (``cold_s``).
    2. Warm-up: calls until at least ``warmup_calls`` were made AND ``warmup_s`` elapsed.
    3. Block size k = ceil(min_sample_s / warm-up mean per call), at least 1. When k > 1
       the warm-up mean is inflated by its per-call clock reads, so a block of k calls is
       timed and k rescaled from it until a block lasts >= min_sample_s (at most
       _CALIBRATION_STEPS blocks, counted in ``warmup_calls``).
    4. Samples: each sample times a block of k calls and stores block_time / k. After each
       sample, stop when (checked in this order):
       a. n >= 3 and total time in measure() >= max_time_s  (hard cap; n may be < min_samples);
       b. n >= min_samples and sampling time >= min_time_s and
          (sampling time >= PATIENCE * min_time_s or IQR/median < target_rel_iqr).
       IQR/median is a property of the noise, not of n, so a noisy run is only extended
       to PATIENCE * min_time_s (to ride out transients and narrow the median's CI);
       it is re-evaluated only when n has grown by ~10% since the last evaluation.
    """
    if config.flush_l2:
        raise ValueError("flush_l2 is CUDA-only (no defensible CPU cache flush: see harness.timing)")
    clock = time.perf_counter
    t_start = clock()
    prepared = Sampler(fn, config, torch.device("cpu"))        # steps 1-3
    samples = prepared.samples
    stop = _StopRule(config)
    s_start = clock()
    while True:
        prepared.sample()
        t1 = clock()
        if stop.done(samples, t1 - s_start, t1 - t_start):
            break
    return TimingResult(
        cold_s=prepared.cold_s,
        samples_s=tuple(samples),
        block_size=prepared.k,
        warmup_calls=prepared.n_warm,
        total_s=clock() - t_start,
        clock="perf_counter",
        rounds=consecutive_rounds(len(samples), config.rounds),
    )


def measure_cuda(
    fn: Callable[[], object], config: TimingConfig, device: torch.device | str = "cuda"
) -> TimingResult:
    """Time ``fn`` on a CUDA device with events recorded on the current stream.

    ``fn`` must enqueue its work on the current stream of ``device``. The cold call is
    timed by wall clock between two synchronizes. Warm-up runs in chunks (warmup_calls,
    then doubling), each bracketed by events and ended by one synchronize, until at least
    ``warmup_calls`` calls and ``warmup_s`` of wall time; the last chunk's event time per
    call gives the block size k, as in ``measure_cpu``. Samples are taken in batches of
    about min_time_s / 10 of GPU time: per sample a start/end event pair around k calls,
    then ONE synchronize per batch, after which the samples are read and the stop rule of
    ``measure_cpu`` is evaluated on wall-clock times.

    With ``config.flush_l2`` every sample is ONE call (k = 1) between its own pair of events, preceded on the
    stream by a write of ``l2_flush_bytes(device)`` outside the events: triton do_bench's cold-L2 timing.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"measure_cuda needs a cuda device, got {dev}")
    clock = time.perf_counter
    repeat = itertools.repeat
    event = torch.cuda.Event
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        flush = _flusher(config, dev)
        t_start = clock()
        torch.cuda.synchronize(dev)
        t0 = clock()
        fn()
        torch.cuda.synchronize(dev)
        cold_s = clock() - t0

        start, end = event(enable_timing=True), event(enable_timing=True)
        n_warm, chunk, w_start = 0, max(1, config.warmup_calls), clock()
        while True:
            start.record(stream)
            for _ in repeat(None, chunk):
                fn()
            end.record(stream)
            torch.cuda.synchronize(dev)
            n_warm += chunk
            per_call_s = start.elapsed_time(end) * 1e-3 / chunk
            if n_warm >= config.warmup_calls and clock() - w_start >= config.warmup_s:
                break
            chunk *= 2
        k = _block_size(per_call_s, config)
        batch_s = max(config.min_time_s / 10.0, 1e-3)
        n_batch = min(1000, max(1, math.ceil(batch_s / max(k * per_call_s, 1e-9))))
        starts = [event(enable_timing=True) for _ in range(n_batch)]
        ends = [event(enable_timing=True) for _ in range(n_batch)]

        samples: list[float] = []
        stop = _StopRule(config)
        s_start = clock()
        while True:
            for s_ev, e_ev in zip(starts, ends):
                if flush is not None:
                    flush()                       # enqueued before the start event: outside the timed interval
                s_ev.record(stream)
                for _ in repeat(None, k):
                    fn()
                e_ev.record(stream)
            torch.cuda.synchronize(dev)
            now = clock()
            samples.extend(s.elapsed_time(e) * 1e-3 / k for s, e in zip(starts, ends))
            if stop.done(samples, now - s_start, now - t_start):
                break
    return TimingResult(
        cold_s=cold_s,
        samples_s=tuple(samples),
        block_size=k,
        warmup_calls=n_warm,
        total_s=clock() - t_start,
        clock="cuda_event",
        rounds=consecutive_rounds(len(samples), config.rounds),
        l2_flush_bytes=flush.nbytes if flush is not None else 0,
    )


def measure(
    fn: Callable[[], object], config: TimingConfig, device: torch.device | str = "cpu"
) -> TimingResult:
    """Time ``fn`` on ``device``: ``measure_cpu`` for cpu, ``measure_cuda`` for cuda (``flush_l2`` is CUDA-only:
    ValueError on a CPU)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return measure_cpu(fn, config)
    if dev.type == "cuda":
        return measure_cuda(fn, config, dev)
    raise ValueError(f"unsupported device type for timing: {dev.type!r}")


class Sampler:
    """One callable prepared for timing — cold call, warm-up and block size, as ``measure_cpu`` describes —
    then ``sample()`` times one block of k calls (perf_counter on the CPU; CUDA events and a synchronize per
    block on a GPU; with ``flush_l2``, k = 1 and ``flush`` — shared by callables timed side by side, else made
    here — runs before the start event). ``measure_cpu`` and ``measure_interleaved`` both sample through it."""

    def __init__(self, fn: Callable[[], object], config: TimingConfig, device: torch.device,
                 flush: L2Flush | None = None) -> None:
        self.fn, self.device, self.samples, self.rounds = fn, device, [], []
        self.cuda = device.type == "cuda"
        self.flush = (flush or _flusher(config, device)) if config.flush_l2 else None
        self._sync()
        c0 = time.perf_counter()
        fn()
        self._sync()
        self.cold_s = time.perf_counter() - c0
        self.n_warm, w_start = 0, time.perf_counter()
        while True:
            fn()
            self.n_warm += 1
            self._sync()
            elapsed = time.perf_counter() - w_start
            if self.n_warm >= config.warmup_calls and elapsed >= config.warmup_s:
                break
        self.k = _block_size(elapsed / self.n_warm, config)
        for _ in range(_CALIBRATION_STEPS if self.k > 1 else 0):
            block_s = self.sample(keep=False)
            self.n_warm += self.k
            if block_s * self.k >= config.min_sample_s:
                break
            self.k = _block_size(block_s, config)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def sample(self, keep: bool = True) -> float:
        """Seconds per call over one block of k calls."""
        fn, k = self.fn, self.k
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.flush is not None:
                self.flush()                      # before the start event: outside the timed interval
            start.record()
            for _ in itertools.repeat(None, k):
                fn()
            end.record()
            torch.cuda.synchronize(self.device)
            per_call = start.elapsed_time(end) * 1e-3 / k
        else:
            t0 = time.perf_counter()
            for _ in itertools.repeat(None, k):
                fn()
            per_call = (time.perf_counter() - t0) / k
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
                            clock="cuda_event" if self.cuda else "perf_counter", rounds=tuple(self.rounds),
                            l2_flush_bytes=self.flush.nbytes if self.flush is not None else 0)


def measure_interleaved(fns: Sequence[Callable[[], object]], config: TimingConfig,
                        device: torch.device | str = "cpu", seed: int = 0,
                        before: Sequence[Callable[[], object]] | None = None) -> list[TimingResult | BaseException]:
    """Time several callables side by side: A and B (and C...) alternate in rounds, so drift of the machine
    (another job starting, clock or thermal changes) hits every side alike and a ratio of round medians
    cancels it.

    1. Each callable is prepared in turn: cold call, warm-up and block size as in ``measure_cpu``.
    2. ``config.rounds`` rounds; in each, the callables run in a fresh random order (``random.Random(seed)``),
       each taking blocked samples until it has at least ceil(min_samples / rounds) samples AND
       min_time_s / rounds of sampling (or max_time_s / rounds has passed, with at least one sample).
    3. Each result's ``rounds`` says how many of its samples each round holds; round i of every callable ran
       within the same round. ``harness.stats.paired_ratio`` turns two of them into a ratio whose interval is
       the spread of the per-round ratios (drift included); ``round_summary`` gives one side's drift.
    With ``config.flush_l2`` (CUDA only) every sample is one call after a write of one shared flush buffer.
    A callable that raises is reported by its exception in place of a result and leaves the later rounds;
    the others go on. ``before[i]``, when given, runs untimed before callable i is prepared and before each of
    its rounds (e.g. its thread count: cases of one group may differ in it).
    """
    dev = torch.device(device)
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
