"""The built wheel holds every module and data file: `make` installs editable, which hides a package or a
template left out of pyproject.toml until somebody installs the wheel."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "architectures", "claims", "reports", "cli", "suites")
DATA = ("*.py", "*.toml", "*.j2", "*.css.j2", "*.csv.gz", "*.csv")


def test_wheel_holds_every_module_and_data_file(tmp_path: Path) -> None:
    src = tmp_path / "src"              # a clean copy: a stale build/ in the checkout would fill the gaps
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "results",
                                                            "__pycache__", "*.sqlite"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(tmp_path)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("bench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for pattern in DATA
                for p in (ROOT / pkg).rglob(pattern) if "__pycache__" not in p.parts}
    assert {"claims/probes/__init__.py", "claims/claims.toml", "claims/experiments/data/digits.csv.gz",
            "cli/app.py", "reports/templates/report.html.j2"} <= expected
    assert sorted(expected - names) == []
    assert any(n.endswith("entry_points.txt") for n in names)
