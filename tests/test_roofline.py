"""Bytes moved (harness.instruments.flops), the roofline figure (reports.roofline) and the terminal ``% peak`` column.

``bytes_moved`` is checked against analytic truths: each op reads its tensor operands and writes its
results once (no reuse across ops), views move nothing. The roofline is drawn from a real tiny run
(inline executor, calibrated peak) and from constructed records with metrics missing or above the roof.
"""
from __future__ import annotations

import re

import pytest
import torch
from rich.console import Console
from torch import nn

from harness.contract import registry
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_flops, count_model
from harness.instruments.traffic import count_bytes
from harness.contract.records import CaseRecord, RunRecord
from harness.engine.runner import fake_pass
from harness.contract.spec import Workload
from harness.store.db import Store
from reports.html import render_report
from reports.plots import figure_svg
from reports.roofline import ABOVE_ROOF_MEANING, roofline_data, roofline_figure
from reports.frames import executed_flops, rates, roofline_point
from reports.terminal import cases_table

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------
# 1. bytes_moved: analytic truths
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n", [(3, 5, 7), (64, 32, 16), (1, 128, 1)])
def test_matmul_moves_its_operands_and_result_once(m, k, n):
    a, b = torch.randn(m, k), torch.randn(k, n)
    counted = count_flops(lambda: a @ b)
    assert counted.bytes_moved == 4 * (m * k + k * n + m * n)
    assert counted.bytes_by_op == {"aten.mm": 4 * (m * k + k * n + m * n)}
    assert counted.intensity == pytest.approx(2 * m * k * n / (4 * (m * k + k * n + m * n)))


def test_bytes_follow_the_dtype():
    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16)
    assert count_bytes(lambda: a @ b)[0] == 2 * (8 * 16 + 16 * 4 + 8 * 4)


def test_elementwise_add_moves_12n_bytes():
    n = 1000
    x, y = torch.randn(n), torch.randn(n)
    assert count_bytes(lambda: x + y) == (12 * n, {"aten.add": 12 * n})


@pytest.mark.parametrize("view", [
    lambda t: t.view(6, 4), lambda t: t.reshape(4, 6), lambda t: t.transpose(0, 1), lambda t: t.t(),
    lambda t: t.permute(1, 0), lambda t: t[1:3], lambda t: t[2], lambda t: t.detach(),
    lambda t: t.unsqueeze(0).expand(5, 12, 2), lambda t: t.as_strided((2, 2), (1, 1)),
], ids=["view", "reshape", "transpose", "t", "permute", "slice", "select", "detach", "expand", "as_strided"])
def test_views_move_nothing(view):
    x = torch.randn(12, 2)
    assert count_bytes(lambda: view(x)) == (0, {})


def test_in_place_reads_and_writes_self_copy_only_writes():
    n = 100
    x, y = torch.randn(n), torch.randn(n)
    assert count_bytes(lambda: x.add_(y))[0] == 12 * n        # read x, y; write x
    assert count_bytes(lambda: x.copy_(y))[0] == 8 * n         # read y; write x (not read)
    assert count_bytes(lambda: x.zero_())[0] == 4 * n          # write only


def test_broadcast_input_counts_its_distinct_elements():
    col, full = torch.randn(10, 1), torch.randn(10, 30)
    # the expanded (10, 30) view has stride 0 along dim 1: 10 distinct floats are read, not 300
    assert count_bytes(lambda: col.expand(10, 30) + full)[0] == 4 * (10 + 300 + 300)


def test_linear_with_bias_is_one_addmm():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    moved, by_op = count_bytes(lambda: lin(x))
    assert by_op == {"aten.addmm": 4 * (8 + 4 * 16 + 16 * 8 + 4 * 8)}     # bias, x, Wᵀ (a view of W), out
    assert moved == sum(by_op.values())


