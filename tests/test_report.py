"""`bench report`: one self-contained, escaped HTML file that opens on the findings, then a figure per
metric, the roofline, the cases by their readable parameters, the fingerprints, the runs side by side.

One real run of a tiny suite (inline executor) is shared by most tests; a second run is made from its
records (every median doubled, "another machine") and a skipped case is added to the first, so the
side-by-side table, ratios and error-state marks are all deterministic. Figures and fits are also
checked on constructed records, and an old (schema 1) H100 store is rendered as it is.
"""
from __future__ import annotations

import dataclasses
import html as htmllib
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.common import BenchGroup
from cli.report import report
from harness.analysis.fits import fit_cost
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from harness.store.db import Store
from reports.findings import run_findings
from reports.html import render_report, write_report
from reports.labels import case_labels
from reports.plots import PlotSpec, figure_svg, metric_figure, resolve_plot_spec
from reports.sentences import fit_text, headline_lines
from tests.helpers import run_tiny, store_slower_copy

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
HEX16 = re.compile(r"\b[0-9a-f]{16}\b")
EVIDENCE = Path("/work/shared/evidence/h100-2026-11-22/h100-fp32.sqlite")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    # --no-report: the tests render their own reports of these runs (make_report); the run's own was never read
    suite, url, result = run_tiny(tmp, "--no-report", text=SUITE)
    assert result.exit_code == 0, result.output
    store = Store(url, create=False)
    first = store.get_run("latest")
    records = store.records(first.id)
    second_id = store_slower_copy(store, first)          # the same suite "on another machine": medians × 2
    # a case the first run skipped (too big for the memory budget)
    template = records[0]
    store.add_record(first.id, CaseRecord(
        SKIPPED_KEY, template.suite, "MHA", template.arch, "skipped",
        "estimated peak 9,999 MiB exceeds the memory budget 8,000 MiB",
        config=template.config, workload={**template.workload, "seq_len": 128},
        metrics={"est_peak_bytes": 9999 * 2**20}))
    return tmp, url, first.id, second_id


