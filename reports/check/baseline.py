"""The baseline file: a measured run written as a JSON document (:func:`write_baseline`) and read back,
validated, as a :class:`Baseline` (:func:`load_baseline`); bad input is one line (BenchInputError, ``--baseline``)."""
from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.contract.errors import BenchInputError
from harness.analysis.process_stats import process_groups
from harness.contract.records import STATUSES, CaseRecord, RunRecord
from reports.check.metrics import finite, metric_split
from reports.check.timing import round_cv

BASELINE_FORMAT = 1
"""The version of the baseline document :func:`baseline_document` writes and :func:`load_baseline` reads."""


@dataclass(frozen=True)
class BaselineTiming:
    median_ms: float
    round_cv: float | None
    samples_s: tuple[float, ...]
    rounds: tuple[int, ...]
    n_processes: int = 1            # worker processes; their rounds consecutive (a file without the field: 1)
    occasion_medians_ms: tuple[tuple[float, ...], ...] = ()   # per occasion its per-process medians (>= 2 occasions)

    @property
    def n_occasions(self) -> int:
        """The occasions the timing was measured on (1 unless ``--occasions`` / ``--append`` made more)."""
        return max(1, len(self.occasion_medians_ms))


@dataclass(frozen=True)
class BaselineCase:
    case_key: str
    line: str
    arch: str
    status: str
    workload: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    deterministic: Mapping[str, float] = field(default_factory=dict)
    tolerant: Mapping[str, float] = field(default_factory=dict)
    timing: BaselineTiming | None = None

    def record(self, suite: str = "") -> CaseRecord:
        """The case as a :class:`CaseRecord` (its metrics: the stored deterministic and tolerant ones)."""
        t = self.timing
        return CaseRecord(case_key=self.case_key, suite=suite, line=self.line, arch=self.arch,
                          status=self.status, config=dict(self.config), workload=dict(self.workload),
                          metrics={**self.deterministic, **self.tolerant,
                                   **({"n_processes": float(t.n_processes)} if t else {})},
                          samples_s=t.samples_s if t else (), rounds=t.rounds if t else ())


@dataclass(frozen=True)
class Baseline:
    """A loaded baseline document (see :func:`baseline_document`)."""

    format: int
    suite: str
    quick: bool
    created: str
    env: Mapping[str, Any]
    cases: tuple[BaselineCase, ...]
    run_id: str = ""
    commit: str = ""
    path: str = ""


def process_medians_ms(r: CaseRecord) -> list[float]:
    """A record's per-process medians in ms (one value for a timing measured in one process; [] without samples)."""
    if not r.samples_s:
        return []
    rounds = list(r.rounds) if r.rounds and sum(r.rounds) == len(r.samples_s) else []
    groups = process_groups(r.samples_s, rounds, int(r.metric("n_processes") or 1))
    return [float(np.median(g)) * 1e3 for g in groups] if groups else [float(np.median(r.samples_s)) * 1e3]


def _timing_doc(r: CaseRecord, occasions: Sequence[Sequence[float]] = ()) -> dict[str, Any] | None:
    if not r.samples_s:
        return None
    rounds = list(r.rounds) if r.rounds and sum(r.rounds) == len(r.samples_s) else []
    n_proc = int(r.metric("n_processes") or 1)
    groups = process_groups(r.samples_s, rounds, n_proc)
    doc = {"median_ms": float(np.median(r.samples_s)) * 1e3, "round_cv": round_cv(r.samples_s, rounds),
           "samples_s": [float(s) for s in r.samples_s], "rounds": rounds}
    if groups:                          # one process: the document keeps its single-process form
        doc["n_processes"] = n_proc
        doc["process_medians_ms"] = [float(np.median(g)) * 1e3 for g in groups]
        doc["n_rounds"], doc["n_samples"] = len(rounds), len(r.samples_s)
    if len(occasions) >= 2:             # the raw samples are the first occasion's; the medians, every occasion's
        doc["n_occasions"] = len(occasions)
        doc["occasion_medians_ms"] = [[float(m) for m in o] for o in occasions]
    return doc


def baseline_document(run: RunRecord, records: Sequence[CaseRecord],
                      occasions: Mapping[str, Sequence[Sequence[float]]] | None = None) -> dict[str, Any]:
    """The baseline of a measured run as a JSON-able dict: ``format``, ``suite``, ``quick``, ``created``, ``run_id``,
    ``commit``, ``env`` (the run's fingerprint) and ``cases``, one per record: identity, status, workload, config,
    the ``deterministic`` and ``tolerant`` metrics it has, and its ``timing`` (median_ms, round_cv, the raw
    samples_s and rounds; null without samples). ``occasions``: per case key, each occasion's per-process medians
    (ms) when the suite was measured on two occasions or more (``records`` is the first occasion's run); stored
    as ``timing.occasion_medians_ms`` and ``n_occasions``."""
    cases = []
    for r in records:
        det, tol = metric_split(r)
        cases.append({"case_key": r.case_key, "line": r.line, "arch": r.arch, "status": r.status,
                      "workload": dict(r.workload), "config": dict(r.config), "deterministic": det,
                      "tolerant": tol, "timing": _timing_doc(r, (occasions or {}).get(r.case_key, ()))})
    return {"format": BASELINE_FORMAT, "suite": run.suite, "quick": bool(run.quick),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "run_id": run.id,
            "commit": run.commit, "env": dict(run.env), "cases": cases}


