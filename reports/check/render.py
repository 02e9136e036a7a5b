"""The check's report as text: the headline, the power line, a rich table for the terminal and Markdown for a
pull-request comment."""
from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from reports.check.adaptive import Reach
from reports.check.report import FAILING, VERDICTS, CheckReport, CheckRow
from reports.check.timing import ALPHA, MIN_EFFECT

MARK = {"ok": "✅", "regressed": "🔴", "improved": "🟢", "changed": "🟠", "failed": "💥", "missing": "❔",
        "new": "🆕", "inconclusive": "⚪"}
STYLE = {"ok": "green", "regressed": "bold red", "improved": "green", "changed": "red", "failed": "bold red",
         "missing": "red", "new": "cyan", "inconclusive": "yellow"}


def headline(report: CheckReport) -> str:
    """What the check showed, in one line: ``❌ 2 regressed, 1 changed (of 12 cases)``; ``✅ unchanged within 5 %
    (12 cases: 12 ok)`` only when every gated timing's whole interval lies within the floor; otherwise
    ``⚪ no regression seen (could see ≥ 23 %) (12 cases: 9 ok, 3 inconclusive)`` — the largest slowdown some
    timing could have missed."""
    n = report.summary
    total = len(report.rows)
    if report.failed:
        bad = ", ".join(f"{n[v]} {v}" for v in FAILING if n[v])
        return f"❌ {bad} (of {total} cases)"
    rest = ", ".join(f"{n[v]} {v}" for v in VERDICTS if n[v] and v not in FAILING)
    counts = f" ({total} cases" + (f": {rest})" if rest else ")")
    timed = report.gated_timings()
    if not timed:
        return f"✅ no regression{counts[:-1]}; no timing gated)"
    blind = report.blind_mde()
    if blind is not None:
        return f"⚪ no regression seen (could see ≥ {100 * blind:.0f} %){counts}"
    improved = any(r.timing.verdict == "improved" for r in timed)
    return f"✅ {'improved or ' if improved else ''}unchanged within {100 * MIN_EFFECT:.0f} %{counts}"


def power_line(report: CheckReport) -> str:
    """How little a green check proves: the smallest slowdown each timing verdict could have seen (its minimum
    detectable effect), as the median and the largest over the cases, and how many processes they rest on."""
    ts = [r.timing for r in report.rows if r.timing is not None and r.timing.mde is not None]
    if not ts:
        return "no timing compared: this check could not see any slowdown"
    mdes = sorted(t.mde for t in ts)
    worst = max((r for r in report.rows if r.timing is not None and r.timing.mde is not None),
                key=lambda r: r.timing.mde)
    procs = sorted({t.processes for t in ts})
    occ = sorted({t.occasions for t in ts})
    if all(t.occasions > 1 for t in ts):
        basis = ("over the baseline's occasions (" + ", ".join(map(str, occ)) + "): the drift between occasions "
                 "is in the interval")
    elif all(t.over_processes for t in ts):
        basis = "over processes (" + ", ".join(f"{a}+{b}" for a, b in procs) + ")"
        if any(not t.paired and t.occasions == 1 for t in ts):
            basis += ("; the baseline is 1 occasion: drift between its occasion and this one is not covered "
                      "(`bench baseline --occasions 5` or `--append`)")
    else:
        basis = "some within one process or over rounds only: " + ", ".join(sorted({t.comparison.units_text for t in ts
                                                                                    if not t.over_processes}))
    gated = "" if report.timing_gated else " (timing not gated)"
    return (f"smallest slowdown this check could see{gated}: {100 * mdes[len(mdes) // 2]:.0f}% median over "
            f"{len(ts)} timings, {100 * worst.timing.mde:.0f}% at worst ({worst.name}); {basis}")


def reach_lines(reach: Sequence[Reach]) -> list[str]:
    """What measuring until it could see reached, per case that wanted more: ``measured until it could see: ...``."""
    if not reach:
        return []
    met = sum(r.met for r in reach)
    return [f"measured until it could see ({met} of {len(reach)} case(s) met the target):"] + \
        [f"  {r.text}" for r in reach]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.4g}"


