"""User architectures without editing the harness: a plug-in file, and an installed entry point."""
from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from harness import plugins, registry
from harness.errors import BenchInputError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gated_mlp_plugin.py"


def test_plugin_file_registers_and_runs_in_worker(cli, store_url, tmp_path):
    listed = cli("list", "archs", "example-*", "--plugin", str(EXAMPLE))
    assert listed.exit_code == 0 and "example-gmlp" in listed.stdout
    suite = tmp_path / "s.toml"
    suite.write_text('fixed = { arch = "example-gmlp", d_model = 16, d_ff = 32, max_seq_len = 64 }\n'
                     'metrics = ["flops", "latency"]\nsweep = { seq_len = [16, 32] }\n')
    # the default executor is a spawned worker: it must import the plug-in file itself
    ran = cli("run", str(suite), "--quick", "--store", store_url, "--plugin", str(EXAMPLE))
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