def test_fake_and_real_tensors_count_the_same_bytes():
    spec = registry.resolve("decoder-tiny", n_layers=1)
    w = Workload(batch_size=1, seq_len=32)
    torch.manual_seed(0)
    real = spec.build(spec.config).eval()
    real_count = count_model(real, spec.make_inputs(spec.config, w, CPU))
    mode = new_fake_mode()
    fake = build_fake(lambda: spec.build(spec.config).eval(), mode, CPU)
    with mode:
        fake_count = count_model(fake, spec.make_inputs(spec.config, w, CPU))
    assert real_count.bytes_moved > 0
    assert fake_count.bytes_moved == real_count.bytes_moved
    assert fake_count.bytes_by_op == real_count.bytes_by_op


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_fake_pass_stores_bytes_moved(mode):
    spec = registry.resolve("decoder-tiny", n_layers=1)
    w = Workload(batch_size=1, seq_len=32, mode=mode)
    metrics = fake_pass(spec, w, CPU, want_flops=True)
    # at least the parameters are read once per pass (more in fwd_bwd: their gradients are written)
    assert metrics["bytes_moved"] >= 4 * metrics["params"]
    assert 0 < metrics["flops"] / metrics["bytes_moved"] < 1e3
    assert "bytes_moved" not in fake_pass(spec, w, CPU, want_flops=False)


# ------------------------------------------------------------------------------------------
# 2. The roofline figure, from a real tiny run
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tiny_store):
    """The tiny run measured once per process (conftest's ``tiny_store``: calibrated, one thread)."""
    _, url = tiny_store
    store = Store(url, create=False)
    run = store.get_run("latest")
    return run, store.records(run.id)


def _points(fig, prefix: str = "") -> list[tuple[float, float]]:
    """Every case marker (``points-<i>``, and ``above-roof-<i>``), or only those whose gid starts with ``prefix``."""
    ax = fig.axes[0]
    out = []
    for coll in ax.collections:
        gid = coll.get_gid() or ""
        if gid.startswith(prefix or ("points-", "above-roof-")):
            out.extend((float(x), float(y)) for x, y in coll.get_offsets())
    return out


def _line(fig, gid: str):
    hits = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == gid]
    assert len(hits) == 1, [ln.get_gid() for ln in fig.axes[0].get_lines()]
    return hits[0]


def test_roofline_has_one_point_per_case_and_the_measured_roofs(tiny_run):
    run, records = tiny_run
    peak = run.peak
    top, bw = peak["cpu"]["matmul_flops_per_s"]["fp32"], peak["cpu"]["copy_bytes_per_s"]
    fig = roofline_figure(records, peak)
    executed = {r.case_key: 2 * r.metrics["executed_macs"] for r in records}     # what the kernels ran
    assert any(executed[r.case_key] < r.metrics["flops"] for r in records)      # the tiny suite's causal SDPA
    expected = sorted((executed[r.case_key] / r.metrics["bytes_moved"],
                       executed[r.case_key] / (r.metrics["median_ms"] / 1e3)) for r in records)
    assert len(records) == 6 and all(r.ok for r in records)
    got = sorted(_points(fig))
    assert len(got) == len(expected) == 6                     # one marker per measured case
    assert [v for p in got for v in p] == pytest.approx([v for p in expected for v in p], rel=1e-9)
    ridge = top / bw
    compute = _line(fig, "roof-compute-fp32")
    assert list(compute.get_ydata()) == pytest.approx([top, top])   # flat at the matmul peak
    assert compute.get_xdata()[0] == pytest.approx(ridge)
    memory = _line(fig, "roof-memory-fp32")
    for x, y in zip(memory.get_xdata(), memory.get_ydata()):
        assert y == pytest.approx(bw * x)                     # the bandwidth slope y = bandwidth · x
    marker = _line(fig, "ridge-fp32")
    assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (pytest.approx(ridge), pytest.approx(top))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP/byte" in ax.get_xlabel() and "FLOP/s" in ax.get_ylabel()
    assert any("FLOPs = 2·MACs" in t.get_text() for t in fig.texts)


