"""The architecture registry: register(), resolve(name, **overrides), list_archs(pattern).

Presets are data: a family registers one ArchSpec per named config instance. A namespace
resolver (e.g. ``torchvision:``) turns ``ns:NAME`` into an ArchSpec on demand.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from harness.contract.errors import BenchInputError
from harness.contract.plugins import load_builtin, load_entry_points
from harness.contract.spec import ArchSpec

_ARCHS: dict[str, ArchSpec] = {}
_NAMESPACES: dict[str, Callable[[str], ArchSpec]] = {}
_NAMESPACE_PRESETS: dict[str, Callable[[], Mapping[str, str]]] = {}
_loaded = False


def register(spec: ArchSpec) -> ArchSpec:
    """Add a preset; a second registration under the same name is refused."""
    if spec.name in _ARCHS:
        raise ValueError(f"architecture {spec.name!r} is already registered")
    if ":" in spec.name:
        raise ValueError(f"architecture names may not contain ':' ({spec.name!r}); that marks a namespace")
    _ARCHS[spec.name] = spec
    return spec


def register_namespace(prefix: str, resolver: Callable[[str], ArchSpec],
                       presets: Callable[[], Mapping[str, str]] | None = None) -> None:
    """Resolve ``prefix:NAME`` with ``resolver(NAME)``; ``presets()`` gives the ``prefix:NAME`` a listing shows (the
    namespace's named presets) with their descriptions, as plain data: listing them resolves nothing."""
    if prefix in _NAMESPACES:
        raise ValueError(f"namespace {prefix!r} is already registered")
    _NAMESPACES[prefix] = resolver
    if presets is not None:
        _NAMESPACE_PRESETS[prefix] = presets


def _ensure_loaded() -> None:
    """Import every architecture module once: the built-in ``architectures`` package by name (so a source
    checkout that is not installed knows its zoo), then the third-party entry points of the
    ``bench.architectures`` group."""
    global _loaded
    if not _loaded:
        _loaded = True
        load_builtin()
        load_entry_points()


def list_archs(pattern: str = "*") -> list[str]:
    """Registered preset names matching a shell-style wildcard, sorted."""
    _ensure_loaded()
    return sorted(n for n in _ARCHS if fnmatch.fnmatchcase(n, pattern))


def namespace_presets(pattern: str = "*") -> dict[str, str]:
    """The named presets of the namespaces (``prefix:NAME`` → description) matching a shell-style wildcard, sorted
    by name; never part of :func:`list_archs` (which tests parametrize over)."""
    _ensure_loaded()
    found = {n: d for presets in _NAMESPACE_PRESETS.values() for n, d in presets().items()}
    return {n: found[n] for n in sorted(found) if fnmatch.fnmatchcase(n, pattern)}


def namespaces() -> list[str]:
    _ensure_loaded()
    return sorted(_NAMESPACES)


def get(name: str) -> ArchSpec:
    """The spec registered (or resolved through a namespace) under ``name``."""
    _ensure_loaded()
    if name in _ARCHS:
        return _ARCHS[name]
    prefix, sep, rest = name.partition(":")
    if sep and prefix in _NAMESPACES:
        return _NAMESPACES[prefix](rest)
    close = fnmatch.filter(_ARCHS, f"*{name.split(':')[-1][:4]}*")[:3]
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `bench list archs`"
    raise BenchInputError(f"unknown architecture {name!r}{hint}", where="arch")


def resolve(name: str, **overrides: Any) -> ArchSpec:
    """The spec for ``name`` with its config fields replaced by ``overrides`` (validated)."""
    spec = get(name)
    if not overrides:
        return spec
    return dataclasses.replace(spec, config=apply_overrides(spec.config, overrides, arch=name))


def apply_overrides(config: Any, overrides: dict[str, Any], *, arch: str = "") -> Any:
    """``dataclasses.replace`` with unknown keys and wrong types reported as BenchInputError."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    for key, value in overrides.items():
        if key not in fields:
            raise BenchInputError(
                f"{arch or type(config).__name__} has no config field {key!r}; fields: {', '.join(fields)}",
                where=key)
        if not _type_ok(value, hints[key]):
            raise BenchInputError(f"expected {_type_name(hints[key])}, got {value!r}", where=key)
    try:
        return dataclasses.replace(config, **overrides)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, BenchInputError):
            raise
        raise BenchInputError(str(exc), where=arch or None) from None


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, (tuple, list))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))
