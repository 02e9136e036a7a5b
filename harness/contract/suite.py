"""Suite files (TOML): load, validate every key before anything runs, expand into Cases.

Format (DESIGN.md, contract 1)::

    name = "attention_scaling"
    description = "..."
    metrics = ["latency", "memory", "flops"]
    fixed = { arch = "decoder-small", batch_size = 1 }
    sweep = { seq_len = [256, 512] }          # cartesian product (optional when there are lines)
    plot = { x = "seq_len", y = "median_ms", x_log = true, y_log = true }
    reference = "MHA"                         # optional: the line every other is compared with (default: the first)
    [lines]                                   # label -> overrides applied after `fixed`
    MHA = { n_kv_heads = 8 }
    [quick]                                   # optional, under --quick: replaces keys of fixed / sweep,
    lines = ["MHA"]                           # and runs only these lines
    sweep = { seq_len = [128, 256] }

    [cuda]                                    # optional, on a CUDA device: the same keys as [quick]
    fixed = { batch_size = 8 }                #   (replaces keys of fixed / sweep, keeps only these lines)
    sweep = { seq_len = [4096, 32768] }
    lines = ["MHA"]
    dtypes = ["bf16", "fp32"]                 #   and: every kept line once per dtype, labelled "MHA bf16"
    reference = "MHA"                         #   and: the reference among the lines it keeps (any overlay)
    [cuda.quick]                              # optional, on a CUDA device under --quick: as [cuda], after it
    sweep = { seq_len = [4096] }

``reference`` names the line the views compare every other line with (side by side, :mod:`reports.side_by_side`);
without it, the first line kept. A reference that names no line of [lines], or a line the tables applied drop, is
an error; under ``dtypes`` it is the reference's line in the first dtype (``"MHA bf16"``).

Keys that are Workload fields go to the workload, ``arch`` names the architecture, any other
key overrides the architecture's config; anything else is an error naming the file and key.

The device (``--device`` / ``--set device=...``, else the suite's ``fixed.device``, else cpu) picks the tables:

* not CUDA: [quick] under ``--quick``; [cuda] never applies, so CPU cases and their keys are exactly those of a
  suite without it (tests/test_suites_builtin.py pins them for the built-in suites);
* CUDA, suite with [cuda]: [cuda]; under ``--quick`` then [cuda.quick] if present, else [quick] (its lines
  must leave some of [cuda]'s); each table replaces keys of fixed/sweep, and each ``lines`` selects among the
  file's [lines] labels;
* CUDA, suite without [cuda]: as on the CPU.

``dtypes`` (in [cuda] / [cuda.quick] only; the later table's list wins) runs every kept line once per dtype:
label ``"LABEL DTYPE"``, ``dtype`` among the line's overrides, so each line still varies along the sweep alone.
A line that sets its own dtype, or a swept dtype, is an error; ``--set dtype=X`` pins X and drops the list
(labels unchanged). ``--set`` applies last, as always. Every table, [cuda] included, is validated and its
cases expanded on every load, whatever the device, so a typo fails on the CPU too.
"""
from __future__ import annotations

import dataclasses
import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from harness.contract import registry
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, SuiteSpec
from harness.contract.spec import (DTYPES, METRICS, WORKLOAD_KEYS, Case, Workload, WorkloadCheck, check_workload,
                                   workload_overrides)

TOP_KEYS = {"name", "description", "metrics", "fixed", "sweep", "plot", "lines", "quick", "cuda", "reference"}
PLOT_KEYS = {"x": str, "y": str, "x_log": bool, "y_log": bool, "title": str}
SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"


@dataclass(frozen=True)
class Suite:
    """A validated suite; ``cases`` are already expanded for the requested size. ``text`` is the file as
    read and ``spec`` the suite as run (after ``--quick`` and ``--set``): both are stored with the run."""

    name: str
    description: str
    path: str
    metrics: tuple[str, ...]
    plot: dict[str, Any]
    lines: tuple[str, ...]
    cases: tuple[Case, ...]
    quick: bool
    text: str = ""
    spec: SuiteSpec = SuiteSpec()
    cuda: bool = False          # the suite's [cuda] table applied (it runs on a CUDA device and has one)
    reference: str = ""         # the line the others are compared with, as the suite names it ("": the first)


def find_suite(ref: str) -> Path:
    """``suites/x``, ``suites/x.toml``, ``x`` (a built-in suite) or any path to a TOML file."""
    candidates = [Path(ref), Path(f"{ref}.toml"), SUITES_DIR / ref, SUITES_DIR / f"{ref}.toml",
                  SUITES_DIR / f"{Path(ref).name}.toml", SUITES_DIR / Path(ref).name]
    for path in candidates:
        if path.is_file():
            return path
    raise BenchInputError(f"no suite file found (looked for {ref} and {ref}.toml, and in {SUITES_DIR})",
                          where=ref)


