"""Suite files (TOML): load, validate every key before anything runs, expand into Cases.

Format (DESIGN.md, contract 1)::

    name = "attention_scaling"
    description = "..."
    metrics = ["latency", "memory", "flops"]
    fixed = { arch = "decoder-small", batch_size = 1 }
    sweep = { seq_len = [256, 512] }          # cartesian product (optional when there are lines)
    plot = { x = "seq_len", y = "median_ms", x_log = true, y_log = true }
    [lines]                                   # label -> overrides applied after `fixed`
    MHA = { n_kv_heads = 8 }
    [quick]                                   # optional, under --quick: replaces keys of fixed / sweep,
    lines = ["MHA"]                           # and runs only these lines
    sweep = { seq_len = [128, 256] }

Keys that are Workload fields go to the workload, ``arch`` names the architecture, any other
key overrides the architecture's config; anything else is an error naming the file and key.
"""
from __future__ import annotations

import dataclasses
import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import registry
from harness.errors import BenchInputError
from harness.records import CaseRecord, SuiteSpec
from harness.spec import METRICS, WORKLOAD_KEYS, Case, Workload

TOP_KEYS = {"name", "description", "metrics", "fixed", "sweep", "plot", "lines", "quick"}
PLOT_KEYS = {"x": str, "y": str, "x_log": bool, "y_log": bool, "title": str}
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


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


def load_suite(ref: str, *, quick: bool = False, sets: dict[str, Any] | None = None) -> Suite:
    """Read, validate and expand a suite. Every error is a BenchInputError naming file and key."""
    path = find_suite(ref)
    where = str(path)
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BenchInputError(f"TOML syntax error: {exc}", where=where) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"cannot read suite: {exc}", where=where) from None
    try:
        return dataclasses.replace(_build(data, path, quick, sets or {}), text=text)
    except BenchInputError as exc:
        raise BenchInputError(str(exc), where=where) from None


def _table(data: dict, key: str) -> dict:
    value = data.get(key, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BenchInputError(f"must be a table, got {type(value).__name__}", where=key)
    return value


def _build(data: dict, path: Path, quick: bool, sets: dict[str, Any]) -> Suite:
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
    lines = _table(data, "lines") or {"default": {}}
    plot = _table(data, "plot")
    q = _table(data, "quick")
    for key in set(q) - {"fixed", "sweep", "lines"}:
        raise BenchInputError("unknown key; allowed: fixed, sweep, lines", where=f"quick.{key}")
    quick_lines = q.get("lines")
    if quick_lines is not None:
        if not isinstance(quick_lines, list) or not quick_lines or not all(isinstance(x, str) for x in quick_lines):
            raise BenchInputError("must be a non-empty list of line labels", where="quick.lines")
        unknown_lines = [x for x in quick_lines if x not in lines]
        if unknown_lines:
            raise BenchInputError(f"no such line {unknown_lines[0]!r}; lines: {', '.join(lines)}",
                                  where="quick.lines")
    if quick:
        fixed.update(_table(q, "fixed"))
        sweep.update(_table(q, "sweep"))
        if quick_lines is not None:
            lines = {label: over for label, over in lines.items() if label in quick_lines}
    if not sweep and not _table(data, "lines"):
        raise BenchInputError("nothing to run: give a sweep (a key with a list of values) or [lines]",
                              where="sweep")
    for key, value in sets.items():          # --set KEY=VALUE pins a key, removing it from the sweep
        sweep.pop(key, None)
        fixed[key] = value
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise BenchInputError("a sweep key needs a non-empty list of values", where=f"sweep.{key}")
        if key in fixed:
            raise BenchInputError("key is both fixed and swept", where=f"sweep.{key}")
    for label, over in lines.items():
        if not isinstance(over, dict):
            raise BenchInputError("a line must be a table of overrides", where=f"lines.{label}")
        for key in over:
            if key in sweep:
                raise BenchInputError("a line may not override a swept key", where=f"lines.{label}.{key}")
    for key, typ in PLOT_KEYS.items():
        if key in plot and not isinstance(plot[key], typ):
            raise BenchInputError(f"must be {typ.__name__}", where=f"plot.{key}")
    for key in set(plot) - set(PLOT_KEYS):
        raise BenchInputError(f"unknown key; allowed: {', '.join(PLOT_KEYS)}", where=f"plot.{key}")

    cases: list[Case] = []
    axes = list(sweep)
    over_labels = set(_table(data, "lines"))
    for label, over in lines.items():
        for i, point in enumerate(itertools.product(*(sweep[k] for k in axes))):
            params = {**fixed, **over, **dict(zip(axes, point))}
            try:
                cases.append(dataclasses.replace(make_case(name, label, params, tuple(metrics)), point=i))
            except BenchInputError as exc:
                raise BenchInputError(str(exc), where=_origin(exc.where, label, over, sets, fixed, sweep,
                                                              _table(q, "fixed") if quick else {},
                                                              label in over_labels)) from None
    spec = SuiteSpec(description=description, metrics=tuple(metrics), fixed=fixed, sweep=sweep,
                     lines={k: dict(v) for k, v in lines.items()}, plot=dict(plot))
    return Suite(name, description, str(path), tuple(metrics), plot, tuple(lines), tuple(cases), quick,
                 spec=spec)


def _origin(key: str | None, label: str, over: dict, sets: dict, fixed: dict, sweep: dict, quick_fixed: dict,
            line_has_table: bool) -> str | None:
    """Where a bad case key came from: the line, ``--set``, the sweep, ``quick.fixed`` or ``fixed``."""
    if key in over:
        return f"lines.{label}"
    for origin, table in (("--set", sets), ("sweep", sweep), ("quick.fixed", quick_fixed), ("fixed", fixed)):
        if key in table:
            return origin
    return f"lines.{label}" if line_has_table else None     # a rule across keys (e.g. heads vs width)


def make_case(suite: str, line: str, params: dict[str, Any], metrics: tuple[str, ...]) -> Case:
    if "arch" not in params:
        raise BenchInputError("no architecture: set `arch` in fixed, a line or the sweep", where="arch")
    arch = params.pop("arch")
    if not isinstance(arch, str):
        raise BenchInputError(f"must be a string, got {arch!r}", where="arch")
    workload_kw = {k: v for k, v in params.items() if k in WORKLOAD_KEYS}
    overrides = {k: v for k, v in params.items() if k not in WORKLOAD_KEYS}
    workload = Workload(**workload_kw)
    # A workload's image size is also the model's where its config has one (ViT position tables).
    if workload.img_size and hasattr(registry.get(arch).config, "img_size"):
        overrides["img_size"] = workload.img_size
    registry.resolve(arch, **overrides)       # validates names, types and the config's own rules
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
