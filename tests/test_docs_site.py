"""The docs site's generated pages (docs/hooks.py): built from the code and the stored claims run, never by hand."""
from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest

from harness.contract.metrics import METRICS
from harness.contract.suite import list_suites
from tests.test_docs_readme import HISTORY
from tests.test_docs_text import DOCS, ROOT

_spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

CATALOG = tomllib.loads((ROOT / "claims" / "claims.toml").read_text())


def test_the_metrics_page_lists_every_metric():
    page = hooks.metrics_page()
    assert all(f"`{m.name}`" in page for m in METRICS)


def test_the_suites_page_lists_every_suite():
    page = hooks.suites_page()
    assert all(f"| `{p.stem}` |" in page for p in list_suites())


def test_the_claims_catalog_page_lists_every_claim_and_rule():
    page = hooks.claims_catalog_page()
    for cid, claim in CATALOG.items():
        assert f"### {cid}" in page
        assert all(f"`{r['figure']}`" in page for r in claim["rules"])


@pytest.mark.parametrize("make", [hooks.metrics_page, hooks.suites_page, hooks.claims_catalog_page],
                         ids=lambda f: f.__name__)
def test_generated_pages_carry_no_history(make):
    page = make()
    assert not [m.group(0) for pattern, _ in HISTORY for m in pattern.finditer(page)]


def test_the_stored_claims_run_is_of_this_catalog():
    doc = json.loads(hooks.newest_claims_record().read_text())
    assert doc["date"] and len(doc["commit"]) == 40 and doc["command"].startswith("bench claims")
    ids = [c["id"].rstrip("⁺") for c in doc["claims"]]
    assert ids and set(ids) <= set(CATALOG), "the stored run has claims the catalog no longer has"
    assert {c["verdict"] for c in doc["claims"]} <= {"supported", "partly supported", "contradicted", "inconclusive"}


def test_a_claims_run_is_exported_and_rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    md = tmp_path / "claims.md"
    md.write_text("| id | claim | verdict | measured on | figures |\n|---|---|---|---|---|\n"
                  "| C01 | Self-attention is quadratic | supported | cpu, eager | ★ macs_exp_eager 2 [2, 2] ✓ |\n"
                  "| C31⁺ | Named sizes | partly supported | cpu, eager | ★ params 1 \\| 2 ✗ |\n")
    js = tmp_path / "claims.json"
    js.write_text(json.dumps({"claims": [{"id": "C01", "reason": "every rule holds"},
                                         {"id": "C31", "reason": "GPT-2 small is 124M"}]}))
    monkeypatch.setattr(hooks, "EVIDENCE", tmp_path)
    path = hooks.export(md, js, command="bench claims --quick", date="2030-01-02", commit="a" * 40,
                        machine="a test", wall="1 min")
    assert path == tmp_path / "claims-cpu-2030-01-02.json"
    doc = json.loads(path.read_text())
    assert [(c["id"], c["verdict"], c["reason"]) for c in doc["claims"]] == [
        ("C01", "supported", "every rule holds"), ("C31⁺", "partly supported", "GPT-2 small is 124M")]
    page = hooks.verdicts_page()
    assert "2030-01-02" in page and "aaaaaaaaaa" in page and "1 partly supported, 1 supported" in page
    assert "- **C31⁺** partly supported: GPT-2 small is 124M" in page


def test_every_metrics_marker_names_catalog_metrics():
    markers = [m for page in DOCS.rglob("*.md") for m in re.findall(r"<!-- metrics: ([^>]*) -->", page.read_text())]
    assert markers
    for names in markers:
        assert hooks.metrics_table(names).count("\n") == len(names.split(",")) + 2
    with pytest.raises(ValueError, match="not in the metric catalog"):
        hooks.metrics_table("median_ms, no_such_metric")
