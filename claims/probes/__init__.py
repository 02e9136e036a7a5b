"""Probes: each turns suite runs, experiments or direct computations into the named figures its claims'
rules test. ``@probe(name, figures=...)`` registers one and declares the figures it can produce."""
from __future__ import annotations

import importlib
import math
import multiprocessing
import pkgutil
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import torch

from claims.evidence import Context, read_name
from claims.model import Chart, Evidence, Figure, mean_ci
from claims.rules import HEADLINE_PROCESSES
from harness.contract.records import CaseRecord
from harness.contract.metrics import EXACT_COUNTS, TIMINGS
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.engine.models import materialize
from harness.instruments.load import BUSY_CORES
from harness.instruments.fake import new_fake_mode
from harness.analysis.comparison import Comparison, Timing, compare_records, compare_samples, compare_timings
from harness.analysis.comparison import side_by_side
from harness.analysis.process_stats import ONE_PROCESS_NOTE
from harness.analysis.fits import AffineFit, fit_cost, top_slope
from harness.instruments.timing import TimingResult

TIMING_METRICS = TIMINGS              # the metric catalog's measured times and rates
EXACT_METRICS = EXACT_COUNTS          # counts: an affine fit of them is exact within rounding

ProbeFn = Callable[[Context], Evidence]
T = TypeVar("T")

PROCESSES = HEADLINE_PROCESSES
"""Fresh worker processes a timing taken in a probe's own code runs in (:func:`in_processes`): the process is the
unit of replication (harness.analysis.process_stats), so a timing that decides a verdict has an interval over
processes — as a suite's cases do with ``processes`` in claims/reads.toml."""
PROBES: dict[str, tuple[ProbeFn, tuple[str, ...]]] = {}
PROBE_READS: dict[str, tuple[str, ...]] = {}
"""Per probe, what it reads ("suite NAME", "experiment MODULE"; "... (cuda)": only on a CUDA device), declared once
with the probe: the catalog's ``needs`` and the time estimate come from it, and a read it does not declare fails the
probe (:meth:`claims.evidence.Context.suite`)."""
READ_KINDS = ("suite", "experiment")
CPU = torch.device("cpu")             # where a probe builds the models it studies (harness.engine.models.materialize)


def probe(name: str, figures: tuple[str, ...], reads: tuple[str, ...] = ()) -> Callable[[ProbeFn], ProbeFn]:
    """Register ``fn`` as probe ``name``, producing ``figures`` from what it ``reads`` (suites by their ``name``,
    experiments by module: ``("suite heads", "experiment kv_heads", "suite claims_gpu_rate (cuda)")``; none: it
    computes everything itself)."""
    bad = [r for r in reads if r.split(" ", 1)[0] not in READ_KINDS or not read_name(r)]
    if bad:
        raise ValueError(f"probe {name!r}: reads {bad} are not 'suite NAME' or 'experiment MODULE'")

    def deco(fn: ProbeFn) -> ProbeFn:
        if name in PROBES:
            raise ValueError(f"probe {name!r} registered twice")
        PROBES[name] = (fn, figures)
        PROBE_READS[name] = tuple(reads)
        return fn
    return deco


def probe_modules() -> list[str]:
    """Every module of this package, found on disk: a probe is registered by being in one (no list is kept)."""
    return sorted(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if not m.ispkg)


def load_all() -> dict[str, tuple[ProbeFn, tuple[str, ...]]]:
    for m in probe_modules():
        importlib.import_module(m)
    return PROBES


# -- helpers over stored records ----------------------------------------------------------
def select(records: Sequence[CaseRecord], **conds: Any) -> list[CaseRecord]:
    """The ok records whose line/arch/workload/config values equal ``conds``."""
    return [r for r in records if r.ok and all(r.value(k) == v for k, v in conds.items())]