def test_roofline_svg_and_html_section(tiny_run):
    run, records = tiny_run
    data = roofline_data(records, run.peak)
    svg = figure_svg(roofline_figure(records, run.peak, data))
    for gid in ("roof-compute-fp32", "roof-memory-fp32", "ridge-fp32"):
        assert f'id="{gid}"' in svg
    page = render_report([(run, records)])
    assert page.count("<svg") == 5                             # latency, memory, MACs, throughput; the roofline
    section = page[page.index('<h3 id="roofline-0">Roofline'):page.index('id="cases-0"')]
    assert 'id="roof-compute-fp32"' in section and "How to read it" in section
    assert "6 cases plotted" in section and "left out" not in section
    assert ("above the roof" in section) == bool(data.above_roof)


# ------------------------------------------------------------------------------------------
# 3. Constructed records: missing metrics are left out and counted, a point above the roof is flagged
# ------------------------------------------------------------------------------------------

def _rec(key, line, status="ok", seq_len=16, **metrics) -> CaseRecord:
    return CaseRecord(key, "s", line, "decoder-tiny", status,
                      workload={"device": "cpu", "dtype": "fp32", "seq_len": seq_len}, metrics=metrics)


PEAK = {"cpu": {"matmul_flops_per_s": {"fp32": 100e9}, "copy_bytes_per_s": 10e9}}


def _run(peak=PEAK) -> RunRecord:
    return RunRecord("r", "s", False, "done", 5, "2026-01-01T00:00:00+00:00", options={"peak": peak})


def test_missing_metrics_are_left_out_and_counted():
    records = [_rec("a", "L1", flops=4e9, bytes_moved=1e8, median_ms=100.0),
               _rec("b", "L1", seq_len=32, flops=4e9, median_ms=100.0),        # an old run: no bytes_moved
               _rec("c", "L2", bytes_moved=1e8, median_ms=10.0),               # no flops counted
               _rec("d", "L2", status="oom", seq_len=32, flops=4e9, bytes_moved=1e8),
               _rec("e", "L2", status="skipped", seq_len=64, est_peak_bytes=1e12)]
    data = roofline_data(records, PEAK)
    assert data.n_points == 1 and data.left_out == 2 and data.not_ok == 2 and data.above_roof == []
    fig = roofline_figure(records, PEAK)
    assert _points(fig) == [(pytest.approx(40.0), pytest.approx(40e9))]       # 4e9 / 1e8, 4e9 / 0.1 s
    assert any("2 ok case(s) left out" in t.get_text() for t in fig.texts)
    page = render_report([(_run(), records)])
    assert "1 case plotted; 2 ok cases left out" in page and "2 cases not ok" in page
    assert "above the roof" not in page


