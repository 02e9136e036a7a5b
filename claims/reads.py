"""What the claims' rules read of each suite (``claims/reads.toml``): the cases `bench claims` measures and the
runs it calibrates. A case no rule of any claim reads is not measured; a peak no rule reads is not calibrated."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from harness.contract.errors import BenchInputError
from harness.contract.spec import WORKLOAD_KEYS, Case

READS = Path(__file__).with_name("reads.toml")
KEYS = {"lines", "drop", "peak", "processes", "processes_for", "why"}


@dataclass(frozen=True)
class Reads:
    """The part of one suite that rules read: ``lines`` (None: all), ``drop`` (cases matching any of these
    tables are left out), ``peak`` (a rule reads the run's calibrated peak), ``processes`` (a deciding timing rule
    needs its cases measured in at least this many fresh worker processes), ``processes_for`` (only the cases
    matching one of these tables need them; empty: every case) and ``why`` (which rules read what)."""

    lines: tuple[str, ...] | None = None
    drop: tuple[tuple[tuple[str, Any], ...], ...] = ()
    peak: bool = False
    why: str = ""
    processes: int = 1
    processes_for: tuple[tuple[tuple[str, Any], ...], ...] = ()

    def keeps(self, case: Case) -> bool:
        """Whether some rule reads ``case`` (its line is kept and no ``drop`` table matches it)."""
        if self.lines is not None and not any(_is_line(case, label) for label in self.lines):
            return False
        return not any(_matches(case, match) for match in self.drop)

    def over_processes(self, case: Case) -> bool:
        """Whether a deciding timing rule reads ``case``: it is measured in :attr:`processes` worker processes (the
        others in as many as the run asks for everyone)."""
        return not self.processes_for or any(_matches(case, match) for match in self.processes_for)


def _matches(case: Case, match: tuple[tuple[str, Any], ...]) -> bool:
    """``case`` has every value of ``match`` (``line``: its line label; any other key a workload or config value)."""
    return all(_value(case, k) == v if k != "line" else _is_line(case, v) for k, v in match)


def _is_line(case: Case, label: str) -> bool:
    """``case`` belongs to line ``label`` (also as a [cuda] table's dtype copy, labelled "LABEL DTYPE")."""
    return case.line == label or case.line == f"{label} {case.workload.dtype}"


def _value(case: Case, key: str) -> Any:
    if key in WORKLOAD_KEYS:
        return getattr(case.workload, key)
    return dict(case.overrides).get(key)


def parse(data: dict[str, Any], where: str = "claims/reads.toml") -> dict[str, Reads]:
    """Validate the file's tables (suite name -> Reads); a malformed one is a BenchInputError naming it."""
    out = {}
    for suite, raw in data.items():
        if not isinstance(raw, dict):
            raise BenchInputError("must be a table", where=f"{where}: {suite}")
        unknown = set(raw) - KEYS
        if unknown:
            raise BenchInputError(f"unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(KEYS))}",
                                  where=f"{where}: {suite}")
        if not str(raw.get("why") or "").strip():
            raise BenchInputError("needs a `why`: which rules read what is kept", where=f"{where}: {suite}")
        lines = raw.get("lines")
        if lines is not None and (not isinstance(lines, list) or not lines
                                  or not all(isinstance(x, str) for x in lines)):
            raise BenchInputError("lines must be a non-empty list of line labels", where=f"{where}: {suite}.lines")
        drop = raw.get("drop", [])
        if not isinstance(drop, list) or not all(isinstance(d, dict) and d for d in drop):
            raise BenchInputError("drop must be a list of non-empty tables", where=f"{where}: {suite}.drop")
        processes = raw.get("processes", 1)
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise BenchInputError("processes must be a whole number ≥ 1", where=f"{where}: {suite}.processes")
        only = raw.get("processes_for", [])
        if not isinstance(only, list) or not all(isinstance(d, dict) and d for d in only) or (only and processes < 2):
            raise BenchInputError("processes_for must be a list of non-empty tables, beside processes ≥ 2",
                                  where=f"{where}: {suite}.processes_for")
        out[suite] = Reads(tuple(lines) if lines is not None else None,
                           tuple(tuple(sorted(d.items())) for d in drop), bool(raw.get("peak", False)), raw["why"],
                           processes, tuple(tuple(sorted(d.items())) for d in only))
    return out


@cache
def load_reads(path: Path = READS) -> dict[str, Reads]:
    """The reads of every listed suite (cached: the file is data of this checkout)."""
    try:
        return parse(tomllib.loads(path.read_text(encoding="utf-8")), str(path.name))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BenchInputError(f"cannot read {path}: {exc}", where="claims") from None


def reads_of(suite: str) -> Reads:
    """What rules read of ``suite`` (a suite not listed: every case, no peak)."""
    return load_reads().get(suite, Reads())