def exponent(records: Sequence[CaseRecord], x: str, metric: str, unit: str = "") -> Figure:
    """The exponent of ``metric`` vs ``x`` with its 95% interval, from the one fit every view reads
    (:func:`harness.analysis.fits.fit_cost`): where the data are affine with a floor (weights read once, a launch, a
    fixed allocation), the exponent of the cost above the floor, ``k`` of ``floor + slope·x^k`` (an exact count that
    is affine within rounding has k = 1 exactly); else the log-log exponent over the scaling regime (a floor of
    fixed per-call costs at small x is left out and named in the note)."""
    pts = [(float(r.value(x)), r.metric(metric)) for r in records if r.metric(metric) is not None]
    busy = busy_reason(records) if metric in TIMING_METRICS else ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    fit = fit_cost(xs, ys, exact=metric in EXACT_METRICS) if len(pts) >= 2 else None
    if isinstance(fit, AffineFit):
        where = f"{x} {fit.x_min:g}…{fit.x_max:g}, {fit.n} points"
        floor = f"floor {fit.base:.4g} + {fit.slope:.4g} per {x}"
        if fit.exact:
            return Figure(1.0, 1.0, 1.0, unit, f"exact count, affine within rounding over {where}: {floor}",
                          fit.n, busy=busy)
        if fit.power is not None:
            k = fit.power
            lo, hi = (None, None) if math.isnan(k.ci_low) else (k.ci_low, k.ci_high)
            return Figure(k.exponent, lo, hi, unit, f"fit floor + slope·{x}^k over {where} (the data have a floor: "
                                                    f"{fit.base:.4g})", k.n, busy=busy)
        return Figure(float("nan"), note=f"affine with a floor over {where} ({floor}): too few sizes for the "
                                         "exponent above the floor")
    if fit is None:
        return Figure(float("nan"), note=f"fewer than 2 points of {metric}")
    n = fit.fit.n
    floor = f"; {len(fit.floor)} smaller {x} below the regime (floor)" if fit.floor else ""
    lo, hi = (None, None) if math.isnan(fit.fit.ci_low) else (fit.fit.ci_low, fit.fit.ci_high)
    return Figure(fit.exponent, lo, hi, unit,
                  f"log-log fit of {metric} over {x} {fit.x_min:g}…{fit.x_max:g}, {n} points{floor}", n, busy=busy)


def local_slope(records: Sequence[CaseRecord], x: str, metric: str) -> Figure:
    """The log-log slope of ``metric`` between the two largest ``x`` (no interval: for exact, noise-free
    counts whose curve bends, where a fit's interval would measure the bend, not an uncertainty)."""
    pts = [(float(r.value(x)), r.metric(metric)) for r in records if r.metric(metric) is not None]
    slope = top_slope([p[0] for p in pts], [p[1] for p in pts])
    if slope is None:
        return Figure(float("nan"), note=f"fewer than 2 points of {metric}")
    a, b = sorted(p[0] for p in pts)[-2:]
    return Figure(slope, note=f"slope of {metric} between {x} {a:g} and {b:g}", n=2)


def one_dtype(rows: Sequence[CaseRecord]) -> list[CaseRecord]:
    """The rows of one dtype (a suite's [cuda] table may run several): fp32 when the run has it (the dtype of
    the CPU runs and of the documents' tables), else the first in name order."""
    dtypes = sorted({str(r.value("dtype")) for r in rows})
    keep = "fp32" if "fp32" in dtypes else (dtypes[0] if dtypes else None)
    return [r for r in rows if str(r.value("dtype")) == keep]


def at(records: Sequence[CaseRecord], metric: str, **conds: Any) -> float | None:
    hits = select(records, **conds)
    return hits[0].metric(metric) if hits else None


def ratio_figure(num: float | None, den: float | None, unit: str = "×", note: str = "") -> Figure:
    if num is None or den is None or den == 0:
        return Figure(float("nan"), unit=unit, note=note or "missing a case")
    return Figure(num / den, unit=unit, note=note)


def busy_reason(records: Sequence[CaseRecord | None]) -> str:
    """Why these cases' timings were taken on a busy machine (other processes above
    :data:`harness.instruments.load.BUSY_CORES`), or "" when none was."""
    busy = [r for r in records if r is not None and r.metric("load_busy")]
    if not busy:
        return ""
    loads = [r.metric("load_others_cores") for r in busy]
    threads = max(r.metric("threads") or 1.0 for r in busy)
    # several threads per case share a busy core at every barrier: a bias every process shares (README, "How a case is measured")
    hint = f"; {threads:g} threads per case: --threads 1 keeps the timing off the busy core" if threads > 1 else ""
    return (f"machine busy: other processes used up to {max(loads):.2f} cores while "
            f"{len(busy)} of the timed cases ran (limit {BUSY_CORES}){hint}")


def interleaved(a: CaseRecord, b: CaseRecord) -> bool:
    """Whether two stored cases were timed side by side in the same rounds (one run, one group)."""
    return side_by_side(a, b)


def comparison_figure(c: Comparison, note: str = "", busy: str = "") -> Figure:
    """A figure of the one comparison (:mod:`harness.analysis.comparison`), read as its ratio B/A: the ratio, its
    95 % interval, and in the note what the interval is over and the verdict by the equivalence rule."""
    over = {"processes": "interval over processes (two-level bootstrap)",
            "rounds": f"interval over the rounds; {ONE_PROCESS_NOTE}",
            "one process": f"interval from one run's samples; {ONE_PROCESS_NOTE}",
            "occasions": "interval over occasions", "exact": "exact"}[c.level]
    side = "timed side by side" if c.paired else "not timed side by side"
    n = c.n_a if c.level in ("processes", "rounds") else None
    processes = min(c.n_a, c.n_b) if c.level == "processes" else 1     # how many processes the interval covers
    text = f"{side} ({c.units_text}), {over}; {c.summary}"
    return Figure(c.ratio, c.ci_low, c.ci_high, "×", (note + "; " if note else "") + text, n, busy=busy,
                  processes=processes)