def write_baseline(path: str | Path, run: RunRecord, records: Sequence[CaseRecord],
                   occasions: Mapping[str, Sequence[Sequence[float]]] | None = None) -> None:
    """Write :func:`baseline_document` to ``path`` as JSON; a path that cannot be written raises BenchInputError."""
    write_document(path, baseline_document(run, records, occasions))


def write_document(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Write a baseline document as JSON (to a temporary file, then renamed: an existing baseline is never left
    half-written); a path that cannot be written raises BenchInputError."""
    text = json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n"
    tmp = Path(f"{path}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BenchInputError(f"cannot write {path}: {exc.strerror or exc}", where="--output") from None


def _occasions_of(timing: Mapping[str, Any] | None) -> list[list[float]]:
    """A timing document's occasions (each its per-process medians, ms): ``occasion_medians_ms``, else its one
    occasion's process medians, else its samples' median."""
    if not timing:
        return []
    if timing.get("occasion_medians_ms"):
        return [list(o) for o in timing["occasion_medians_ms"]]
    if timing.get("process_medians_ms"):
        return [list(timing["process_medians_ms"])]
    return [[float(np.median(timing["samples_s"])) * 1e3]]


def append_occasions(old: Mapping[str, Any], new: Mapping[str, Any], path: str = "the baseline") -> dict[str, Any]:
    """``old`` (a baseline document, already valid) with the occasions of ``new`` (one measured now, same suite)
    added to each case's ``occasion_medians_ms``: ``bench baseline --append``. The first occasion's raw samples,
    run id and commit stay; ``appended`` lists each later run. Raises BenchInputError (``--append``) when the two
    are not the same measurement: another suite or size, other cases, another hard environment, or a
    deterministic metric that moved (the code changed: write a new baseline)."""
    def refuse(msg: str) -> BenchInputError:
        return BenchInputError(f"cannot append to {path}: {msg}", where="--append")
    if old.get("suite") != new.get("suite") or bool(old.get("quick")) != bool(new.get("quick")):
        raise refuse(f"it is a baseline of {old.get('suite')!r} (quick={bool(old.get('quick'))}), this run of "
                     f"{new.get('suite')!r} (quick={bool(new.get('quick'))})")
    hard_old, hard_new = (old.get("env") or {}).get("hard") or {}, (new.get("env") or {}).get("hard") or {}
    moved = sorted(k for k in set(hard_old) | set(hard_new) if hard_old.get(k) != hard_new.get(k))
    if moved:
        raise refuse(f"another environment ({', '.join(moved)}): a baseline's occasions share one machine and stack")
    old_cases, new_cases = {c["case_key"]: c for c in old["cases"]}, {c["case_key"]: c for c in new["cases"]}
    if set(old_cases) != set(new_cases):
        diff = sorted(set(old_cases) ^ set(new_cases))
        raise refuse(f"the cases differ ({len(diff)}: {', '.join(diff[:3])}{' …' if len(diff) > 3 else ''})")
    cases = []
    for key, c in old_cases.items():
        n = new_cases[key]
        for name, v in (c.get("deterministic") or {}).items():
            if (n.get("deterministic") or {}).get(name) != v:
                raise refuse(f"case {key}: {name} {v} → {(n.get('deterministic') or {}).get(name)} (the code changed: "
                             "write a new baseline)")
        c = dict(c)
        if c.get("timing") and n.get("timing") and c.get("status") == "ok" and n.get("status") == "ok":
            occ = _occasions_of(c["timing"]) + _occasions_of(n["timing"])
            c["timing"] = {**c["timing"], "n_occasions": len(occ), "occasion_medians_ms": occ}
        cases.append(c)
    appended = list(old.get("appended") or []) + [{k: new.get(k) for k in ("created", "run_id", "commit")}]
    return {**old, "cases": cases, "appended": appended}


class _Invalid(Exception):
    pass


def _need(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in d:
        raise _Invalid(f"{what} has no {key!r}")
    v = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        raise _Invalid(f"{what}: {key!r} is not {_kind_name(kind)}")
    return v


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", bool: "true/false", int: "an integer",
             float: "a number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _numbers(d: Any, what: str) -> dict[str, float]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and finite(v) for k, v in d.items()):
        raise _Invalid(f"{what} is not an object of finite numbers")
    return {k: float(v) for k, v in d.items()}


def _parse_case(i: int, c: Any) -> BaselineCase:
    what = f"case #{i + 1}"
    if not isinstance(c, dict):
        raise _Invalid(f"{what} is not an object")
    key = _need(c, "case_key", str, what)
    what = f"case {key}"
    status = _need(c, "status", str, what)
    if status not in STATUSES:
        raise _Invalid(f"{what}: unknown status {status!r}")
    timing = None
    t = c.get("timing")
    if t is not None:
        if not isinstance(t, dict):
            raise _Invalid(f"{what}: 'timing' is not an object")
        samples = t.get("samples_s")
        if not isinstance(samples, list) or not samples or not all(finite(s) and s > 0 for s in samples):
            raise _Invalid(f"{what}: timing 'samples_s' is not a list of positive numbers")
        rounds = t.get("rounds") or []
        if not isinstance(rounds, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                   for n in rounds):
            raise _Invalid(f"{what}: timing 'rounds' is not a list of counts")
        if rounds and sum(rounds) != len(samples):
            raise _Invalid(f"{what}: timing rounds hold {sum(rounds)} samples, samples_s has {len(samples)}")
        cv = t.get("round_cv")
        n_proc = t.get("n_processes", 1)
        if not isinstance(n_proc, int) or isinstance(n_proc, bool) or n_proc < 1:
            raise _Invalid(f"{what}: timing 'n_processes' is not a positive count")
        if n_proc > 1 and process_groups(samples, rounds, n_proc) is None:
            raise _Invalid(f"{what}: timing rounds ({len(rounds)}) do not split into {n_proc} processes")
        occ = t.get("occasion_medians_ms") or []
        if not isinstance(occ, list) or not all(isinstance(o, list) and o and all(finite(m) and m > 0 for m in o)
                                                for o in occ):
            raise _Invalid(f"{what}: timing 'occasion_medians_ms' is not a list of lists of positive numbers")
        timing = BaselineTiming(median_ms=float(np.median(samples)) * 1e3,
                                round_cv=float(cv) if finite(cv) else None,
                                samples_s=tuple(float(s) for s in samples), rounds=tuple(rounds), n_processes=n_proc,
                                occasion_medians_ms=tuple(tuple(float(m) for m in o) for o in occ)
                                if len(occ) >= 2 else ())
    return BaselineCase(case_key=key, line=_need(c, "line", str, what), arch=_need(c, "arch", str, what),
                        status=status, workload=dict(_need(c, "workload", dict, what)),
                        config=dict(_need(c, "config", dict, what)),
                        deterministic=_numbers(c.get("deterministic", {}), f"{what}: 'deterministic'"),
                        tolerant=_numbers(c.get("tolerant", {}), f"{what}: 'tolerant'"), timing=timing)


def parse_baseline(doc: Any, path: str = "") -> Baseline:
    """A baseline from its JSON document; raises BenchInputError (``where="--baseline"``) if it is not one."""
    name = path or "the baseline"
    try:
        if not isinstance(doc, dict) or "format" not in doc:
            raise _Invalid("is not a bench baseline (a JSON object with a 'format' key; `bench baseline` writes one)")
        if doc["format"] != BASELINE_FORMAT:
            raise _Invalid(f"has baseline format {doc['format']!r}; this bench reads format {BASELINE_FORMAT}")
        suite = _need(doc, "suite", str, "the document")
        env = _need(doc, "env", dict, "the document")
        raw = _need(doc, "cases", list, "the document")
        cases = tuple(_parse_case(i, c) for i, c in enumerate(raw))
        seen: set[str] = set()
        for c in cases:
            if c.case_key in seen:
                raise _Invalid(f"holds case {c.case_key} twice")
            seen.add(c.case_key)
    except _Invalid as exc:
        text = str(exc)
        raise BenchInputError(f"{name} {text}" if text.startswith(("is ", "has ", "holds ")) else f"{name}: {text}",
                              where="--baseline") from None
    return Baseline(format=BASELINE_FORMAT, suite=suite, quick=bool(doc.get("quick", False)),
                    created=str(doc.get("created", "")), env=env, cases=cases, run_id=str(doc.get("run_id") or ""),
                    commit=str(doc.get("commit") or ""), path=path)


def load_baseline(path: str | Path) -> Baseline:
    """Read a baseline file written by :func:`write_baseline`. A missing, unreadable or invalid file raises
    :class:`~harness.contract.errors.BenchInputError` (``where="--baseline"``) with one line saying why."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"cannot read {path}: {exc.strerror or exc}", where="--baseline") from None
    except UnicodeDecodeError:
        raise BenchInputError(f"{path} is not a bench baseline (not UTF-8 text)", where="--baseline") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchInputError(f"{path} is not a bench baseline (not JSON: {exc.msg} at line {exc.lineno})",
                              where="--baseline") from None
    return parse_baseline(doc, str(path))
