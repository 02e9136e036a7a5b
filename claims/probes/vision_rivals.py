"""The vision rivals of 004: LR-Net-50 — local relation (attention) layers in place of every spatial conv of
ResNet-50 — against ResNet-50 at equal FLOPs, from the vision_zoo suite (counted MACs and parameters, batch-1
latency timed side by side), with the published accuracy beside it."""
from __future__ import annotations

from typing import Any

from claims.evidence import Context
from claims.model import Chart, Evidence, Figure
from claims.probes import median_ratio, one_dtype, probe, select, series
from claims.probes.vision import published

SUITE = "vision_zoo"
LRNET, RESNET = "lrnet-50", "resnet50"
LRNET_TOP1 = (77.3, "Hu et al. 2019 (LR-Net), LR-Net-50 (7×7, m=8) 77.3 % ImageNet top-1, 23.3 M, 4.3 GFLOPs "
                    "(as tabulated by Wang et al. 2020, Axial-DeepLab, Table 1)")

FIGURES = ("macs_ratio_lrnet_resnet", "params_ratio_lrnet_resnet", "latency_ratio_lrnet_resnet",
           "latency_per_mac_ratio_lrnet_resnet", "acc_gap_lrnet_resnet")


def _pair(rows: list[Any]) -> tuple[int | None, Any, Any]:
    """The largest image size at batch 1 where both LR-Net-50 and ResNet-50 ran, and their two records."""
    rows = select(one_dtype(rows), batch_size=1)
    sizes = sorted({r.value("img_size") for r in rows if r.arch == LRNET}
                   & {r.value("img_size") for r in rows if r.arch == RESNET})
    if not sizes:
        return None, None, None
    side = sizes[-1]
    by = {r.arch: r for r in rows if r.value("img_size") == side}
    return side, by.get(LRNET), by.get(RESNET)


@probe("lrnet", figures=FIGURES, reads=("suite vision_zoo",))
def lrnet(ctx: Context) -> Evidence:
    """LR-Net-50 / ResNet-50: counted MACs and parameters (same FLOPs?), batch-1 latency timed side by side at the
    largest common image size (what equal FLOPs cost on this machine), and the published top-1 gap (not
    measured: ImageNet training is out of reach here)."""
    run, rows = ctx.suite(SUITE)
    ev = Evidence(sources=[run.id])
    side, lr, rn = _pair(rows)
    if lr is None or rn is None:
        why = f"the {SUITE} run has no batch-1 pair of {LRNET} and {RESNET} at one image size"
        for name in FIGURES[:4]:
            ev.unavailable[name] = why
    else:
        where = f"at {side}², batch 1"
        for key, metric in (("macs", "macs"), ("params", "params")):
            a, b = lr.metric(metric), rn.metric(metric)
            if a and b:
                ev.figures[f"{key}_ratio_lrnet_resnet"] = Figure(
                    a / b, unit="×", provenance="counted", note=f"counted {metric} {where}: {a / 1e9 if key == 'macs' else a / 1e6:.3g} "
                    f"{'G' if key == 'macs' else 'M'} / {b / 1e9 if key == 'macs' else b / 1e6:.3g} "
                    f"{'G' if key == 'macs' else 'M'}")
            else:
                ev.unavailable[f"{key}_ratio_lrnet_resnet"] = f"the {SUITE} run has no counted {metric} {where}"
        lat = median_ratio(lr, rn, f"batch-1 latency, LR-Net-50 / ResNet-50 {where}")
        ev.figures["latency_ratio_lrnet_resnet"] = lat
        macs = ev.figures.get("macs_ratio_lrnet_resnet")
        if macs is not None and lat.value == lat.value:
            scale = 1.0 / macs.value
            ev.figures["latency_per_mac_ratio_lrnet_resnet"] = Figure(
                lat.value * scale, lat.lo * scale if lat.lo is not None else None,
                lat.hi * scale if lat.hi is not None else None, "×",
                f"time per counted MAC, LR-Net-50 / ResNet-50 {where} (latency ratio ÷ MAC ratio)", lat.n,
                busy=lat.busy, processes=lat.processes, provenance="derived")
        else:
            ev.unavailable["latency_per_mac_ratio_lrnet_resnet"] = "needs both the MAC and the latency ratio"
    acc, src = LRNET_TOP1
    rn_acc = published("resnet50")["acc1"]
    ev.figures["acc_gap_lrnet_resnet"] = Figure(
        acc - rn_acc, unit="percentage points of top-1",
        note=f"published, not measured: {src}; ResNet-50 {rn_acc} % (torchvision metadata); different training recipes",
        quoted="Hu et al. 2019 (LR-Net) via Wang et al. 2020 Table 1; torchvision metadata (ResNet-50)")
    ev.chart = Chart("LR-Net-50 vs ResNet-50: batch-1 latency vs image size", "image side (px)", "ms",
                     series([r for r in select(one_dtype(rows), batch_size=1) if r.arch in (LRNET, RESNET)],
                            "img_size", "median_ms"))
    return ev
