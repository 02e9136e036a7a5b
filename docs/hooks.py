"""mkdocs hook: the reference pages that must not drift are generated from the code at build time.

- ``reference/metrics.md``: the metric catalog (:mod:`harness.contract.metrics`);
- ``reference/suites.md``: every built-in suite file (``suites/*.toml``);
- ``reference/architectures.md``: the registry (``bench list archs``);
- ``claims/catalog.md``: ``claims/claims.toml``;
- ``claims/verdicts.md``: the newest stored claims run, ``docs/evidence/claims-*.json`` (its date and commit);
- ``development/changelog.md``: ``CHANGELOG.md``;
- the ``<!-- import-contracts -->`` marker of a page: ``[tool.importlinter]`` of ``pyproject.toml``;
- a ``<!-- metrics: NAME, NAME -->`` marker: those metrics' rows of the metric catalog;
- a ``<!-- claims: count|added|own_question|declared -->`` marker: that fact of ``claims/claims.toml``.

The CLI reference is ``reference/cli.md``'s ``::: mkdocs-click`` block (the click commands themselves).

:func:`export` writes the verdicts of a ``bench claims`` run (its ``--markdown`` table and JSON document) to
``docs/evidence/claims-cpu-<date>.json``, the file the verdicts page is built from.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVIDENCE = ROOT / "docs" / "evidence"


def _cell(text: object) -> str:
    """``text`` safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- pages ---------------------------------------------------------------------------------------------------
def metrics_page() -> str:
    from harness.contract.metrics import METRICS

    out = ["# Metrics\n",
           "Every metric a case may record, generated from the metric catalog (`harness/contract/metrics.py`). "
           "Units are in the names as stored (`median_ms`, `peak_bytes`). **exact**: the same on every run of the "
           "same code and torch (a count, or the CPU's tensor peak); **measured**: with noise. **gate**: "
           "`bench check` requires it equal to the baseline. **fake pass**: counted on fake tensors, before "
           "anything runs.\n"]
    kinds: dict[str, list] = {}
    for m in METRICS:
        kinds.setdefault(m.kind, []).append(m)
    for kind, ms in kinds.items():
        out.append(f"\n## {kind}\n\n")
        out.append(_table(("metric", "unit", "exact or measured", "better", "meaning"),
                          ((f"`{m.name}`", m.unit, ("exact" if m.exact else "measured")
                            + (", gate" if m.gate else "") + (", fake pass" if m.fake_pass else ""),
                            m.better, m.meaning) for m in ms)))
    return "".join(out)


def suites_page() -> str:
    from harness.contract.suite import list_suites

    out = ["# Built-in suites\n",
           "Generated from `suites/*.toml` (what `bench list suites` lists). Run one with `bench run NAME --quick`; "
           "`bench run NAME --dry-run` lists its cases without measuring. The file format: "
           "[Suites and their TOML](../guides/suites.md).\n\n"]
    rows = []
    for path in list_suites():
        raw = tomllib.loads(path.read_text())
        sweep = ", ".join(f"`{k}`" for k in raw.get("sweep", {})) or "—"
        lines = len(raw.get("lines", {}))
        tables = ", ".join(t for t in ("quick", "cuda") if t in raw) or "—"
        rows.append((f"`{path.stem}`", raw.get("description", ""), ", ".join(raw.get("metrics", [])), sweep, lines,
                     tables))
    out.append(_table(("suite", "question", "metrics", "sweep", "lines", "tables"), rows))
    return "".join(out)


def architectures_page() -> str:
    from harness.contract import registry

    out = ["# Architectures\n",
           "Every registered preset, generated from the registry (`bench list archs`). The families and how they "
           "are built: [Architectures](../concepts/architectures.md).\n\n"]
    rows = []
    for name in registry.list_archs("*"):
        spec = registry.get(name)
        rows.append((f"`{name}`", spec.family, spec.description))
    out.append(_table(("preset", "family", "description"), rows))
    out.append("\nNamespaces (any model of the library, random weights, nothing downloaded):\n\n")
    out += [f"- `{ns}:NAME` (e.g. `{ns}:resnet50`)\n" for ns in registry.namespaces()]
    return "".join(out)


