"""Readable names of cases: a case is shown by its line and the parameters that set it apart
(``sdpa MHA fwd · seq_len=4096``), never by its case-key hash."""
from __future__ import annotations

from collections.abc import Sequence

from harness.records import CaseRecord
from reports.frames import varying_keys


def param_columns(records: Sequence[CaseRecord], axis: str | None = None) -> list[str]:
    """The parameters that vary in the run (``varying_keys``), the sweep axis first."""
    keys = varying_keys(records)
    return ([axis] if axis in keys else []) + [k for k in keys if k != axis]


def case_labels(records: Sequence[CaseRecord], axis: str | None = None) -> list[str]:
    """One label per record: its line, then ``key=value`` for each parameter that varies within that line
    (the axis first; ``arch`` too where a line holds several architectures). Unique within a run."""
    keys = param_columns(records, axis)
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    within = {line: (["arch"] if len({r.arch for r in recs}) > 1 else [])
              + [k for k in keys if len({repr(r.value(k)) for r in recs}) > 1]
              for line, recs in by_line.items()}
    return [" · ".join([r.line, *(f"{k}={r.value(k)}" for k in within[r.line])]) for r in records]
