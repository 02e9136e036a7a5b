"""`bench report`: one self-contained, escaped HTML file with figures, fingerprints and aligned runs.

One real run of a tiny suite (inline executor) is shared by every test; a second run is made from its
records (every median doubled, "another machine") and a skipped case is added to the first, so the
aligned table, ratios and error-state marks are all deterministic.
"""
from __future__ import annotations

import html as htmllib
import re
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

from harness.cli import BenchGroup
from harness.errors import BenchInputError
from harness.spec import Record
from harness.store import Store
from reports.html import render_report
from reports.plots import figure_svg, suite_figure
from tests.conftest import run_tiny, store_slower_copy
from reports.report_cmd import report

XSS = "<script>alert(1)</script>"
SUITE = f"""
name = "tiny"
description = "A <b>tiny</b> suite & friends"
metrics = ["latency", "memory", "flops"]
fixed = {{ arch = "decoder-tiny", batch_size = 1 }}
sweep = {{ seq_len = [16, 32, 64] }}
plot = {{ x = "seq_len", y = "median_ms", x_log = true, y_log = true }}
[lines]
MHA = {{ n_kv_heads = 4 }}
"{XSS}" = {{ n_kv_heads = 1 }}
"""
SKIPPED_KEY = "f" * 16


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    suite, url, result = run_tiny(tmp, text=SUITE)
    assert result.exit_code == 0, result.output
    store = Store(url, create=False)
    first = store.get_run("latest")
    rows = store.records(first["id"])
    second_id = store_slower_copy(store, first)          # the same suite "on another machine": medians × 2
    # a case the first run skipped (too big for the memory budget)
    template = rows[0]
    store.add_record(first["id"], Record(
        SKIPPED_KEY, template["suite"], "MHA", template["arch"], "skipped",
        "estimated peak 9,999 MiB exceeds the memory budget 8,000 MiB",
        config=template["config"], workload={**template["workload"], "seq_len": 128},
        metrics={"est_peak_bytes": 9999 * 2**20}))
    return tmp, url, first["id"], second_id


def make_report(url: str, *refs: str, output) -> tuple[str, object]:
    result = CliRunner().invoke(report, [*refs, "--store", url, "-o", str(output)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return output.read_text(encoding="utf-8"), result


@pytest.fixture(scope="module")
def page(two_runs):
    tmp, url, first, second = two_runs
    text, _ = make_report(url, first, second, output=tmp / "two.html")
    return text


class TagChecker(HTMLParser):
    """Checks that every non-void element is closed in order."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "source", "area", "base"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:]} at {self.getpos()}")
        else:
            self.stack.pop()


def test_one_self_contained_file(page):
    lowered = page.lower()
    for needle in ("http://", "https://", "src=", "<script", "<link", "@import", "<iframe", "<object"):
        assert needle not in lowered, needle
    assert not re.findall(r"url\((?!#)", lowered)          # only in-page references (SVG clip paths)
    assert not re.findall(r"href=\"(?!#)", lowered)        # only in-page anchors
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 4                      # per run: the suite's figure and the roofline
    assert page.count("<h3>Roofline") == 2
    assert "<style>" in page


def test_html_parses_and_tags_balance(page):
    checker = TagChecker()
    checker.feed(page)
    checker.close()
    assert not checker.problems, checker.problems[:5]
    assert checker.stack == []


def test_fingerprint_description_and_every_case(two_runs, page):
    _, url, first, second = two_runs
    store = Store(url, create=False)
    run = store.get_run(first)
    assert htmllib.escape(run["env"]["hard"]["cpu"]) in page
    assert "A &lt;b&gt;tiny&lt;/b&gt; suite &amp; friends" in page     # the suite description, escaped
    for ref in (first, second):
        assert ref in page
        for r in store.records(ref):
            assert r["case_key"] in page
    assert page.count("<details") == 7 + 6              # raw statistics per case, both runs
    assert "p90_ms" in page and "p99_ms" in page and "raw samples" in page


def test_line_label_is_escaped_everywhere(page):
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()


def test_two_runs_are_aligned_with_a_ratio(two_runs, page):
    _, _, first, second = two_runs
    aligned = page[page.index('<table class="aligned">'):]
    aligned = aligned[:aligned.index("</table>")]
    assert first in aligned and second in aligned and "ratio" in aligned
    rows = re.findall(r"<tr><td class=\"key\">(\w+)</td>.*?</tr>", aligned, re.S)
    assert len(rows) == 7 and len(set(rows)) == 7       # one row per case key (6 shared + 1 skipped)
    assert aligned.count("2.000×") == 6                 # every shared case: the second run is 2x the first
    assert "absent" in aligned                          # the skipped case exists only in the first run
    assert "6 of 7 cases are in every run" in page


def test_skipped_case_is_a_mark_not_a_gap(two_runs, page):
    _, url, first, _ = two_runs
    rows = Store(url, create=False).records(first)
    svg = figure_svg(suite_figure(rows, {"x": "seq_len", "y": "median_ms", "x_log": True, "y_log": True}))
    assert 'id="status-skipped"' in svg
    assert re.search(r">\s*skipped\s*<", svg)            # its legend entry
    assert svg.startswith("<svg") and "<?xml" not in svg and "http" not in svg
    first_section = page[page.index('id="run-0"'):page.index('id="run-1"')]
    assert 'id="status-skipped"' in first_section and 'class="status-skipped">skipped<' in first_section
    assert "exceeds the memory budget" in first_section


def test_legend_carries_fitted_exponent_with_ci(two_runs):
    _, url, first, _ = two_runs
    rows = Store(url, create=False).records(first)
    fig = suite_figure(rows, None)                       # no spec: sweep axis + median_ms
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(lbl.startswith("MHA  (k = ") and "95% CI [" in lbl for lbl in labels), labels
    assert "skipped" in labels


def test_suite_file_gone_falls_back_to_sweep_axis(two_runs):
    _, url, first, _ = two_runs
    store = Store(url, create=False)
    run = {**store.get_run(first), "suite_path": "/nonexistent/gone.toml"}
    page = render_report([(run, store.records(first))])
    assert "<svg" in page and "seq_len" in page
    assert 'class="aligned"' not in page                 # one run: no side-by-side table


def test_default_output_is_report_html_in_cwd(two_runs, tmp_path, monkeypatch):
    _, url, first, _ = two_runs
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(report, [first, "--store", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_bad_input_is_one_line_exit_2(two_runs, tmp_path):
    _, url, _, _ = two_runs
    result = CliRunner().invoke(report, ["nope", "--store", url])
    assert isinstance(result.exception, BenchInputError)
    group = BenchGroup(commands={"report": report})   # as `bench` will run it once registered
    for args in (["report", "nope", "--store", url], ["report", "--store", url],
                 ["report", "latest", "--store", f"sqlite:///{tmp_path / 'missing.sqlite'}"],
                 ["report", "latest", "--store", url, "-o", str(tmp_path)]):
        result = CliRunner().invoke(group, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "missing.sqlite").exists()
