"""The history page (`bench history --html`) and the history section of `bench report` in headless Chromium: they
load offline without errors, show one figure per case with its flagged commit, and a case's checkbox hides and
shows its figure. The page of a 6-commit history is saved to /tmp/history_page.png to be looked at.

Skipped without chromium/chromedriver (apt-get install chromium chromium-driver); with BENCH_REQUIRE_BROWSER=1
they fail instead (tests/test_report_browser.py)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.store.db import Store
from tests.helpers import invoke
from tests.history_repo import PLUGIN, ROOT, make_repo, run_at, suite_file
from tests.test_report_browser import _full_screenshot, driver, page_problems  # noqa: F401 (driver: a fixture)

pytestmark = pytest.mark.browser
SHOT = Path("/tmp/history_page.png")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> dict:
    """A history of 6 commits, the plug-in's hidden width 4× from commit 4 (an exact MAC step: flagged whatever the
    machine's load, where a timing step may read as noise on a busy machine), and its page."""
    d = tmp_path_factory.mktemp("history-page")
    repo = d / "repo"
    shas = make_repo(repo, [(1.0, 16)] * 3 + [(1.0, 64)] * 3)
    url = f"sqlite:///{d / 's.sqlite'}"
    store, suite = Store(url), suite_file(d)
    for sha in shas:
        run_at(store, repo, sha, suite, d / "plugins")
    out = d / "history.html"
    res = invoke("history", str(suite), "--quick", "--repo", str(repo), "--store", url, "--html", str(out), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    return {"path": out, "shas": shas, "flags": [f["commit"] for s in doc["series"] for f in s["flags"]]}


def test_history_page_renders_and_toggles(driver, page):  # noqa: F811
    problems = page_problems(driver, page["path"])
    assert {k: v for k, v in problems.items() if v} == {}
    figures = driver.find_elements("css selector", "figure.history-series")
    assert len(figures) == 1 and figures[0].is_displayed()
    text = figures[0].text + figures[0].get_attribute("innerHTML")
    assert all(sha[:8] in text for sha in page["flags"]) and page["shas"][3][:8] in page["flags"][0]
    box = driver.find_element("css selector", "input.history-toggle")
    box.click()
    assert not figures[0].is_displayed()
    box.click()
    assert figures[0].is_displayed()
    SHOT.write_bytes(_full_screenshot(driver))


def test_report_has_a_history_section(driver, tmp_path):  # noqa: F811
    """Runs stored at two commits of this checkout: `bench report` adds the history section."""
    shas = subprocess.run(["git", "rev-list", "-2", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()[::-1]
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store, suite = Store(url), suite_file(tmp_path)
    for sha in shas:
        run_at(store, ROOT, sha, suite, tmp_path / "plugins", source=PLUGIN.format(rev=1, pause_ms=0.5, hidden=16))
    out = tmp_path / "report.html"
    res = invoke("report", "latest", "--store", url, "-o", str(out))
    assert res.exit_code == 0, res.output
    problems = page_problems(driver, out)
    assert {k: v for k, v in problems.items() if v} == {}
    assert driver.find_element("id", "history").is_displayed()
    assert len(driver.find_elements("css selector", "figure.history-series")) == 1
