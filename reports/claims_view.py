"""The claims section of a report and the standalone claims page, rendered from the JSON document that
``bench claims`` writes (``claims.record.claims_document``). Reads plain JSON: never imports the claims package."""
from __future__ import annotations

import datetime as dt
import math
from typing import Any

from markupsafe import Markup
from matplotlib.figure import Figure

from reports.jinja import template_env
from reports.plots import figure_svg, set_log, tex_safe

VERDICTS = ("supported", "partly supported", "contradicted", "inconclusive")

RECORD_KEYS = {"id", "title", "section", "quote", "where", "added", "verdict", "reason", "rules", "document_figure",
               "published", "units", "sources", "notes", "figures", "chart", "device", "mode", "provenance",
               "probe_failed"}
"""What each claim record of the document holds: the claims section needs every one of them."""


def check_document(doc: Any) -> None:
    """ValueError unless ``doc`` is a claims document of this version (what ``bench claims`` writes)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list) or not {"context", "env"} <= set(doc):
        raise ValueError("is not a claims record written by `bench claims`")
    for r in doc["claims"]:
        r = r if isinstance(r, dict) else {}
        missing = RECORD_KEYS - set(r)
        if missing:
            raise ValueError(f"is not a claims record of this version ({r.get('id', '?')} lacks "
                             f"{', '.join(sorted(missing))}); run bench claims again")


def merged(record: dict[str, Any]) -> bool:
    """Whether a claim record was decided on several devices (``bench claims --merge``)."""
    return "+" in str(record.get("device") or "")


def rule_where(rule: dict[str, Any]) -> str:
    """Where and how a rule was decided ("cuda, compiled (default)"); "" for a rule no device decided."""
    return ", ".join(x for x in (rule.get("decided_on"), rule.get("mode")) if x)


def rule_detail(rule: dict[str, Any], several: bool) -> str:
    """A rule's outcome in words; on a claim decided on several devices, naming the device (and mode) that
    decided it, the other device's outcome, and a disagreement between them."""
    if not several:
        return rule["detail"]
    where = rule_where(rule)
    text = (f"[{where}] " if where and not rule.get("conflict") else "") + rule["detail"]
    others = [f"{rule_where(o)}: {o['detail']} ({o['status']})" for o in rule.get("others") or []]
    if others and not rule.get("conflict"):
        text += " — also " + "; ".join(others)
    return ("⚠ " if rule.get("conflict") else "") + text


def claims_section(doc: dict[str, Any], heading: int) -> dict[str, Any]:
    """Template variables of the claims section (_claims.html.j2) from a checked claims document; on claims
    decided on several devices each rule's detail names the device that decided it."""
    records = [dict(r, svg=Markup(chart_svg(r["chart"])),
                    rules=[dict(o, detail=rule_detail(o, merged(r))) for o in r["rules"]]) for r in doc["claims"]]
    sections: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        sections.setdefault(r["section"], []).append(r)
    counts = {k: sum(r["verdict"] == k for r in records) for k in VERDICTS}
    return {"claims": records, "sections": sections, "counts": counts, "context": doc["context"], "env": doc["env"],
            "h": heading}


def chart_svg(chart: dict[str, Any] | None) -> str:
    """A claim's chart (the document's ``chart``: title, x_label, y_label, series of (x, y, lo, hi) points,
    x_log, y_log, kind line|bar, hlines) as inline SVG; empty string when there is none."""
    if not chart or not any(chart["series"].values()):
        return ""
    fig = Figure(figsize=(6.4, 3.4), dpi=100)
    ax = fig.subplots()
    if chart['kind'] == "bar":
        labels, heights, errs = [], [], []
        for name, pts in chart['series'].items():
            for x, y, lo, hi in pts:
                if y is None:                  # not finite: written as null (strict JSON)
                    continue
                labels.append(tex_safe(str(name)))
                heights.append(y)
                errs.append((y - lo, hi - y) if lo is not None and hi is not None else (0.0, 0.0))
        ax.bar(range(len(heights)), heights, yerr=list(zip(*errs)) if errs else None, color="#4c72b0", capsize=3)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    else:
        for name, pts in chart['series'].items():
            pts = [p for p in pts if p[1] is not None and not (isinstance(p[1], float) and math.isnan(p[1]))]
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            line, = ax.plot(xs, ys, marker="o", ms=4, label=tex_safe(str(name)))
            if any(p[2] is not None for p in pts):
                ax.fill_between(xs, [p[2] if p[2] is not None else p[1] for p in pts],
                                [p[3] if p[3] is not None else p[1] for p in pts], color=line.get_color(), alpha=.15)
        ax.legend(fontsize=7, loc="best")
        if chart['x_log']:
            set_log(ax, "x")
    for label, y in chart['hlines'].items():
        ax.axhline(y, color="#c0392b", ls="--", lw=1)
        ax.text(0.01, y, tex_safe(label), transform=ax.get_yaxis_transform(), fontsize=7, color="#c0392b",
                va="bottom")
    if chart['y_log']:
        set_log(ax, "y")
    ax.set_title(tex_safe(chart['title']), fontsize=10)
    ax.set_xlabel(tex_safe(chart['x_label']), fontsize=9)
    ax.set_ylabel(tex_safe(chart['y_label']), fontsize=9)
    ax.grid(True, alpha=.3)
    fig.tight_layout()
    return figure_svg(fig)


def render_claims(doc: dict[str, Any]) -> str:
    """The self-contained HTML claims page (Jinja2, autoescaped; only matplotlib's SVG is inserted raw)."""
    return template_env().get_template("claims.html.j2").render(
        title="bench claims: the documents' trade-offs, measured", **claims_section(doc, heading=2),
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


_MD_MARK = {"pass": "✓", "fail": "✗", "unsure": "?", "unavailable": "n/a"}


def markdown_table(doc: dict[str, Any]) -> str:
    """The verdicts as a Markdown table (what the README shows): per claim the verdict, the device and mode
    that measured it, and every rule's figure with its mark; ★ marks the central rule, ⁺ a claim we added."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| id | claim | verdict | measured on | figures (★ central; context rules never decide; ✓ holds, ✗ does not, ? interval straddles, "
             "n/a not measured here; @ the device that decided it, ⚠ devices disagree) |", "|---|---|---|---|---|"]
    for c in doc["claims"]:
        figs = []
        several = merged(c)
        for o in c["rules"]:
            star = "★ " if o.get("central") else "(context, does not decide) " if o.get("context") else ""
            if o["measured"] is not None and o["status"] != "unavailable":
                at = f" @{o['decided_on']}" if several and o.get("decided_on") else ""
                others = "".join(f" ({x['decided_on']}: {x['measured']['text'] if x.get('measured') else 'n/a'} "
                                 f"{_MD_MARK[x['status']]})" for x in o.get("others") or [])
                figs.append(f"{'⚠ ' if o.get('conflict') else ''}{star}{o['figure']} {o['measured']['text']} "
                            f"{_MD_MARK[o['status']]}{at}{others if several else ''}")
            else:
                figs.append(f"{star}{o['figure']} n/a" + (f" ({o['device']} only)" if o.get("device") else ""))
        where = f"{c['device']}, {c['mode']}" + (" — probe failed" if c.get("probe_failed") else "")
        lines.append(f"| {c['id']}{'⁺' if c['added'] else ''} | {cell(c['title'])} | {c['verdict']} | {where} | "
                     f"{cell('; '.join(figs))} |")
    return "\n".join(lines) + "\n"
