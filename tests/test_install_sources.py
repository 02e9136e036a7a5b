"""scripts/pip-sources: `make install`'s uv reads the package sources pip is configured with (pip's own
`config list` resolves pip.conf files and PIP_* variables; a variable wins over a file)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pip-sources"


def load():
    loader = importlib.machinery.SourceFileLoader("pip_sources", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("pip_sources", loader))
    loader.exec_module(module)
    return module


def test_sources_are_read_from_files_and_a_variable_overrides_a_file():
    listed = ("global.cert='/etc/ssl/certs/ca.crt'\n"
              "global.constraint='/etc/xdg/pip/constraints.txt'\n"
              "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
              "global.find-links='/opt/wheels'\n"
              "install.index-url='https://mirror.example/simple'\n"
              ":env:.find-links='/srv/wheels'\n"
              ":env:.default-timeout='180'\n")
    assert load().sources(listed) == {
        "constraint": ["/etc/xdg/pip/constraints.txt"],
        "extra-index-url": ["file:///opt/a/simple", "file:///opt/b/simple"],
        "find-links": ["/srv/wheels"],                     # the variable, not the file's /opt/wheels
        "index-url": ["https://mirror.example/simple"]}
    # the order of the lines does not matter: a file read after the variable does not win either
    assert load().sources(":env:.find-links='/srv'\nglobal.find-links='/opt'\n") == {"find-links": ["/srv"]}
    assert load().sources("site.find-links='/x'\nglobal.timeout='5'\n") == {}     # not a section uv reads here


def test_the_script_prints_uv_flags_for_this_pythons_pip(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///opt/x/simple file:///opt/y/simple\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(conf)                     # read last: its values win over the machine's files
    env["PIP_FIND_LINKS"] = str(tmp_path)
    out = subprocess.run([sys.executable, str(SCRIPT), sys.executable], capture_output=True, text=True, env=env,
                         check=True).stdout.splitlines()
    assert "--extra-index-url=file:///opt/x/simple" in out and "--extra-index-url=file:///opt/y/simple" in out
    assert f"--find-links={tmp_path}" in out
    bad = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
