"""The README stays short and current, and the user pages speak of the project as it is."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli.app import COMMANDS
from harness.contract import registry
from tests.test_docs_text import DOCS, README, ROOT, blocks, commands, registered_names, snippet, table_rows, user_pages
from tests.helpers import invoke

TEXT = README.read_text()


def test_the_readme_is_short():
    assert len(TEXT.splitlines()) <= 250


def test_the_readme_opens_with_make_run_and_make_test():
    first = blocks(README)[0]
    assert [line.split("#")[0].strip() for line in first.text.splitlines()] == ["make run", "make test"]


def test_the_readme_lists_every_built_in_suite():
    listed = invoke("list", "suites")
    assert listed.exit_code == 0
    names = [line.split()[0] for line in listed.output.splitlines() if line.strip()]
    rows = table_rows(TEXT, "suite")
    assert [r[0].strip("`") for r in rows] == names
    assert all(r[1] for r in rows), "every suite says what it asks"


def test_the_readme_lists_every_command():
    rows = table_rows(TEXT, "command")
    shown = {name for r in rows for name in re.findall(r"`bench (\w+)", r[0])}
    assert shown == set(COMMANDS)


def test_the_hand_install_has_the_makefiles_extras():
    extras = re.search(r"^EXTRAS := \.(\[[^\]]*\])$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert f"-e '.{extras}'" in TEXT
    assert f"-e '.{extras}'" in (DOCS / "getting-started.md").read_text()


def test_the_readme_shows_a_screenshot_that_exists():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", TEXT)
    assert images
    for image in images:
        assert (ROOT / image).is_file(), image


HISTORY = [(re.compile(r"\bissues? #?\d+", re.I), "an issue number"),
           (re.compile(r"\bround \d+\b", re.I), "a development round"),
           (re.compile(r"\.\./shared|/work/"), "a path outside the repository")]


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_carry_no_history(page: Path):
    """History goes to CHANGELOG.md and dated measurements to docs/evidence/; the README and the user pages say
    what the project is."""
    found = [f"line {n}: {what}: {m.group(0)!r}" for n, line in enumerate(page.read_text().splitlines(), 1)
             for pattern, what in HISTORY for m in pattern.finditer(line)]
    assert not found, "\n".join(found)


def test_the_checker_finds_history():
    line = "as measured in round 3 (issue 25), see ../shared/evidence"
    assert [what for pattern, what in HISTORY if pattern.search(line)] == [w for _, w in HISTORY]


def test_the_commands_are_found():
    found = {c.args[:1] for c in commands([README])}
    assert {("run",), ("baseline",), ("check",), ("claims",)} <= found


def test_the_readme_plug_in_snippet_runs(tmp_path: Path):
    """The own-model recipe, as printed: its module and suite written out, then the command it shows."""
    source = snippet(TEXT, "# my_models.py")
    (tmp_path / "my_models.py").write_text(source)
    (tmp_path / "my_suite.toml").write_text(snippet(TEXT, "# my_suite.toml"))
    [cmd] = [c for c in commands([README]) if "--plugin" in c.args]
    args = [str(tmp_path / a) if (tmp_path / a).exists() else a for a in cmd.args]
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    try:
        result = invoke(*args, "--executor", "inline", "--store", url, "--no-report", "--no-calibrate")
    finally:
        for arch in registered_names(source):       # another module may load the snippet again
            registry._ARCHS.pop(arch, None)
    assert result.exit_code == 0, result.output + result.stderr
    assert "6 cases: 6 ok" in result.output, result.output


def test_the_readmes_links_to_the_repository_exist():
    """A link to a page the site generates at build time would be broken on the repository's front page."""
    links = [m for m in re.findall(r"\]\(([^)#]+)\)", TEXT) if "://" not in m]
    assert links
    assert [m for m in links if not (ROOT / m).exists()] == []