def median_ratio(a: CaseRecord | None, b: CaseRecord | None, note: str = "") -> Figure:
    """a's latency over b's: the one comparison (:func:`harness.analysis.comparison.compare_records`, b as the
    baseline), paired when the two were timed side by side (:func:`interleaved`); its level — processes,
    rounds or one process — is what the stored timings allow, and the note says which. Flagged ``busy`` when
    either case ran on a busy machine."""
    if not a or not b or not a.samples_s or not b.samples_s:
        return Figure(float("nan"), unit="×", note="missing a case")
    return comparison_figure(compare_records(b, a), note, busy_reason([a, b]))


def in_processes(fn: Callable[..., T], *args: Any, n: int = PROCESSES) -> list[T]:
    """``fn(*args)`` in ``n`` fresh spawned processes, one after another (two at once would share the cores), its
    results in order. ``fn`` and ``args`` must be picklable (a module-level function, plain data); an exception in a
    process is raised here."""
    spawn = multiprocessing.get_context("spawn")         # never fork: OpenMP state does not survive it
    out = []
    for _ in range(n):
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            out.append(pool.submit(fn, *args).result())
    return out


def _pooled(results: Sequence[TimingResult]) -> Timing:
    """One side's timing from one measurement per process: the samples and rounds of process 0, then 1, ..."""
    return Timing.of([s for r in results for s in r.samples_s], [k for r in results for k in r.rounds],
                     n_processes=len(results))


def timed_ratio(a: TimingResult | Sequence[TimingResult], b: TimingResult | Sequence[TimingResult],
                note: str = "", busy: str = "") -> Figure:
    """a over b for timings from :func:`harness.instruments.timing.measure_interleaved` (paired rounds): one call's
    pair, or one pair per fresh process (:func:`in_processes`; a[k] and b[k] from process k's call), whose interval
    is then over processes (the figure's ``processes`` says how many)."""
    a_s = [a] if isinstance(a, TimingResult) else list(a)
    b_s = [b] if isinstance(b, TimingResult) else list(b)
    if len(a_s) != len(b_s) or len({len(r.rounds) for r in (*a_s, *b_s)}) != 1:
        raise ValueError("timed_ratio needs the same number of processes a side, each with the same rounds")
    c = compare_timings(_pooled(b_s), _pooled(a_s), paired=True)
    return comparison_figure(c, note, busy)


def samples_ratio(a: Sequence[float], b: Sequence[float], note: str = "") -> Figure:
    """median(a)/median(b) of two series of per-call times (one process each), with its 95% interval."""
    return comparison_figure(compare_samples(b, a), note)


def series(records: Sequence[CaseRecord], x: str, metric: str, scale: float = 1.0
           ) -> dict[str, list[tuple[Any, float, None, None]]]:
    """Per line, (x, metric·scale) points of the ok records, for a chart."""
    out: dict[str, list[tuple[Any, float, None, None]]] = {}
    for r in records:
        y = r.metric(metric)
        if r.ok and y is not None:
            out.setdefault(r.line, []).append((r.value(x), y * scale, None, None))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def mean_chart(series: dict[str, dict[Any, list[float | None]]], title: str, x: str, y: str,
               x_log: bool = False, y_log: bool = False) -> Chart:
    """A chart of per-seed values: per line, per x, the mean with its 95% interval (x with no finite value
    left out)."""
    out = {}
    for name, by_x in series.items():
        pts = []
        for k, vals in sorted(by_x.items(), key=lambda kv: float(kv[0])):
            f = mean_ci(vals or [])
            if f.value == f.value:
                pts.append((float(k), f.value, f.lo, f.hi))
        out[name] = pts
    return Chart(title, x, y, out, x_log=x_log, y_log=y_log)


def built_params(preset: str, **overrides: Any) -> int:
    """A preset's parameter count, counted on the module built on fake tensors (no memory used): a
    measurement of the code, which the analytic cost formula is tested against."""
    model = materialize(resolve(preset, **overrides), Workload(), CPU, new_fake_mode())
    return sum(p.numel() for p in model.parameters())


def analytic_params(preset: str, **overrides: Any) -> int:
    """A preset's exact parameter count from its architecture's cost function (no model is built)."""
    spec = resolve(preset, **overrides)
    return int(spec.cost(spec.config, Workload(seq_len=1))["params"])