def list_suites() -> list[Path]:
    return sorted(SUITES_DIR.glob("*.toml"))


def load_suite(ref: str, *, quick: bool = False, sets: dict[str, Any] | None = None,
               checks: Sequence[WorkloadCheck] = ()) -> Suite:
    """Read, validate and expand a suite for its device (``sets["device"]``, from ``--device``, else the
    file's ``fixed.device``): [cuda] applies on a CUDA device. Every error is a BenchInputError naming file
    and key; a [cuda] table is validated (its cases expanded) on every load. ``checks``: the workload checks that
    need torch (:data:`harness.engine.checks.WORKLOAD_CHECKS`), run on every case."""
    path = find_suite(ref)
    where = str(path)
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BenchInputError(f"TOML syntax error: {exc}", where=where) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"cannot read suite: {exc}", where=where) from None
    sets = sets or {}
    try:
        suite = _build(data, path, quick, sets, checks)
        if not suite.cuda and _table(data, "cuda"):      # [cuda] is checked on every load, not only on a GPU
            _build(data, path, quick, {**sets, "device": "cuda"}, checks)
        return dataclasses.replace(suite, text=text)
    except BenchInputError as exc:
        raise BenchInputError(str(exc), where=where) from None


def _table(data: dict, key: str) -> dict:
    value = data.get(key, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BenchInputError(f"must be a table, got {type(value).__name__}", where=key)
    return value


@dataclass(frozen=True)
class _Overlay:
    """One of [quick], [cuda], [cuda.quick], validated: keys it replaces in fixed/sweep, the lines it keeps
    (None: all) and the dtypes every kept line runs in (None: as declared; [cuda] tables only)."""

    name: str
    fixed: dict
    sweep: dict
    lines: list[str] | None = None
    dtypes: list[str] | None = None
    reference: str | None = None


def _overlay(data: dict, name: str, labels: dict, with_dtypes: bool) -> _Overlay:
    """Validate the table ``name`` (dotted: ``cuda.quick``) of ``data``: its keys, line labels and dtypes."""
    allowed = {"fixed", "sweep", "lines", "reference"} | ({"dtypes"} if with_dtypes else set()) | (
        {"quick"} if name == "cuda" else set())
    for key in sorted(set(data) - allowed):
        raise BenchInputError(f"unknown key; allowed: {', '.join(sorted(allowed))}", where=f"{name}.{key}")
    fixed = _table_at(data, "fixed", f"{name}.fixed")
    sweep = _table_at(data, "sweep", f"{name}.sweep")
    chosen = data.get("lines")
    if chosen is not None:
        if not isinstance(chosen, list) or not chosen or not all(isinstance(x, str) for x in chosen):
            raise BenchInputError("must be a non-empty list of line labels", where=f"{name}.lines")
        unknown = [x for x in chosen if x not in labels]
        if unknown:
            raise BenchInputError(f"no such line {unknown[0]!r}; lines: {', '.join(labels)}", where=f"{name}.lines")
    dtypes = data.get("dtypes")
    if dtypes is not None:
        if (not isinstance(dtypes, list) or not dtypes or not all(isinstance(x, str) for x in dtypes)
                or len(set(dtypes)) != len(dtypes)):
            raise BenchInputError(f"must be a non-empty list of distinct dtypes ({', '.join(DTYPES)})",
                                  where=f"{name}.dtypes")
        bad = [x for x in dtypes if x not in DTYPES]
        if bad:
            raise BenchInputError(f"unknown dtype {bad[0]!r}; expected some of {list(DTYPES)}", where=f"{name}.dtypes")
    return _Overlay(name, dict(fixed), dict(sweep), chosen, dtypes, _reference(data, labels, f"{name}.reference"))


def _reference(data: dict, labels: dict, where: str) -> str | None:
    """``data``'s ``reference``: None when absent; a string naming a line of ``labels``, else bad input."""
    ref = data.get("reference")
    if ref is None:
        return None
    if not isinstance(ref, str) or not ref:
        raise BenchInputError("must be a line's label (a non-empty string)", where=where)
    if ref not in labels:
        raise BenchInputError(f"names no line: {ref!r}; lines: {', '.join(labels) or '(none: the suite has no [lines])'}",
                              where=where)
    return ref


def _table_at(data: dict, key: str, where: str) -> dict:
    try:
        return _table(data, key)
    except BenchInputError:
        raise BenchInputError(f"must be a table, got {type(data.get(key)).__name__}", where=where) from None


def suite_device(data: dict, sets: dict[str, Any]) -> str:
    """The device a suite runs on: ``--device``/``--set device=...``, else its ``fixed.device``, else cpu."""
    device = sets.get("device", _table(data, "fixed").get("device", "cpu"))
    return device if isinstance(device, str) else "cpu"


def _overlays(data: dict, labels: dict, quick: bool, on_cuda: bool) -> list[_Overlay]:
    """The tables applied, in order: off CUDA [quick] under --quick; on CUDA [cuda] (if any), then under --quick
    [cuda.quick] if the suite has one, else [quick]. Every table is validated whichever applies."""
    q = _overlay(_table_at(data, "quick", "quick"), "quick", labels, with_dtypes=False)
    cuda_data = _table_at(data, "cuda", "cuda")
    cuda = _overlay(cuda_data, "cuda", labels, with_dtypes=True)
    has_cuda_quick = cuda_data.get("quick") is not None
    cuda_quick = _overlay(_table_at(cuda_data, "quick", "cuda.quick"), "cuda.quick", labels, with_dtypes=True)
    if not (on_cuda and cuda_data):
        return [q] if quick else []
    return [cuda] + ([cuda_quick if has_cuda_quick else q] if quick else [])


def _with_dtypes(lines: dict, dtypes: list[str] | None, where: str) -> dict:
    """Each line once per dtype, labelled ``"LABEL DTYPE"`` with ``dtype`` among its overrides."""
    if dtypes is None:
        return lines
    out: dict[str, Any] = {}
    for label, over in lines.items():
        if isinstance(over, dict) and "dtype" in over:
            raise BenchInputError(f"line {label!r} sets its own dtype; drop it or the dtypes list", where=where)
        for dt in dtypes:
            name = f"{label} {dt}"
            if name in lines or name in out:
                raise BenchInputError(f"the label {name!r} would name two lines", where=where)
            out[name] = {**over, "dtype": dt} if isinstance(over, dict) else over
    return out


def _build(data: dict, path: Path, quick: bool, sets: dict[str, Any], checks: Sequence[WorkloadCheck]) -> Suite:
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise BenchInputError(f"unknown key; allowed: {', '.join(sorted(TOP_KEYS))}", where=sorted(unknown)[0])
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise BenchInputError("must be a non-empty string", where="name")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise BenchInputError("must be a string", where="description")
    metrics = data.get("metrics", list(METRICS))
    if not isinstance(metrics, list) or not metrics:
        raise BenchInputError(f"must be a non-empty list of {list(METRICS)}", where="metrics")
    for m in metrics:
        if m not in METRICS:
            raise BenchInputError(f"unknown metric {m!r}; expected some of {list(METRICS)}", where="metrics")

    fixed = dict(_table(data, "fixed"))
    sweep = dict(_table(data, "sweep"))
    sweep_from = {key: "sweep" for key in sweep}        # where each swept key was set, for errors
    lines = _table(data, "lines") or {"default": {}}
    plot = _table(data, "plot")
    on_cuda = suite_device(data, sets).startswith("cuda")
    reference, reference_from = _reference(data, _table(data, "lines"), "reference"), "reference"
    overlays = _overlays(data, lines, quick, on_cuda)
    dtypes: list[str] | None = None
    dtypes_from = ""
    for layer in overlays:
        if layer.reference is not None:
            reference, reference_from = layer.reference, f"{layer.name}.reference"
        fixed.update(layer.fixed)
        sweep.update(layer.sweep)
        sweep_from.update({key: f"{layer.name}.sweep" for key in layer.sweep})
        if layer.lines is not None:
            kept = {label: over for label, over in lines.items() if label in layer.lines}
            if not kept:
                raise BenchInputError(f"selects none of the lines left by {overlays[0].name}.lines: "
                                      f"{', '.join(lines)}", where=f"{layer.name}.lines")
            lines = kept
        if layer.dtypes is not None:
            dtypes, dtypes_from = layer.dtypes, f"{layer.name}.dtypes"
    if not sweep and not _table(data, "lines"):
        raise BenchInputError("nothing to run: give a sweep (a key with a list of values) or [lines]",
                              where="sweep")
    for key, value in sets.items():          # --set KEY=VALUE pins a key, removing it from the sweep
        sweep.pop(key, None)
        fixed[key] = value
    if "dtype" in sets:                      # a pinned dtype wins over a [cuda] dtypes list
        dtypes = None
    if dtypes is not None and "dtype" in sweep:
        raise BenchInputError("dtype is also swept; give either a dtype sweep or a dtypes list",
                              where=dtypes_from)
    for key, values in sweep.items():
        where = f"{sweep_from.get(key, 'sweep')}.{key}"
        if not isinstance(values, list) or not values:
            raise BenchInputError("a sweep key needs a non-empty list of values", where=where)
        if key in fixed:
            raise BenchInputError("key is both fixed and swept", where=where)
    for label, over in lines.items():
        if not isinstance(over, dict):
            raise BenchInputError("a line must be a table of overrides", where=f"lines.{label}")
        for key in over:
            if key in sweep:
                raise BenchInputError("a line may not override a swept key", where=f"lines.{label}.{key}")
    if reference is not None and reference not in lines:
        raise BenchInputError(f"{reference!r} is not among the lines this run keeps ({', '.join(lines)}); name one "
                              "of them in the table that selects them", where=reference_from)
    lines = _with_dtypes(lines, dtypes, dtypes_from)
    if reference is not None and dtypes is not None:
        reference = f"{reference} {dtypes[0]}"
    for key, typ in PLOT_KEYS.items():
        if key in plot and not isinstance(plot[key], typ):
            raise BenchInputError(f"must be {typ.__name__}", where=f"plot.{key}")
    for key in set(plot) - set(PLOT_KEYS):
        raise BenchInputError(f"unknown key; allowed: {', '.join(PLOT_KEYS)}", where=f"plot.{key}")

    cases: list[Case] = []
    axes = list(sweep)
    over_labels = set(_table(data, "lines"))
    layers_fixed = [(f"{layer.name}.fixed", layer.fixed) for layer in reversed(overlays)]
    for label, over in lines.items():
        for i, point in enumerate(itertools.product(*(sweep[k] for k in axes))):
            params = {**fixed, **over, **dict(zip(axes, point))}
            try:
                cases.append(dataclasses.replace(make_case(name, label, params, tuple(metrics), checks), point=i))
            except BenchInputError as exc:
                raise BenchInputError(str(exc), where=_origin(exc.where, label, over, sets, sweep_from,
                                                              layers_fixed, fixed, label in over_labels
                                                              or dtypes is not None)) from None
    spec = SuiteSpec(description=description, metrics=tuple(metrics), fixed=fixed, sweep=sweep,
                     lines={k: dict(v) for k, v in lines.items()}, plot=dict(plot), reference=reference or "")
    return Suite(name, description, str(path), tuple(metrics), plot, tuple(lines), tuple(cases), quick,
                 spec=spec, cuda=on_cuda and bool(_table(data, "cuda")), reference=reference or "")


def _origin(key: str | None, label: str, over: dict, sets: dict, sweep_from: dict[str, str],
            layers_fixed: list[tuple[str, dict]], fixed: dict, line_has_table: bool) -> str | None:
    """Where a bad case key came from: the line, ``--set``, a sweep, an overlay's fixed (latest first), ``fixed``."""
    if key in over:
        return f"lines.{label}"
    if key in sets:
        return "--set"
    if key in sweep_from:
        return sweep_from[key]
    for origin, table in layers_fixed:
        if key in table:
            return origin
    if key in fixed:
        return "fixed"
    return f"lines.{label}" if line_has_table else None     # a rule across keys (e.g. heads vs width)


def make_case(suite: str, line: str, params: dict[str, Any], metrics: tuple[str, ...],
              checks: Sequence[WorkloadCheck] = ()) -> Case:
    if "arch" not in params:
        raise BenchInputError("no architecture: set `arch` in fixed, a line or the sweep", where="arch")
    arch = params.pop("arch")
    if not isinstance(arch, str):
        raise BenchInputError(f"must be a string, got {arch!r}", where="arch")
    workload_kw = {k: v for k, v in params.items() if k in WORKLOAD_KEYS}
    overrides = {k: v for k, v in params.items() if k not in WORKLOAD_KEYS}
    workload = Workload(**workload_kw)
    overrides.update(workload_overrides(registry.get(arch).config, workload))
    spec = registry.resolve(arch, **overrides)       # validates names, types and the config's own rules
    check_workload(spec, workload, checks)
    return Case(suite, line, arch, tuple(sorted(overrides.items())), workload, metrics)


def parse_set(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; VALUE is read as a TOML value (``8``, ``true``, ``"x"``), else a bare string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BenchInputError(f"expected KEY=VALUE, got {item!r}", where="--set")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def case_from_record(rec: CaseRecord, metrics: tuple[str, ...]) -> Case:
    """The case a stored record measured, to measure it again: its arch, the config fields that differ from
    the architecture's defaults as overrides, and its workload."""
    defaults = dataclasses.asdict(registry.resolve(rec.arch).config)
    overrides = {k: v for k, v in rec.config.items() if k in defaults and defaults[k] != v}
    workload = Workload(**{k: v for k, v in rec.workload.items() if k in WORKLOAD_KEYS})
    return Case(rec.suite, rec.line, rec.arch, tuple(sorted(overrides.items())), workload, metrics)