def make_report(url: str, *refs: str, output) -> tuple[str, object]:
    result = CliRunner().invoke(report, [*refs, "--store", url, "-o", str(output)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return output.read_text(encoding="utf-8"), result


@pytest.fixture(scope="module")
def page(two_runs):
    tmp, url, first, second = two_runs
    text, _ = make_report(url, first, second, output=tmp / "two.html")
    return text


def visible_text(page: str) -> str:
    """The page's text as a reader sees it (tags, styles and SVG dropped, entities decoded)."""
    page = re.sub(r"<(style|svg)\b.*?</\1>", " ", page, flags=re.S)
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", page))


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


def _rec(line: str, x, status: str = "ok", key: str = "", axis: str = "seq_len", **metrics) -> CaseRecord:
    workload = {"device": "cpu", "dtype": "fp32", "batch_size": 1, "seq_len": 16}
    config = {}
    (workload if axis in workload else config)[axis] = x
    return CaseRecord(key or f"k-{line}-{x}", "s", line, "decoder-tiny", status,
                      workload=workload, config=config, metrics=metrics)


# ---------------------------------------------------------------- the page as a whole

def test_one_self_contained_file(page):
    lowered = page.lower()
    for needle in ("http://", "https://", "src=", "<script", "<link", "@import", "<iframe", "<object"):
        assert needle not in lowered, needle
    assert not re.findall(r"url\((?!#)", lowered)          # only in-page references (SVG clip paths)
    assert not re.findall(r"href=\"(?!#)", lowered)        # only in-page anchors
    assert page.startswith("<!DOCTYPE html>")
    # per run: latency, peak memory, MACs, throughput and the roofline
    assert page.count("<svg") == 2 * 5
    assert len(re.findall(r"<h3 id=\"roofline-\d\">Roofline", page)) == 2
    assert "<style>" in page


def test_html_parses_and_tags_balance(page):
    checker = TagChecker()
    checker.feed(page)
    checker.close()
    assert not checker.problems, checker.problems[:5]
    assert checker.stack == []


def test_page_opens_on_the_findings_then_figures_roofline_cases_environment(two_runs, page):
    _, url, first, _ = two_runs
    store = Store(url, create=False)
    run = store.get_run(first)
    f = run_findings(run, store.records(first))
    for sentence in headline_lines(f)[1:]:                  # the sentences `bench run` prints, word for word
        assert htmllib.escape(sentence.strip(), quote=False) in page, sentence
    order = [page.index(s) for s in ('class="headline"', 'class="figure lead-figure"', 'class="findings"',
                                    'id="aligned-0"', 'id="figures-0"', 'id="roofline-0"', 'id="cases-0"',
                                    'id="env-0"')]
    assert order == sorted(order)
    assert page.index('lead-figure', page.index('id="run-1"')) < page.index('id="aligned-0"')
    findings = page[page.index('<table class="findings">'):]
    findings = findings[:findings.index("</table>")]
    for lf in f.lines:                                      # line × time/memory/MACs fits with CI and regime
        for metric in ("median_ms", "peak_bytes", "macs"):
            assert htmllib.escape(fit_text(lf.fits[metric], f.axis), quote=False) in findings


def test_fingerprint_description_and_every_case_by_its_label(two_runs, page):
    _, url, first, second = two_runs
    store = Store(url, create=False)
    run = store.get_run(first)
    assert htmllib.escape(run.hard_env["cpu"]) in page
    assert "A &lt;b&gt;tiny&lt;/b&gt; suite &amp; friends" in page     # the description, from the stored spec
    assert "The suite file as run" in page and htmllib.escape('[lines]') in page   # the stored suite text
    for ref in (first, second):
        assert ref in page
        records = store.records(ref)
        for label in case_labels(records, "seq_len"):
            assert htmllib.escape(label, quote=False) in page
    assert page.count("<details") == (1 + 7) + (1 + 6) + 2     # per run: raw statistics (and per case); suite text
    assert "p90_ms" in page and "p99_ms" in page and "raw samples" in page


def test_no_case_key_hash_anywhere(two_runs, page):
    _, url, first, second = two_runs
    store = Store(url, create=False)
    for ref in (first, second):
        for r in store.records(ref):
            assert r.case_key not in page
    assert not HEX16.findall(visible_text(page))
    assert re.findall(r'<details id="case-1-\d+"', page)         # element ids are indexes


def test_line_label_is_escaped_everywhere(page):
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()


def test_side_by_side_lists_only_the_shared_cases_by_their_parameters(two_runs, page):
    _, _, first, second = two_runs
    aligned = page[page.index('<table class="aligned">'):]
    aligned = aligned[:aligned.index("</table>")]
    assert first in aligned and second in aligned and "ratio" in aligned
    header = aligned[:aligned.index("</thead>")]
    assert "<th rowspan=\"2\">seq_len</th>" in header and "<th rowspan=\"2\">n_kv_heads</th>" in header
    rows = re.findall(r"<tr><td>(.*?)</td>((?:<td class=\"num\">[^<]*</td>)+)", aligned)
    assert len(rows) == 6                                   # the 6 shared cases, not the skipped one
    labelled = {(htmllib.unescape(line), re.findall(r">([^<]*)<", cells)[0]) for line, cells in rows}
    assert labelled == {(line, n) for line in ("MHA", XSS) for n in ("16", "32", "64")}
    assert aligned.count("2.000×") == 6 + 1                 # every shared case is 2x; and their geometric mean
    assert "absent" not in aligned and "skipped" not in aligned      # the case only the first run has
    assert "The 6 cases every run holds" in page and f"<code>{first}</code> has 1 more" in page
    assert "agree on every hard environment key" in page


def test_runs_in_different_environments_are_called_out(two_runs):
    _, url, first, second = two_runs
    store = Store(url, create=False)
    a, b = store.get_run(first), store.get_run(second)
    env = {**b.env, "hard": {**b.hard_env, "torch": "9.9.9", "cpu": "another CPU"}}
    page = render_report([(a, store.records(first)), (dataclasses.replace(b, env=env), store.records(second))])
    assert "measured in different environments: the hard keys cpu, torch differ" in page
    assert len(re.findall(r'<tr class="differs"><th>(cpu|torch)</th>', page)) == 2


def test_runs_of_different_suites_get_their_own_sections(two_runs):
    _, url, first, _ = two_runs
    store = Store(url, create=False)
    run, records = store.get_run(first), store.records(first)
    other = dataclasses.replace(run, id="20990101-000000-beef", suite="other")
    page = render_report([(run, records), (other, [dataclasses.replace(r, suite="other") for r in records])])
    assert page.count('<section id="suite-') == 2 and 'class="aligned"' not in page
    assert page.index('id="env-0"') < page.index('id="suite-1"') < page.index('id="env-1"')
    assert "bench report · tiny, other" in page


# ---------------------------------------------------------------- figures

def test_skipped_case_is_a_mark_not_a_gap(two_runs, page):
    _, url, first, _ = two_runs
    records = Store(url, create=False).records(first)
    spec = resolve_plot_spec({"x": "seq_len"}, records, "seq_len")
    svg = figure_svg(metric_figure(records, "median_ms", spec))
    assert 'id="status-skipped"' in svg
    assert re.search(r">\s*skipped\s*<", svg)            # its legend entry
    assert svg.startswith("<svg") and "<?xml" not in svg and "http" not in svg
    first_section = page[page.index('id="run-0"'):page.index('id="env-0"')]
    assert 'id="status-skipped"' in first_section and 'class="status-skipped">skipped<' in first_section
    assert "exceeds the memory budget" in first_section


def test_legend_carries_the_scaling_fit_and_the_law_is_drawn_over_the_regime_only():
    xs = [256, 512, 1024, 2048, 4096, 8192]
    ys = [4.5, 4.4, 4.6, 10.0, 40.0, 160.0]                 # a launch-bound floor, then n²
    records = [_rec("eager", x, median_ms=y, ci_low_ms=0.9 * y, ci_high_ms=1.1 * y) for x, y in zip(xs, ys)]
    records.append(_rec("eager", 16384, status="oom"))
    spec = resolve_plot_spec({}, records, "seq_len")
    assert spec == PlotSpec("seq_len", "median_ms", x_log=True, y_log=True, title=None, numeric=True)
    fig = metric_figure(records, "median_ms", spec)
    fit = fit_cost(xs, ys)
    assert fit.x_min == 2048 and fit.exponent == pytest.approx(2.0, abs=0.01)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"eager: {fit_text(fit, 'seq_len', regime=False)}" in labels and "oom" in labels
    ax = fig.axes[0]
    band = next(ln for ln in ax.get_lines() if ln.get_gid() == "fit-0")
    assert min(band.get_xdata()) == pytest.approx(2048) and max(band.get_xdata()) == pytest.approx(8192)
    floor = next(ln for ln in ax.get_lines() if ln.get_gid() == "floor-0")
    assert list(floor.get_xdata()) == [256, 512, 1024]      # drawn, hollow, outside the fitted range
    assert floor.get_markerfacecolor() == "white"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    svg = figure_svg(fig)
    assert 'id="fit-0"' in svg and 'id="floor-0"' in svg and 'id="status-oom"' in svg


def test_a_falling_metric_is_fitted_on_its_reciprocal():
    xs = [256, 512, 1024, 2048, 4096, 8192]
    times = [4.5, 4.4, 4.6, 10.0, 40.0, 160.0]
    fit = fit_cost(xs, [1e3 / t for t in times])         # throughput: items per second
    time_fit = fit_cost(xs, times)
    assert fit.exponent == pytest.approx(-time_fit.exponent)
    assert (fit.fit.ci_low, fit.fit.ci_high) == pytest.approx((-time_fit.fit.ci_high, -time_fit.fit.ci_low))
    assert fit.x_min == time_fit.x_min and len(fit.floor) == 3


def test_a_categorical_axis_gets_categories():
    records = [_rec(line, pos, axis="positions", median_ms=ms, macs=1e9)
               for line, ms in (("a", 1.0), ("b", 2.0)) for pos in ("sinusoidal", "rope", "alibi")]
    spec = resolve_plot_spec({}, records, "positions")
    assert not spec.numeric and not spec.x_log
    fig = metric_figure(records, "median_ms", spec)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sinusoidal", "rope", "alibi"]
    assert ax.get_xscale() == "linear"
    page = render_report([(RunRecord("r", "s", False, "done", 6, "now"), records)])
    assert page.count("<svg") == 3                          # latency, MACs (nothing else measured), roofline
    assert "Not measured in this run: peak memory, throughput" in page


def test_the_suites_plot_spec_titles_the_lead_figure(two_runs):
    _, url, first, _ = two_runs
    store = Store(url, create=False)
    run = store.get_run(first)
    spec = dataclasses.replace(run.spec, plot={**run.spec.plot, "title": "Latency <by> $n$", "y": "memory"})
    page = render_report([(dataclasses.replace(run, spec=spec, suite_path="/nonexistent/gone.toml"),
                           store.records(first))])
    lead = page[page.index('class="figure lead-figure"'):]
    lead = lead[:lead.index("</svg>")]
    assert "Latency &lt;by&gt; $n$" in lead and "peak memory (MiB)" in lead    # y = memory leads
    assert "A &lt;b&gt;tiny&lt;/b&gt; suite" in page        # from the stored spec, not the (gone) file


def test_an_old_schema_1_store_renders(tmp_path):
    if not EVIDENCE.exists():
        pytest.skip(f"{EVIDENCE} is not on this machine")
    copy = tmp_path / EVIDENCE.name
    shutil.copyfile(EVIDENCE, copy)
    store = Store(f"sqlite:///{copy}", create=False)
    run = next(r for r in store.list_runs() if r.suite == "attention_scaling")
    assert run.spec is None and run.suite_text is None
    page = render_report([(run, store.records(run.id))])
    assert "stored before schema 2" in page and "The suite text was not stored" in page
    assert "How each line scales with seq_len" in page and "n^" in page
    assert page.count("<svg") == 5
    above = page[page.index('class="note warn above-roof"'):]
    assert "sdpa MHA fwd · seq_len=16384" in above[:above.index("</div>")]     # 108.7 % of the fp32 peak
    assert not HEX16.findall(visible_text(page))


# ---------------------------------------------------------------- the command and write_report

def test_default_output_is_report_html_in_cwd(two_runs, tmp_path, monkeypatch):
    _, url, first, _ = two_runs
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(report, [first, "--store", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_write_report_refuses_a_directory_or_an_unwritable_path(two_runs, tmp_path):
    _, url, first, _ = two_runs
    store = Store(url, create=False)
    runs = [(store.get_run(first), store.records(first))]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad in (tmp_path, blocker / "report.html"):
        with pytest.raises(BenchInputError):
            write_report(bad, runs)
    write_report(tmp_path / "new" / "report.html", runs)       # a missing folder is made
    assert (tmp_path / "new" / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_bad_input_is_one_line_exit_2(two_runs, tmp_path):
    _, url, _, _ = two_runs
    result = CliRunner().invoke(report, ["nope", "--store", url])
    assert isinstance(result.exception, BenchInputError)
    group = BenchGroup(commands={"report": report})   # as `bench` runs it
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["report", "nope", "--store", url], ["report", "--store", url],
                 ["report", "latest", "--store", f"sqlite:///{tmp_path / 'missing.sqlite'}"],
                 ["report", "latest", "--store", url, "-o", str(tmp_path)],
                 ["report", "latest", "--store", url, "-o", str(blocker / "x.html")],
                 ["report", "latest", "--store", url, "--claims", str(blocker)]):
        result = CliRunner().invoke(group, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "missing.sqlite").exists()


# ---------------------------------------------------------------- the SDPA backend of each case

@dataclasses.dataclass(frozen=True)
class _SdpaRecord(CaseRecord):
    """A record with the ``sdpa_backend`` field the runner stores (declared here too, so the test runs
    before and after CaseRecord has it)."""

    sdpa_backend: str = ""


def _with_backend(rec: CaseRecord, backend: str) -> CaseRecord:
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(CaseRecord)}
    return _SdpaRecord(**{**fields, "sdpa_backend": backend})


def _sdpa_records(backends):
    return [_with_backend(_rec("sdpa causal", x, median_ms=float(x), flops=1e6 * x), b)
            for x, b in zip((16, 32, 64), backends)]


def _terminal_text(records) -> str:
    from rich.console import Console
    from reports.terminal import cases_table
    console = Console(record=True, width=250, color_system=None)
    console.print(cases_table(records, "seq_len", title="run r"))
    return console.export_text()


def test_sdpa_backend_is_a_column_where_a_case_recorded_one():
    records = _sdpa_records(["flash", "efficient+math", ""])
    text = _terminal_text(records)
    header = next(ln for ln in text.splitlines() if "median ms" in ln)
    assert "sdpa" in header and "flash" in text and "efficient+math" in text
    run = RunRecord("r", "s", False, "done", 3, "2026-01-01T00:00:00+00:00")
    page = render_report([(run, records)])
    head = page[page.index('<table class="cases">'):]
    head = head[:head.index("</thead>")]
    assert "<th>sdpa_backend</th>" in head
    body = page[page.index('<table class="cases">'):]
    body = body[:body.index("</table>")]
    assert '<td class="num">efficient+math</td>' in body and '<td class="num">–</td>' in body


def test_no_sdpa_backend_column_without_one():
    for records in (_sdpa_records(["", "", ""]), [_rec("eager", x, median_ms=1.0) for x in (16, 32)]):
        header = next(ln for ln in _terminal_text(records).splitlines() if "median ms" in ln)
        assert "status" in header and "sdpa" not in header
        run = RunRecord("r", "s", False, "done", len(records), "2026-01-01T00:00:00+00:00")
        page = render_report([(run, records)])
        assert "<th>sdpa_backend</th>" not in page


def test_runs_on_different_devices_are_aligned_by_case_and_headed_by_device(two_runs):
    """A suite measured on a CPU and on a GPU: the case keys differ (the device is part of them), so the runs are
    matched on architecture, config and workload, and each column says where it ran."""
    _, url, first, second = two_runs
    store = Store(url, create=False)
    a, b = store.get_run(first), store.get_run(second)
    gpu = [dataclasses.replace(r, case_key="gpu-" + r.case_key, workload={**r.workload, "device": "cuda"})
           for r in store.records(second)]
    env = {**b.env, "hard": {**b.hard_env, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "cuda": "13.0"}}
    page = render_report([(a, store.records(first)), (dataclasses.replace(b, env=env), gpu)])
    aligned = page[page.index('<table class="aligned">'):]
    aligned = aligned[:aligned.index("</table>")]
    assert "cuda · NVIDIA H100 80GB HBM3" in aligned and "cpu · " in aligned
    assert aligned.count("2.000×") == 6 + 1                 # the same 6 shared cases, matched across devices
    assert "measured on different devices" in page