def _rule_text(r: dict) -> str:
    test = r["test"]
    bound = {"within": lambda: f"within [{r['lo']:g}, {r['hi']:g}]", "at_least": lambda: f"≥ {r['lo']:g}",
             "at_most": lambda: f"≤ {r['hi']:g}",
             "equals": lambda: f"= {r['value']:g}" + (f" ± {r['rel_tol']:.0%}" if r.get("rel_tol") else ""),
             "is_true": lambda: "true"}[test]()
    return bound


def claims_catalog_page() -> str:
    catalog = tomllib.loads((ROOT / "claims" / "claims.toml").read_text())
    out = ["# Claims catalog\n",
           f"The {len(catalog)} claims `bench claims` decides, generated from `claims/claims.toml`, the one place each "
           "is declared. ★ marks the central rule (per device where a rule names one). ⁺: a claim found in the "
           "documents beyond the original list. How a rule is decided: [How claims are decided](index.md); the "
           "verdicts of a stored run: [Verdicts](verdicts.md).\n"]
    section = None
    for cid, c in catalog.items():
        if c.get("section") != section:
            section = c.get("section")
            out.append(f"\n## {section}\n")
        mark = "⁺" if c.get("added") else ""
        out.append(f"\n### {cid}{mark} {c['title']}\n\n")
        out.append(f"> {c['quote']}\n\n")
        source = (f"probe `{c['probe']}`" if c.get("probe") else
                  f"figures declared here over suite `{c['suite']}`: "
                  + ", ".join(f"`{f['name']}` ({f['kind']} of `{f['metric']}`)" for f in c["figures"]))
        out.append(f"*{c['where']}* · {source}"
                   + (f" · document's figure: {c['document_figure']}" if c.get("document_figure") else "") + "\n\n")
        rows = [(("★ " if r.get("central") else "") + f"`{r['figure']}`", _rule_text(r), r.get("device", "any"),
                 r["says"]) for r in c["rules"]]
        out.append(_table(("figure", "rule", "device", "what it says"), rows))
    return "".join(out)


def newest_claims_record() -> Path:
    found = sorted(EVIDENCE.glob("claims-*.json"))
    if not found:
        raise FileNotFoundError(f"no stored claims run (docs/evidence/claims-*.json) under {EVIDENCE}")
    return max(found, key=lambda p: json.loads(p.read_text())["date"])


def verdicts_page() -> str:
    path = newest_claims_record()
    doc = json.loads(path.read_text())
    counts: dict[str, int] = {}
    for c in doc["claims"]:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    out = ["# Verdicts\n",
           f"The verdicts of one stored run, generated from `docs/evidence/{path.name}`: `{doc['command']}`, "
           f"{doc['date']}, commit `{doc['commit'][:10]}`, on {doc['machine']}, {doc['wall']} wall. "
           + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) + ". "
           "A verdict says what was measured at this scale, on this device; ★ is the central rule's figure. "
           "The rules: [Claims catalog](catalog.md).\n\n"]
    rows = [(c["id"], c["title"], c["verdict"], c["device"], c["figures"]) for c in doc["claims"]]
    out.append(_table(("claim", "title", "verdict", "measured on", "figures (★ central; ✓ holds, ✗ does not, ? the "
                       "interval straddles, n/a not measured here)"), rows))
    if any(c.get("reason") for c in doc["claims"]):
        out.append("\n## Reasons\n\n")
        out += [f"- **{c['id']}** {c['verdict']}: {_cell(c['reason'])}\n" for c in doc["claims"] if c.get("reason")]
    return "".join(out)


def changelog_page() -> str:
    return (ROOT / "CHANGELOG.md").read_text()


def import_contracts() -> str:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    rows = []
    for c in cfg["contracts"]:
        if c["type"] == "layers":
            what = "layers, top → down: " + " → ".join(f"`{x}`" for x in c["layers"])
            if c.get("containers"):
                what = "in " + ", ".join(f"`{x}`" for x in c["containers"]) + ", " + what
        else:
            what = (", ".join(f"`{x}`" for x in c["source_modules"]) + " never import "
                    + ", ".join(f"`{x}`" for x in c["forbidden_modules"]))
        rows.append((c["name"], what))
    return _table(("contract", "what it checks"), rows)


