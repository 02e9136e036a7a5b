"""User architectures without editing the harness.

The built-in zoo (the ``architectures`` package of this source tree) is imported by name the first time
the registry is used, installed or not: a checkout on ``PYTHONPATH`` knows its own presets. Plug-ins have
two ways in, both ending in ``harness.contract.registry.register(ArchSpec(...))`` at import time:

* an installed package that declares an entry point in the group ``bench.architectures``
  (``[project.entry-points."bench.architectures"] mymodels = "mypkg.models"``); every such module
  is imported the first time the registry is used;
* a Python file given with ``--plugin path.py`` (repeatable) on ``bench run`` / ``bench list``;
  worker processes import the same files before their first case.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from harness.contract.errors import BenchInputError

ENTRY_POINT_GROUP = "bench.architectures"
BUILTIN_PACKAGE = "architectures"   # imported by name, not through an entry point (works without installing)
_loaded_files: dict[str, str] = {}


def load_builtin() -> None:
    """Import the built-in ``architectures`` package (each module registers its presets at import time).

    Imported by name (not by a static import: the harness sits below the architectures in the import
    layers, and loads them exactly as it loads a plug-in), so the zoo is known from a plain source checkout."""
    try:
        importlib.import_module(BUILTIN_PACKAGE)
    except ImportError as exc:
        raise BenchInputError(f"the built-in architectures failed to import: {exc}", where=BUILTIN_PACKAGE) from None


def load_entry_points() -> list[str]:
    """Import every third-party module registered under the ``bench.architectures`` entry-point group.

    An entry point naming the built-in package itself (left by an install from an older checkout) is
    skipped: :func:`load_builtin` has imported it already."""
    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.split(":")[0].strip() == BUILTIN_PACKAGE:
            continue
        try:
            ep.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 — a broken plug-in is named, not a traceback
            raise BenchInputError(f"plug-in {ep.name!r} ({ep.value}) failed to import: {exc}",
                                  where=ENTRY_POINT_GROUP) from None
        names.append(ep.name)
    return names


def load_file(path: str | Path) -> str:
    """Import a plug-in file once (by absolute path); returns its module name."""
    resolved = str(Path(path).resolve())
    if resolved in _loaded_files:
        return _loaded_files[resolved]
    if not Path(resolved).is_file():
        raise BenchInputError("no such plug-in file", where=str(path))
    name = "bench_plugin_" + hashlib.sha1(resolved.encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise BenchInputError("not an importable Python file", where=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BenchInputError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 — a plug-in may not end or crash bench
        del sys.modules[name]
        raise BenchInputError(f"plug-in failed to import: {type(exc).__name__}: {exc}", where=str(path)) from None
    _loaded_files[resolved] = name
    return name


def load_files(paths: tuple[str, ...] | list[str]) -> None:
    for path in paths:
        load_file(path)
