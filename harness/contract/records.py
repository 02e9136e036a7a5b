"""What the results store holds, as typed frozen records: one :class:`CaseRecord` per measured case and
one :class:`RunRecord` per run. Torch-free (the reports and the claims read these without torch).

A record is what a row *means* at :data:`SCHEMA_VERSION`; rows written by an older ``bench`` reach this
shape through the migrations of :mod:`harness.store.migrations`, never by guessing at the call site.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 6
"""1: the store as first released (no version table). 2: runs carry the suite's text and resolved spec.
3: cases carry their timing rounds and interleave group. 4: cases carry the SDPA kernel (sdpa_backend).
5: run leases (one driver per run; harness.store.db). 6: runs carry the command and options that made them."""

Status = Literal["ok", "oom", "timeout", "error", "crashed", "skipped"]
STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "error", "crashed", "skipped")
"""``crashed``: the worker died during the case (a signal or an exit) with no recorded out-of-memory kill
(harness.executors.deaths); ``error``: the case raised; ``oom``: out of memory, on evidence."""
FAILED: frozenset[str] = frozenset({"error", "crashed"})
"""Statuses that make a run exit 1 and a check fail (an oom, a timeout or a skip is a result)."""

LABEL_KEYS = ("seq_len", "img_size", "batch_size", "dtype", "mode", "device", "compile", "prompt_len", "new_tokens")
"""Workload fields a case is labelled by (the others, e.g. threads, are the same across a run)."""
OMITTED_DEFAULTS: dict[str, Any] = {"compile": "none", "prompt_len": None, "new_tokens": None, "optimizer": "adamw",
                                    "amp": "none", "checkpointing": "none", "world_size": 1, "parallel": "none"}
"""Workload fields a record leaves out while at their default (harness.contract.spec.OMITTED_WHEN_DEFAULT), with it."""


@dataclass(frozen=True)
class CaseRecord:
    """The outcome of one case: its identity, status, the resolved config and workload, every metric
    (units in the names: ``median_ms``, ``macs``, ``peak_bytes``, ...) and the raw timing samples."""

    case_key: str
    suite: str
    line: str
    arch: str
    status: Status
    message: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)
    workload: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    samples_s: tuple[float, ...] = ()
    duration_s: float = 0.0
    run_id: str = ""                        # "" until stored
    finished_at: str = ""
    rounds: tuple[int, ...] = ()            # samples per timing round, consecutive in samples_s (() before schema 3)
    group: str = ""                         # cases of one run with the same group were timed interleaved, round i
                                            # of each side by side (harness.analysis.ratios.paired_ratio); "" = timed alone
    sdpa_backend: str = ""                  # the SDPA kernel(s) a real call ran (harness.instruments.kernels.probe), e.g.
                                            # "flash", "efficient+math"; "" = no SDPA call (schema 4)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metric(self, name: str) -> float | None:
        """A metric as a finite float, or None when it is absent or not a finite number."""
        v = self.metrics.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)

    def value(self, key: str) -> Any:
        """The case's value of ``key``: ``line``/``arch``, a workload field, else a config field (None if none)."""
        if key in ("line", "arch"):
            return getattr(self, key)
        if key in self.workload:
            return self.workload[key]
        if key in OMITTED_DEFAULTS:
            return OMITTED_DEFAULTS[key]
        return self.config.get(key)

    def params(self, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """Readable identity: ``arch`` and the label workload fields, plus ``keys`` (config fields)."""
        out: dict[str, Any] = {"arch": self.arch}
        out.update({k: self.workload[k] for k in LABEL_KEYS if self.workload.get(k) is not None})
        out.update({k: self.value(k) for k in keys})
        return out


@dataclass(frozen=True)
class SuiteSpec:
    """The suite as it was run, stored with the run so a report never re-reads the file: its description,
    the metrics, ``fixed``, ``sweep`` and ``lines`` after ``--quick`` and ``--set`` were applied, ``plot``, and
    ``reference``: the line the others are compared with, where the suite names one ("": the first line)."""

    description: str = ""
    metrics: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    sweep: Mapping[str, list[Any]] = field(default_factory=dict)
    lines: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    plot: Mapping[str, Any] = field(default_factory=dict)
    reference: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "metrics": list(self.metrics), "fixed": dict(self.fixed),
                "sweep": {k: list(v) for k, v in self.sweep.items()},
                "lines": {k: dict(v) for k, v in self.lines.items()}, "plot": dict(self.plot),
                **({"reference": self.reference} if self.reference else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SuiteSpec:
        d = d or {}
        return cls(description=d.get("description", ""), metrics=tuple(d.get("metrics", ())),
                   fixed=dict(d.get("fixed", {})), sweep=dict(d.get("sweep", {})), lines=dict(d.get("lines", {})),
                   plot=dict(d.get("plot", {})), reference=str(d.get("reference") or ""))


LATER_HARD_KEYS = ("cpu_id",)
"""Hard fingerprint keys added after runs were first stored: a run recorded without one is not known to differ
there (it is compared on the keys it has; a history marks its CPU identity as unknown)."""


def hard_differences(hard_a: Mapping[str, Any], hard_b: Mapping[str, Any]) -> list[str]:
    """The hard fingerprint keys whose values differ between two environments (sorted); a key of
    :data:`LATER_HARD_KEYS` that one side lacks is not counted."""
    return sorted(k for k in hard_a.keys() | hard_b.keys() if hard_a.get(k) != hard_b.get(k)
                  and not (k in LATER_HARD_KEYS and (k not in hard_a or k not in hard_b)))


@dataclass(frozen=True)
class RunRecord:
    """One run of a suite: where and how it was measured (``env``: hard keys decide comparability, soft
    fields are context), its options (``peak``: the calibrated machine peak), and the suite as run."""

    id: str
    suite: str
    quick: bool
    status: str                              # running | done | interrupted
    n_cases: int
    started_at: str
    env: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    suite_path: str = ""
    finished_at: str = ""
    stored: int = 0                          # cases stored so far
    suite_text: str | None = None            # the suite file's text (None: written before schema 2)
    spec: SuiteSpec | None = None            # the suite as run (None: written before schema 2)
    invocation: Mapping[str, Any] = field(default_factory=dict)
    """How the run was made, as data: ``command`` (``bench run``), ``options`` (every option's value as parsed,
    passwords hidden) and ``resolved`` (what the command chose from them, e.g. the executor); ``{}`` for runs
    written before schema 6, or by a caller that said nothing (a claim's probe, the pytest plug-in)."""

    @property
    def peak(self) -> dict[str, Any]:
        """The calibrated peak per device (``{}`` for runs stored without one, or ``--no-calibrate``)."""
        return dict(self.options.get("peak") or {})

    @property
    def hard_env(self) -> dict[str, Any]:
        return dict(self.env.get("hard") or {})

    @property
    def commit(self) -> str:
        return str((self.env.get("soft") or {}).get("commit") or "")

    @property
    def description(self) -> str:
        return self.spec.description if self.spec else ""

    @property
    def plot(self) -> dict[str, Any]:
        return dict(self.spec.plot) if self.spec else {}