def _cells(row: CheckRow) -> dict[str, str]:
    t = row.timing
    verdict = row.verdict
    extra = []
    if t is not None and not row.timing_gated and t.verdict != "unchanged":
        extra.append(f"timing {t.verdict}, not gated")
    if row.remeasured:
        extra.append("more processes added")
    if t is not None and t.mde_text:
        extra.append(t.mde_text)
    status = "" if row.kind != "both" or row.status == row.base_status else f"{row.base_status} → {row.status}"
    changes = "; ".join([f.text + ("" if f.gated else " (not gated)") for f in row.findings] + list(row.notes))
    return {
        "case": row.name,
        "base": _ms(t.base_median_ms) if t else "-",
        "cand": _ms(t.cand_median_ms) if t else "-",
        "ratio": f"{t.ratio:.3f} [{t.ci_low:.3f}, {t.ci_high:.3f}]" if t else "-",
        "over": t.comparison.units_text if t else "-",
        "floor": f"{100 * t.floor:.1f}%" if t else "-",
        "verdict": verdict + (f" ({'; '.join(extra)})" if extra else ""),
        "status": status,
        "changes": "; ".join(x for x in (status, changes) if x),
    }


_MD_COLUMNS = (("case", "case"), ("baseline ms", "base"), ("candidate ms", "cand"), ("ratio [95% CI]", "ratio"),
               ("over", "over"), ("floor", "floor"), ("verdict", "verdict"), ("deterministic changes", "changes"))


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: Sequence[CheckRow]) -> list[str]:
    out = ["| " + " | ".join(h for h, _ in _MD_COLUMNS) + " |",
           "|" + "|".join(":--" if k in ("case", "verdict", "changes") else "--:" for _, k in _MD_COLUMNS) + "|"]
    for r in rows:
        c = _cells(r)
        c["verdict"] = f"{MARK[r.verdict]} {c['verdict']}"
        out.append("| " + " | ".join(_md_escape(c[k]) for _, k in _MD_COLUMNS) + " |")
    return out


def markdown(report: CheckReport, reach: Sequence[Reach] = ()) -> str:
    """What a pull-request comment shows: the headline, the warnings, the cases that are not ``ok``, then every
    case in a collapsible ``<details>`` block."""
    out = [f"### {headline(report)}", ""]
    gate = ("timing gated" if report.timing_gated else "timing **not gated** ("
            + ("another environment" if report.env_differences else "--no-gate-timing") + ")")
    floor = (f"a timing is unchanged when its whole 95% interval lies within ±{100 * MIN_EFFECT:.0f}%, regressed or "
             f"improved beyond {100 * MIN_EFFECT:.0f}% with its {100 * (1 - ALPHA):g}% interval clear of 1, "
             "else inconclusive")
    commit = f" (commit `{report.baseline_commit[:10]}`)" if report.baseline_commit else ""
    out += [f"Suite `{report.suite}` against the baseline of {report.baseline_created or '?'}{commit}: {gate}; "
            f"{floor}.", "", power_line(report) + ".", ""]
    lines = reach_lines(reach)
    if lines:
        out += [lines[0], "", *(f"- {_md_escape(x.strip())}" for x in lines[1:]), ""]
    if report.warnings:
        out += [f"> ⚠️ {_md_escape(w)}" for w in report.warnings]
        out.append("")
    bad = report.not_ok()
    if bad:
        out += _md_table(bad)
        out.append("")
    out += [f"<details><summary>All {len(report.rows)} cases</summary>", ""]
    out += _md_table(report.rows)
    out += ["", "</details>", ""]
    return "\n".join(out)


def check_table(report: CheckReport, title: str = "") -> Table:
    """The check in the terminal: per case the medians, the ratio with its 95 % interval, what the interval is over,
    the floor, the verdict and what changed; cases that are not ok first."""
    table = Table(title=title or f"check · {headline(report)}", header_style="bold")
    for col, just in (("line", "left"), ("case", "left"), ("baseline ms", "right"), ("candidate ms", "right"),
                      ("ratio [95% CI]", "right"), ("over", "right"), ("floor", "right"), ("verdict", "left"),
                      ("changes", "left")):
        table.add_column(col, justify=just, no_wrap=col not in ("case", "changes", "verdict", "over"), overflow="fold")
    rows = sorted(report.rows, key=lambda r: r.verdict == "ok")
    for r in rows:
        c = _cells(r)
        table.add_row(r.line, r.label, c["base"], c["cand"], c["ratio"], c["over"], c["floor"],
                      f"[{STYLE[r.verdict]}]{c['verdict']}[/]", c["changes"])
    return table
