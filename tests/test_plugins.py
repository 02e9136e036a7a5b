"""User architectures without editing the harness: a plug-in file, and an installed entry point."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from harness.contract import plugins
from harness.contract import registry
from harness.contract.errors import BenchInputError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gated_mlp_plugin.py"


def test_plugin_file_registers_and_runs_in_worker(cli, store_url, tmp_path):
    listed = cli("list", "archs", "example-*", "--plugin", str(EXAMPLE))
    assert listed.exit_code == 0 and "example-gmlp" in listed.stdout
    suite = tmp_path / "s.toml"
    suite.write_text('fixed = { arch = "example-gmlp", d_model = 16, d_ff = 32, max_seq_len = 64 }\n'
                     'metrics = ["flops", "latency"]\nsweep = { seq_len = [16, 32] }\n')
    # the default executor is a spawned worker: it must import the plug-in file itself
    ran = cli("run", str(suite), "--quick", "--store", store_url, "--plugin", str(EXAMPLE), "--no-calibrate",
             "--no-report")
    assert ran.exit_code == 0, ran.stderr
    exported = json.loads(cli("export", "latest", "--format", "json", "--store", store_url).stdout)
    assert [c["status"] for c in exported] == ["ok", "ok"]
    assert all(c["metrics"]["macs"] > 0 and c["metrics"]["median_ms"] > 0 for c in exported)


def test_missing_or_broken_plugin_is_bad_input(cli, tmp_path):
    missing = cli("list", "archs", "--plugin", str(tmp_path / "nope.py"))
    assert missing.exit_code == 2 and "no such plug-in file" in missing.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('kaput')\n")
    res = cli("list", "archs", "--plugin", str(broken))
    assert res.exit_code == 2 and "kaput" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_entry_point_plugins_are_loaded(monkeypatch, tmp_path):
    pkg = tmp_path / "bench_ep_demo.py"
    pkg.write_text(EXAMPLE.read_text().replace('"example-gmlp"', '"ep-gmlp"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="demo", value="bench_ep_demo", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [ep] if group == plugins.ENTRY_POINT_GROUP else [])
    try:
        assert plugins.load_entry_points() == ["demo"]
        assert "ep-gmlp" in registry.list_archs("ep-*")
    finally:
        registry._ARCHS.pop("ep-gmlp", None)


def test_broken_entry_point_is_named(monkeypatch):
    ep = EntryPoint(name="bad", value="no_such_module_for_bench", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [ep])
    with pytest.raises(BenchInputError, match="plug-in 'bad'"):
        plugins.load_entry_points()


def _builtin_presets() -> set[str]:
    registry.list_archs()
    return {n for n, s in registry._ARCHS.items() if getattr(s.build, "__module__", "").startswith("architectures")}


def test_builtin_zoo_is_found_with_no_entry_points(monkeypatch):
    """The registry imports the built-in ``architectures`` itself: with no entry point at all (a source
    checkout that was never installed) every built-in preset and namespace is still known."""
    expected = _builtin_presets()
    assert {"resnet50", "attention-core"} <= expected
    saved_modules = {k: m for k, m in sys.modules.items() if k == "architectures" or k.startswith("architectures.")}
    monkeypatch.setattr(plugins, "entry_points", lambda group=None: [])
    monkeypatch.setattr(registry, "_ARCHS", {})
    monkeypatch.setattr(registry, "_NAMESPACES", {})
    monkeypatch.setattr(registry, "_loaded", False)
    for name in saved_modules:
        del sys.modules[name]
    try:
        found = set(registry.list_archs())
        assert expected <= found
        assert {"torchvision", "timm"} <= set(registry.namespaces())
    finally:
        for name in [k for k in sys.modules if k == "architectures" or k.startswith("architectures.")]:
            del sys.modules[name]
        sys.modules.update(saved_modules)


def test_an_old_builtin_entry_point_is_harmless(monkeypatch):
    """An install from an older checkout still declares ``builtin = "architectures"``: it is skipped, not
    imported a second time as a plug-in."""
    ep = EntryPoint(name="builtin", value="architectures", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [ep])
    assert plugins.load_entry_points() == []


def test_source_tree_without_install_lists_its_zoo(tmp_path):
    """A subprocess with only the source tree on PYTHONPATH (from a directory where the installed package
    is not importable by cwd) lists ``resnet50``: no install, no entry point needed."""
    code = ("from harness.contract import plugins, registry\n"
            "plugins.entry_points = lambda *a, **k: []\n"     # as if never installed
            "print(' '.join(registry.list_archs('resnet*')))\n"
            "import architectures; print(architectures.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    names, where = out.stdout.strip().splitlines()
    assert "resnet50" in names.split()
    assert where.startswith(str(ROOT))


OLD_STYLE = Path(__file__).resolve().parent / "plugin_old_paths.py"
_LOAD = ("import warnings, sys\nwarnings.simplefilter('always', DeprecationWarning)\n"
         "from harness.contract.plugins import load_files\nfrom harness.api import get, list_archs\n"
         "load_files([sys.argv[1]])\nname = list_archs(sys.argv[2])[0]\nspec = get(name)\n"
         "print(name, type(spec.build(spec.config)).__name__)\n")


def _load_in_fresh_python(path: Path, pattern: str) -> subprocess.CompletedProcess:
    """Load a plug-in file as `--plugin` does, in a fresh interpreter (a module warns once, when first imported)."""
    return subprocess.run([sys.executable, "-c", _LOAD, str(path), pattern], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_a_plugin_written_against_the_old_paths_still_loads_with_a_deprecation_warning():
    res = _load_in_fresh_python(OLD_STYLE, "old-paths-*")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["old-paths-gmlp", "GatedMLP"]
    for old in ("harness.registry", "harness.spec"):
        assert f"DeprecationWarning: {old} is deprecated: import from harness.api" in res.stderr


def test_the_example_plugin_uses_the_public_api_without_warnings():
    assert "from harness.api import" in EXAMPLE.read_text()
    res = _load_in_fresh_python(EXAMPLE, "example-*")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["example-gmlp", "GatedMLP"] and "is deprecated" not in res.stderr


def test_the_public_api_exports_what_a_plugin_needs_and_the_protocol_matches_the_engine():
    import harness.api as api
    from architectures.ssm import SSMLM
    from architectures.transformer import Decoder
    assert {"register", "ArchSpec", "Workload", "GenerativeModel", "GenerationState"} <= set(api.__all__)
    assert all(hasattr(api, name) for name in api.__all__)
    protocol = {n for n in vars(api.GenerativeModel) if not n.startswith("_")}
    assert protocol == set(api.GENERATION_PROTOCOL)          # the typed protocol names what the engine calls
    for model in (Decoder, SSMLM):
        assert all(callable(getattr(model, n, None)) for n in api.GENERATION_PROTOCOL), model
