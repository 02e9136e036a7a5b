"""The claim data model: a figure with its uncertainty, a decision rule, a claim, a verdict."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scipy import stats


VerdictKind = Literal["supported", "partly supported", "contradicted", "inconclusive"]
RuleStatus = Literal["pass", "fail", "unsure", "unavailable"]

# Where a figure comes from (Figure.provenance):
#   measured    timed, trained or observed in a run of the code here
#   counted     counted on the modules here (MACs, parameters, bytes): exact, not noisy
#   derived     computed by a stated formula from figures measured or counted here (a fit, an extrapolation)
#   quoted      a PUBLISHED number, or arithmetic that rests on one (needs its source in Figure.quoted)
#   structural  read off a declared configuration or true by construction (a preset's width, a shape)
PROVENANCES = ("measured", "counted", "derived", "quoted", "structural")
HERE = ("measured", "counted", "derived")          # evidence this run produced: only these can decide a
                                                   # measured claim's central rule or make it "supported"


@dataclass(frozen=True)
class Figure:
    """One measured number: ``value`` with an optional 95% interval [lo, hi], its unit and how it was got."""

    value: float
    lo: float | None = None
    hi: float | None = None
    unit: str = ""
    note: str = ""
    n: int | None = None                   # samples behind the interval (seeds, points of a fit)
    busy: str = ""                         # why a timing was measured on a busy machine ("" when it was not)
    mode: str = ""                         # how the models executed ("" = eager; e.g. "compiled (default)")
    quoted: str = ""                       # the source, when the figure is (or rests on) a PUBLISHED number, not
                                           # measured here: shown "(quoted)", and a verdict deciding on it says so
    processes: int = 0                     # a timing: how many worker processes its interval covers (1: the rounds
                                           # of one process); 0: not a timing, or not said
    provenance: str = ""                   # one of PROVENANCES; "" = "quoted" when ``quoted`` names a source,
                                           # else "measured" (see :attr:`kind`)

    def __post_init__(self) -> None:
        if self.provenance and self.provenance not in PROVENANCES:
            raise ValueError(f"provenance {self.provenance!r} is not one of {', '.join(PROVENANCES)}")
        if self.provenance == "quoted" and not self.quoted:
            raise ValueError("a quoted figure needs its source (Figure.quoted)")
        if self.quoted and self.provenance and self.provenance != "quoted":
            raise ValueError(f"a figure resting on a published number ({self.quoted}) is quoted, "
                             f"not {self.provenance}")

    @property
    def kind(self) -> str:
        """Its provenance: the declared one, else "quoted" when it names a published source, else "measured"."""
        return self.provenance or ("quoted" if self.quoted else "measured")

    @property
    def here(self) -> bool:
        """Whether this run produced it (measured, counted or derived from those), not a quote or a structure."""
        return self.kind in HERE

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None and not math.isnan(self.lo) and not math.isnan(self.hi)

    def bounds(self) -> tuple[float, float]:
        """[lo, hi] when known (an unbounded side is ±inf: a rule on it cannot pass), else the point itself."""
        return (self.lo, self.hi) if self.has_interval else (self.value, self.value)  # type: ignore[return-value]

    def text(self) -> str:
        def f(x: float) -> str:
            if isinstance(x, bool):
                return "yes" if x else "no"
            if x == 0 or 1e-3 <= abs(x) < 1e5:
                return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"
            return f"{x:.3g}"
        if isinstance(self.value, bool) and self.has_interval:
            # a yes/no read at both ends of an interval (no "[...]": a terminal's markup would eat "[yes, no]")
            ends = (bool(self.lo), bool(self.hi))
            body = f(self.value) + ("" if ends == (self.value, self.value)
                                    else f" (at the interval's ends: {f(ends[0])}, {f(ends[1])})")
            return body + (f" {self.unit}" if self.unit else "") + self._tag()
        body = f(self.value) + (f" [{f(self.lo)}, {f(self.hi)}]" if self.has_interval else "")
        return body + (f" {self.unit}" if self.unit else "") + self._tag()

    def _tag(self) -> str:
        return "" if self.here else f" ({self.kind})"

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "unit": self.unit, "note": self.note,
                "n": self.n, "text": self.text(), "busy": self.busy, "mode": self.mode,
                "quoted": self.quoted, "provenance": self.kind, "processes": self.processes}


def mean_ci(values: Sequence[float], unit: str = "", note: str = "", confidence: float = 0.95) -> Figure:
    """Mean of per-seed ``values`` with a Student-t interval (a point when there is one value)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return Figure(float("nan"), unit=unit, note=note or "no finite values", n=0)
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return Figure(m, unit=unit, note=note, n=1)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    half = stats.t.ppf(0.5 + confidence / 2, len(xs) - 1) * sd / math.sqrt(len(xs))
    return Figure(m, m - half, m + half, unit, note, len(xs))