def test_a_point_above_the_roof_is_flagged_and_listed():
    records = [_rec("a", "L1", seq_len=16, flops=4e9, bytes_moved=1e8, median_ms=100.0),   # 40 GFLOP/s: under
               _rec("b", "L1", seq_len=32, flops=4e9, bytes_moved=1e7, median_ms=10.0),    # 400 > peak 100
               _rec("c", "L2", seq_len=16, flops=1e9, bytes_moved=1e9, median_ms=50.0)]    # 20 > 10 · 1 (bandwidth)
    data = roofline_data(records, PEAK)
    assert [(p.label, p.roof) for p in data.above_roof] == [("L1 · seq_len=32", pytest.approx(100e9)),
                                                            ("L2", pytest.approx(10e9))]
    fig = roofline_figure(records, PEAK, data)
    assert _points(fig, "points-") == [(pytest.approx(40.0), pytest.approx(40e9))]
    assert sorted(_points(fig, "above-roof-")) == [(pytest.approx(1.0), pytest.approx(20e9)),
                                                   (pytest.approx(400.0), pytest.approx(400e9))]
    stars = [c for c in fig.axes[0].collections if (c.get_gid() or "").startswith("above-roof-")]
    assert stars and all(c.get_sizes()[0] > 28 for c in stars)      # bigger than a case marker, a star
    assert any("2 point(s) above the roof" in t.get_text() for t in fig.texts)
    assert any("above the roof (2)" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    page = render_report([(_run(), records)])
    note = page[page.index('class="note warn above-roof"'):]
    note = note[:note.index("</div>")]
    assert "2 points above the roof" in note and ABOVE_ROOF_MEANING in note
    assert "causal attention" in note and "a stale calibration" in note
    assert "L1 · seq_len=32: 400.0 GFLOP/s achieved, roof 100.0 GFLOP/s (4.00×)" in note
    assert "L2: 20.0 GFLOP/s achieved, roof 10.0 GFLOP/s (2.00×)" in note
    assert 'id="above-roof-0"' in page and 'id="above-roof-1"' in page


def test_without_a_peak_nothing_is_above_a_roof():
    records = [_rec("b", "L1", flops=4e9, bytes_moved=1e7, median_ms=10.0)]
    assert roofline_data(records, {}).above_roof == []
    only_peak = {"cpu": {"matmul_flops_per_s": {"fp32": 100e9}}}          # no bandwidth: the flat roof only
    assert [p.roof for p in roofline_data(records, only_peak).above_roof] == [pytest.approx(100e9)]


@pytest.mark.parametrize("peak", [None, {}, {"cuda": PEAK["cpu"]}], ids=["none", "empty", "other-device"])
def test_no_peak_draws_points_without_roofs(peak):
    records = [_rec("a", "L1", flops=4e9, bytes_moved=1e8, median_ms=100.0)]
    fig = roofline_figure(records, peak)
    assert len(_points(fig)) == 1
    assert not [ln for ln in fig.axes[0].get_lines() if (ln.get_gid() or "").startswith(("roof-", "ridge-"))]
    assert any("no measured peak" in t.get_text() for t in fig.texts)
    figure_svg(fig)                                            # renders


def test_no_usable_case_at_all():
    for records in ([], [_rec("a", "L1", status="error")], [_rec("b", "L1", median_ms=3.0)]):
        fig = roofline_figure(records, PEAK)
        assert _points(fig) == []
        assert "<svg" in figure_svg(fig)


# ------------------------------------------------------------------------------------------
# 4. The terminal table's % peak column
# ------------------------------------------------------------------------------------------

def _column(table, header: str) -> list[str]:
    col = next(c for c in table.columns if c.header == header)
    return [str(cell) for cell in col._cells]


def test_terminal_pct_peak_column():
    records = [_rec("a", "L1", flops=2e9, median_ms=100.0, bytes_moved=1e8),   # 20 GFLOP/s of 80: 25.0 %
               _rec("b", "L1", seq_len=32, flops=1e9, median_ms=3.0),          # 333.3 GFLOP/s: 416.7 %
               _rec("c", "L1", seq_len=64, median_ms=5.0),                     # no flops: blank
               _rec("d", "L1", status="oom", seq_len=128, flops=2e9)]          # no timing: blank
    peak = {"cpu": {"matmul_flops_per_s": {"fp32": 80e9}, "copy_bytes_per_s": 5e9}}
    table = cases_table(records, "seq_len", title="run r", peak=peak)
    assert _column(table, "% peak") == ["25.0", "416.7 ⚠", "", ""]               # above 100 %: flagged, not clipped
    console = Console(record=True, width=250, color_system=None)
    console.print(table)
    text = console.export_text()
    assert "% peak" in text and re.search(r"\b25\.0\b", text)
    assert "⚠ % peak above 100" in text                                       # the caption says what it means
    assert _column(cases_table(records, "seq_len", peak=None), "% peak") == ["", "", "", ""]
    other_dtype = {"cpu": {"matmul_flops_per_s": {"bf16": 80e9}}}
    assert _column(cases_table(records, "seq_len", peak=other_dtype), "% peak") == ["", "", "", ""]
    html = render_report([(_run(peak), records)])
    assert '<td class="num">25.0</td>' in html                                 # the same % peak, and over
    assert '<td class="num over-peak">416.7</td>' in html                     # 100 % it is flagged


# ------------------------------------------------------------------------------------------
# 5. Executed FLOPs: % peak and the roofline use executed_macs where a record has it
# ------------------------------------------------------------------------------------------

def test_pct_peak_uses_executed_macs_and_flags_over_100():
    """Causal SDPA: 4 GFLOP counted dense, 2.2 GFLOP executed, in 10 ms on a 250 GFLOP/s peak: 88 % of peak
    from the executed count (160 % from the dense one); a case without executed_macs keeps the dense count."""
    peak = {"cpu": {"matmul_flops_per_s": {"fp32": 250e9}, "copy_bytes_per_s": 10e9}}
    causal = _rec("a", "L1", flops=4e9, macs=2e9, executed_macs=1.1e9, bytes_moved=1e7, median_ms=10.0)
    dense = _rec("b", "L1", seq_len=32, flops=4e9, macs=2e9, bytes_moved=1e7, median_ms=10.0)
    table = cases_table([causal, dense], "seq_len", peak=peak)
    assert _column(table, "% peak") == ["88.0", "160.0 ⚠"]
    assert rates(causal, peak) == pytest.approx({"achieved_flops_per_s": 400e9, "executed_flops_per_s": 220e9,
                                                 "peak_share": 0.88})
    assert "executed_flops_per_s" not in rates(dense, peak)
    html = render_report([(_run(peak), [causal, dense])])
    assert '<td class="num">88.0</td>' in html and '<td class="num over-peak">160.0</td>' in html
    assert "160.0 ⚠" not in html                                    # the HTML marks it with its class


def test_exactly_100_percent_is_not_flagged_and_116_is():
    peak = {"cpu": {"matmul_flops_per_s": {"fp32": 100e9}}}
    at = _rec("a", "L1", flops=1e9, median_ms=10.0)                   # 100.0 %
    over = _rec("b", "L1", seq_len=32, flops=1.16e9, median_ms=10.0)  # 116.0 %
    assert _column(cases_table([at, over], "seq_len", peak=peak), "% peak") == ["100.0", "116.0 ⚠"]


def test_roofline_point_uses_executed_flops():
    """The same counted FLOPs with and without executed_macs: the executed point sits under the roof
    (40 GFLOP/s at 8 FLOP/byte, roof 80), the dense one above it (200 GFLOP/s at 40 FLOP/byte, roof 100)."""
    causal = _rec("a", "L1", flops=4e9, executed_macs=0.4e9, bytes_moved=1e8, median_ms=20.0)
    dense = _rec("b", "L2", flops=4e9, bytes_moved=1e8, median_ms=20.0)
    assert roofline_point(causal) == (pytest.approx(8.0), pytest.approx(40e9))
    assert roofline_point(dense) == (pytest.approx(40.0), pytest.approx(200e9))
    data = roofline_data([causal, dense], PEAK)                        # roofs: 100 GFLOP/s, 10 GB/s
    assert [(p.line, p.roof) for p in data.above_roof] == [("L2", pytest.approx(100e9))]
    assert [(p.intensity, p.achieved, p.roof) for p in data.points["L1"]] == [
        (pytest.approx(8.0), pytest.approx(40e9), pytest.approx(80e9))]


def test_executed_flops_falls_back_to_the_count():
    assert executed_flops(_rec("a", "L1", flops=4e9, executed_macs=1e9)) == 2e9
    assert executed_flops(_rec("a", "L1", flops=4e9)) == 4e9
    assert executed_flops(_rec("a", "L1")) is None
