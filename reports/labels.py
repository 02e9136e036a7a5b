"""Readable names of cases, one scheme for every view: a case is shown by its line and the parameters that set it
apart within that line (``sdpa MHA fwd · seq_len=4096``), never by its case-key hash.

* :func:`case_labels`: ``line · key=value ...`` (the report's tables and figures, the roofline, the training view);
* :func:`param_labels`: the same without the line, for a view that shows the line in a column of its own (the
  regression gate's table, ``bench compare --interleave``); ``arch=True`` always names the architecture;
* :func:`case_params`: a case's identity as named values (``arch`` and the label workload fields, plus the
  fields varying within its line), for a machine-read export (pytest-benchmark's ``params``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.contract.records import LABEL_KEYS, CaseRecord
from reports.frames import varying_keys


def param_columns(records: Sequence[CaseRecord], axis: str | None = None) -> list[str]:
    """The parameters that vary in the run (``varying_keys``), the sweep axis first."""
    keys = varying_keys(records)
    return ([axis] if axis in keys else []) + [k for k in keys if k != axis]


def param_labels(records: Sequence[CaseRecord], axis: str | None = None, *, arch: bool = False) -> list[str]:
    """Per record, ``key=value`` for each parameter that varies within its line (the axis first), joined by
    `` · ``; ``arch`` leads where a line holds several architectures, or always with ``arch=True``."""
    keys = param_columns(records, axis)
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    within = {line: (["arch"] if arch or len({r.arch for r in recs}) > 1 else [])
              + [k for k in keys if len({repr(r.value(k)) for r in recs}) > 1]
              for line, recs in by_line.items()}
    return [" · ".join(str(r.arch) if k == "arch" else f"{k}={r.value(k)}" for k in within[r.line])
            for r in records]


def case_labels(records: Sequence[CaseRecord], axis: str | None = None, *, arch: bool = False) -> list[str]:
    """One label per record: its line, then :func:`param_labels` (``arch · `` where a line holds several
    architectures or ``arch=True``, ``key=value`` for each parameter varying within the line). Unique within a run."""
    return [" · ".join(p for p in (r.line, label) if p)
            for r, label in zip(records, param_labels(records, axis, arch=arch))]


def label_keys(records: Sequence[CaseRecord]) -> tuple[str, ...]:
    """Fields beyond :meth:`CaseRecord.params`' own (arch and the label workload fields) that tell the cases
    of one line apart: the workload and config fields that vary within some line."""
    by_line: dict[str, list[CaseRecord]] = {}
    for r in records:
        by_line.setdefault(r.line, []).append(r)
    keys: dict[str, None] = {}
    for recs in by_line.values():
        for k in dict.fromkeys(k for r in recs for k in (*r.workload, *r.config)):
            if k not in LABEL_KEYS and len({repr(r.value(k)) for r in recs}) > 1:
                keys[k] = None
    return tuple(keys)


def case_params(records: Sequence[CaseRecord]) -> list[dict[str, Any]]:
    """Per record, its readable identity: ``arch``, the label workload fields (seq_len, batch_size, ...) and
    the fields that vary within its line (:func:`label_keys`)."""
    keys = label_keys(records)
    return [r.params(keys) for r in records]
