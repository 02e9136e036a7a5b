"""Energy in the reports: beside time where measured (J/sample against the run's axis, the energy table, the
roofline's average power, the terminal table), and, where asked for and absent, the reason — never a 0."""
from __future__ import annotations

from harness.contract.records import CaseRecord, RunRecord, SuiteSpec
from reports import energy_view
from reports.html import render_report
from reports.terminal import cases_table

REASON = "no energy counter on this machine (no RAPL counter under /sys/class/powercap)"


def _rec(batch: int, energy: bool) -> CaseRecord:
    metrics = {"median_ms": 10.0 * batch, "macs": 1e9 * batch, "params": 1e6}
    message = ""
    if energy:
        metrics.update(energy_j=2.0 * batch, energy_per_sample_j=2.0, avg_power_w=200.0 + batch,
                       energy_window_s=3.0, energy_step_share=0.004, energy_power_integral_j=2.1 * batch)
    else:
        message = f"energy not measured: {REASON}"
    return CaseRecord(f"k{batch}", "s", "resnet", "resnet-micro", "ok", message,
                      workload={"device": "cuda", "dtype": "bf16", "batch_size": batch, "img_size": 64},
                      metrics=metrics)


def _run(records, energy: bool) -> tuple[RunRecord, list[CaseRecord]]:
    run = RunRecord("r1", "s", False, "done", len(records), "2026-11-25T00:00:00", options={"energy": energy},
                    spec=SuiteSpec(sweep={"batch_size": [r.workload["batch_size"] for r in records]}))
    return run, records


def test_measured_energy_is_drawn_against_the_axis_and_tabled_beside_time():
    records = [_rec(b, True) for b in (1, 2, 4)]
    page = render_report([_run(records, True)])
    assert 'id="energy-0"' in page and "J / sample" in page
    assert "energy per sample (J)" in page                   # the figure's axis label
    assert "avg W" in page and "202.0" in page and "(1.05×)" in page   # power integral beside the counter
    assert "Energy pass: average power over the energy windows: median 202.0 W (201.0 – 204.0 W) over 3 cases" \
        in page                                                # the roofline's note
    assert "Energy not measured" not in page


def test_absent_energy_shows_its_reason_never_zero():
    records = [_rec(b, False) for b in (1, 2)]
    page = render_report([_run(records, True)])
    assert "Energy not measured</b>: " + REASON in page
    assert "J / sample" not in page and "0 J" not in page
    assert energy_view.reasons(records) == [REASON]


def test_a_run_that_did_not_ask_for_energy_says_nothing_about_it():
    records = [CaseRecord("k", "s", "a", "x", "ok", workload={"batch_size": 1}, metrics={"median_ms": 1.0})]
    page = render_report([_run(records, False)])
    assert 'id="energy-0"' not in page and "energy per sample" not in page


def test_terminal_table_has_energy_columns_only_where_measured():
    from rich.console import Console
    mixed = [_rec(1, True), _rec(2, False)]
    console = Console(width=250, record=True)
    console.print(cases_table(mixed, "batch_size"))
    text = console.export_text()
    assert "J/call" in text and "avg W" in text and "201.0" in text and "energy not measured" in text
    console = Console(width=250, record=True)
    console.print(cases_table([_rec(1, False)], "batch_size"))
    assert "J/call" not in console.export_text()