@dataclass(frozen=True)
class Rule:
    """A predicate over one figure: ``test`` (within / at_least / at_most / equals / is_true) with its bounds."""

    figure: str
    test: str
    says: str                              # the claim's side of this rule, in words
    lo: float | None = None
    hi: float | None = None
    value: float | None = None
    rel_tol: float = 0.0
    central: bool = False                  # the claim's headline: it alone can contradict the claim
    device: str = ""                       # "cuda" / "cpu": only a run on that device decides it ("" = any)
    power: str = ""                        # a figure: the smallest effect this test could have detected, in the
                                           # rule's units, 0 = no effect ("" = not stated): see claims.rules.powered
    processes: int = 0                     # a timing rule that decides only over an interval covering at least this
                                           # many worker processes (claims/reads.toml measures its suite so)
    context: bool = False                  # shown beside the verdict, never deciding it (e.g. a published figure
                                           # at a scale nothing here measures)


@dataclass(frozen=True)
class Published:
    label: str                             # who published it, where
    value: str                             # as published, units as they wrote them


@dataclass(frozen=True)
class Claim:
    """One claim of the documents, declared in claims.toml."""

    id: str
    title: str
    quote: str                             # the document's words
    where: str                             # which document and part
    section: str
    probe: str                             # the evidence function that turns runs/experiments into figures ("":
                                           # its figures are declared as data, ``declared``, over ``suite``)
    rules: tuple[Rule, ...]
    document_figure: str = ""              # the number the document gives, if any
    published: tuple[Published, ...] = ()
    units: str = ""                        # where the document mixes units, what we measured instead
    needs: tuple[str, ...] = ()            # suites / experiments it draws on: what its probe declares it reads
    added: bool = False                    # found in the documents by us, not listed in CLAIMS.md
    own_question: str = ""                 # not a sentence of the documents: the project's own question, and
                                           # where it comes from (the literature it is drawn from)
    evidence: str = "measured"             # "measured": its central rule must read a figure this run produced;
                                           # "quoted": out of reach here (e.g. a published training run), its
                                           # central rule may read quoted figures — and it can never read supported
    suite: str = ""                        # with ``declared``: the one suite run its declared figures read
    declared: tuple[Any, ...] = ()         # claims.figures.FigureSpec: figures declared as data (no probe)
    chart: Any = None                      # claims.figures.ChartSpec of a claim with declared figures, or None

    @property
    def source(self) -> str:
        """What produces its figures, as run once and timed: its probe, or the claim itself (declared figures)."""
        return self.probe or self.id


@dataclass(frozen=True)
class Outcome:
    """One rule decided (or not) on one device; after a merge of two devices' verdicts, ``others`` holds the
    same rule as the other device decided it, and ``conflict`` says the two disagreed (pass against fail)."""

    rule: Rule
    status: RuleStatus
    detail: str                            # e.g. "1.93 [1.88, 1.98] within [1.6, 2.2]"
    figure: Figure | None = None
    device: str = ""                       # where it was decided ("" when it was not: unavailable)
    mode: str = ""                         # how the models executed for its figure ("eager", "compiled (default)")
    others: tuple["Outcome", ...] = ()     # the same rule decided on another device (a merge keeps them)
    conflict: bool = False                 # devices disagree on it: shown, never resolved silently
    power: Figure | None = None            # the smallest effect the test could have detected (Rule.power's figure)
    unpowered: str = ""                    # why a failing test could not have seen the claimed effect ("" = it could)


def quoted_part(outcomes: Sequence[Outcome]) -> str:
    """The part of a verdict's reason naming the decided rules whose figure is QUOTED (published, not measured
    here) with their sources; "" when none is."""
    by_source: dict[str, list[str]] = {}
    for o in outcomes:
        if o.status != "unavailable" and o.figure is not None and o.figure.quoted:
            by_source.setdefault(o.figure.quoted, []).append(o.rule.figure)
    rests = [f"{', '.join(dict.fromkeys(figs))} ({src})" for src, figs in by_source.items()]
    return ("rests on QUOTED figures (published, not measured here): " + "; ".join(rests)) if rests else ""


@dataclass
class Evidence:
    """What a probe returns: named figures, reasons for the ones it could not measure, a chart, notes."""

    figures: dict[str, Figure] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    chart: "Chart | None" = None
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)   # run ids / experiment keys it used
    failed: str = ""                                    # the error, when the probe crashed


@dataclass
class Chart:
    """Data for one claim's plot: series of (x, y, lo, hi) points, drawn by one renderer."""

    title: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[Any, float, float | None, float | None]]]
    x_log: bool = False
    y_log: bool = False
    kind: Literal["line", "bar"] = "line"
    hlines: dict[str, float] = field(default_factory=dict)


@dataclass
class Verdict:
    claim: Claim
    verdict: VerdictKind
    reason: str
    outcomes: list[Outcome]
    evidence: Evidence
    device: str = "cpu"                    # where the rules were decided ("cpu + cuda" after a merge)
    mode: str = "eager"                    # how the models executed for the decided rules ("eager, compiled (default)")
    provenance: list[dict[str, Any]] = field(default_factory=list)   # per source: commit, torch, device