def metrics_table(names: str) -> str:
    """The catalog's rows of the metrics named in a page's ``<!-- metrics: a, b, c -->`` marker."""
    from harness.contract.metrics import lookup

    rows = []
    for name in (n.strip() for n in names.split(",")):
        m = lookup(name)
        if m is None:
            raise ValueError(f"metric {name!r} is not in the metric catalog (harness/contract/metrics.py)")
        rows.append((f"`{name}`", m.unit, "exact" if m.exact else "measured", m.meaning))
    return _table(("metric", "unit", "exact or measured", "meaning"), rows)


GENERATED = {"reference/metrics.md": metrics_page, "reference/suites.md": suites_page,
             "reference/architectures.md": architectures_page, "claims/catalog.md": claims_catalog_page,
             "claims/verdicts.md": verdicts_page, "development/changelog.md": changelog_page}
def _ids(ids: list[str]) -> str:
    """Claim ids as runs: C31–C48, C50."""
    nums = sorted(int(i[1:]) for i in ids)
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"C{r[0]:02d}" + (f"–C{r[-1]:02d}" if len(r) > 1 else "") for r in runs)


def claims_fact(what: str) -> str:
    """A ``<!-- claims: WHAT -->`` marker's text, from ``claims/claims.toml``: ``count`` (how many claims),
    ``added`` (the ids found beyond the original list), ``own_question`` (the ids that are the project's own
    question, with "is"/"are"), ``declared`` (the ids whose figures are declared in the catalog, no probe)."""
    catalog = tomllib.loads((ROOT / "claims" / "claims.toml").read_text())
    if what == "count":
        return str(len(catalog))
    pick = {"added": lambda c: c.get("added"), "own_question": lambda c: c.get("own_question"),
            "declared": lambda c: "figures" in c}[what]
    ids = [cid for cid, c in catalog.items() if pick(c)]
    text = _ids(ids)
    return f"{text} {'is' if len(ids) == 1 else 'are'}" if what == "own_question" else text


MARKERS = {"<!-- import-contracts -->": import_contracts}


# -- mkdocs events ---------------------------------------------------------------------------------------------
def on_files(files, config):  # noqa: ANN001, ANN201 (mkdocs' hook signature)
    from mkdocs.structure.files import File

    for uri, page in GENERATED.items():
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"docs/{uri} is generated at build time (docs/hooks.py): remove the file")
        files.append(File.generated(config, uri, content=page()))
    return files


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    markdown = re.sub(r"<!-- claims: (\w+) -->", lambda m: claims_fact(m.group(1)), markdown)
    return re.sub(r"<!-- metrics: ([^>]*) -->", lambda m: metrics_table(m.group(1)), markdown)


# -- storing a claims run -------------------------------------------------------------------------------------
def read_markdown_table(text: str) -> list[dict[str, str]]:
    """The rows of the verdict table ``bench claims --markdown`` writes (id, claim, verdict, measured on, figures)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 5 and re.fullmatch(r"C\d+⁺?", cells[0]):
            rows.append({"id": cells[0], "title": cells[1], "verdict": cells[2], "device": cells[3],
                         "figures": cells[4]})
    return rows


def export(markdown: Path, claims_json: Path | None, *, command: str, date: str, commit: str, machine: str,
           wall: str) -> Path:
    """A ``bench claims`` run's verdicts (its ``--markdown`` table, and each claim's reason from its JSON document when
    given) as ``docs/evidence/claims-cpu-DATE.json``, the file the verdicts page is built from."""
    rows = read_markdown_table(markdown.read_text())
    if claims_json is not None:
        doc = json.loads(claims_json.read_text())
        reasons = {c["id"]: c["reason"] for c in (doc["claims"] if isinstance(doc, dict) else doc)}
        for r in rows:
            r["reason"] = reasons.get(r["id"].rstrip("⁺"), "")
    out = {"command": command, "date": date, "commit": commit, "machine": machine, "wall": wall, "claims": rows}
    path = EVIDENCE / f"claims-cpu-{date[:10]}.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    # python docs/hooks.py export results/claims.md results/claims.json "COMMAND" "MACHINE" "WALL"
    if len(sys.argv) != 7 or sys.argv[1] != "export":
        sys.exit('usage: python docs/hooks.py export CLAIMS.md CLAIMS.json "COMMAND" "MACHINE" "WALL"')
    import datetime

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    print(export(Path(sys.argv[2]), Path(sys.argv[3]), command=sys.argv[4], machine=sys.argv[5], wall=sys.argv[6],
                 date=datetime.date.today().isoformat(), commit=head.stdout.strip()))
