"""Claims as data: a claim whose figures are common readings of one suite run is one catalog entry (its figures
declared there, evaluated by claims.figures), a probe's reads are declared once with the probe (the claim's needs),
and the probes build their models the one way (harness.engine.models.materialize), seeded as before."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from claims import verdicts as verdicts_module
from claims.catalog import load_catalog
from claims.evidence import Context, UndeclaredRead
from claims.figures import FigureSpec, figure_of
from claims.model import Evidence
from claims.probes import PROBE_READS, load_all, median_ratio
from claims.verdicts import run_claims
from harness.contract.errors import BenchInputError
from harness.contract.records import CaseRecord, RunRecord
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.engine.models import materialize
from harness.store.db import Store

ONE_ENTRY = '''
[C99]
section = "Cost and complexity"
title = "A toy layer's cost is quadratic and the fast kernel is faster"
quote = "a toy claim"
where = "a test"
suite = "toy"
figures = [
  { name = "macs_exp", kind = "exponent", metric = "macs", x = "seq_len", where = { line = "slow" } },
  { name = "fast_over_slow", kind = "ratio", metric = "median_ms", a = { line = "fast" }, b = { line = "slow" }, at_largest = "seq_len" },
  { name = "params_spread", kind = "spread", metric = "params" },
]
rules = [
  { figure = "macs_exp", central = true, test = "within", lo = 1.95, hi = 2.05, says = "MACs ∝ n²" },
  { figure = "fast_over_slow", test = "at_most", hi = 0.8, says = "the fast kernel takes at most 0.8 of the time" },
  { figure = "params_spread", test = "within", lo = 1.0, hi = 1.01, says = "the same parameters" },
]
'''


def _case(line: str, n: int, ms: float, macs: float, params: float = 1e6) -> CaseRecord:
    samples = tuple(ms / 1e3 * (1 + 0.01 * np.sin(i)) for i in range(15))
    return CaseRecord(f"{line}-{n}", "toy", line, "toy-arch", "ok", workload={"seq_len": n},
                      metrics={"macs": macs, "params": params, "median_ms": ms}, samples_s=samples)


class _ToyContext(Context):
    """A context whose one suite, ``toy``, is the given records (nothing is measured)."""

    def __init__(self, store: Store, rows: list[CaseRecord]) -> None:
        super().__init__(store)
        self.rows = rows

    def suite(self, name, sets=None):
        self.check_read(f"suite {name}")
        run = RunRecord(id="toy-run", suite=name, quick=True, status="done", n_cases=len(self.rows), started_at="")
        self.provenance.append({"source": f"run {run.id} ({name})"})
        return run, self.rows


def _rows(power: float, fast_ms: float) -> list[CaseRecord]:
    ns = (128, 256, 512, 1024)
    return ([_case("slow", n, n / 100, float(n) ** power) for n in ns]
            + [_case("fast", n, fast_ms * n / 100, float(n) ** power) for n in ns])


def test_a_claim_added_as_one_catalog_entry_gets_a_verdict(tmp_path):
    """No probe, no reads list, no needs: the entry alone is decided — supported on data that bear it out,
    contradicted when the central figure says otherwise (the verdict can fail)."""
    path = tmp_path / "claims.toml"
    path.write_text(ONE_ENTRY, encoding="utf-8")
    (claim,) = load_catalog(path)
    assert claim.probe == "" and claim.source == "C99" and claim.needs == ("suite toy",)
    store = Store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    (v,) = run_claims([claim], _ToyContext(store, _rows(2.0, 0.5)))
    assert v.verdict == "supported", v.reason
    assert v.evidence.figures["fast_over_slow"].value == pytest.approx(0.5, rel=0.02)
    assert "seq_len = 1024" in v.evidence.figures["fast_over_slow"].note
    (v,) = run_claims([claim], _ToyContext(store, _rows(1.0, 0.5)))
    assert v.verdict == "contradicted", v.reason


def test_a_declared_ratio_is_the_one_paired_comparison_and_a_missing_case_is_unavailable():
    rows = _rows(2.0, 0.5)
    spec = FigureSpec("r", "ratio", "median_ms", a=(("line", "fast"), ("seq_len", 256)),
                      b=(("line", "slow"), ("seq_len", 256)))
    got = figure_of(spec, rows, "toy")
    want = median_ratio(rows[5], rows[1])
    assert (got.value, got.lo, got.hi) == (want.value, want.lo, want.hi)
    gone = figure_of(FigureSpec("r", "ratio", "median_ms", a=(("line", "none"),), b=(("line", "slow"),)), rows, "toy")
    assert gone == "the toy run has no ok case with line = none"
    many = figure_of(FigureSpec("r", "ratio", "macs", a=(("line", "fast"),), b=(("line", "slow"),)), rows, "toy")
    assert "4 cases of the toy run match line = fast" in many


@pytest.mark.parametrize("figure, message", [
    ({"name": "x", "kind": "slope", "metric": "macs"}, "kind 'slope' is not one of"),
    ({"name": "x", "kind": "exponent", "metric": "macs"}, "a figure of kind exponent needs x"),
    ({"name": "x", "kind": "spread", "metric": "speed"}, "metric 'speed' is not in the metric catalog"),
    ({"name": "x", "kind": "ratio", "metric": "mean_ms", "a": {}, "b": {}}, "metric = 'median_ms'"),
])
def test_a_malformed_declared_figure_is_one_input_error(tmp_path, figure, message):
    body = ONE_ENTRY.split("figures = [")[0] + "figures = [" + _inline(figure) + "]\nrules = []\n"
    path = tmp_path / "claims.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(BenchInputError, match=message):
        load_catalog(path)


def _inline(d: dict) -> str:
    return "{ " + ", ".join(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {{}}" for k, v in d.items()) + " }"


def test_a_claim_gives_a_probe_or_declared_figures_and_never_needs_by_hand(tmp_path):
    for extra, message in (('probe = "qk_macs"\n', "either a probe, or a suite"),
                           ('needs = ["suite toy"]\n', r"unknown key\(s\) \['needs'\]")):
        path = tmp_path / "claims.toml"
        path.write_text(ONE_ENTRY.replace('suite = "toy"\n', 'suite = "toy"\n' + extra), encoding="utf-8")
        with pytest.raises(BenchInputError, match=message):
            load_catalog(path)


def test_every_claims_needs_are_what_its_probe_declares():
    load_all()
    for claim in load_catalog():
        assert claim.needs == (PROBE_READS[claim.probe] if claim.probe else (f"suite {claim.suite}",)), claim.id
    declared = [c.id for c in load_catalog() if not c.probe]
    assert {"C06", "C22"} <= set(declared)


def test_a_probe_that_reads_what_it_does_not_declare_fails(tmp_path, monkeypatch):
    ctx = Context(Store(f"sqlite:///{tmp_path / 'r.sqlite'}"))
    ctx.reading = ("p", ("suite heads", "suite claims_gpu_rate (cuda)"))
    ctx.check_read("suite heads")
    ctx.check_read("suite claims_gpu_rate")
    with pytest.raises(UndeclaredRead, match="probe p read experiment recall, which it does not declare"):
        ctx.check_read("experiment recall")
    with pytest.raises(UndeclaredRead):
        ctx.experiment("recall")                       # checked before anything is trained

    def sneaky(c):
        c.experiment("recall")
        return Evidence()
    probes = dict(load_all())
    probes["attention_arithmetic"] = (sneaky, probes["attention_arithmetic"][1])
    monkeypatch.setattr(verdicts_module, "load_all", lambda: probes)
    claim = next(c for c in load_catalog() if c.probe == "attention_arithmetic")
    (v,) = run_claims([claim], Context(Store(f"sqlite:///{tmp_path / 'r.sqlite'}")))
    assert v.verdict == "inconclusive" and "UndeclaredRead" in v.evidence.failed


def test_a_seeded_build_is_the_modules_own_initialisation_from_that_seed():
    """materialize(..., seed=s): exactly the weights ``torch.manual_seed(s); spec.build(spec.config)`` drew — the
    claims' figures on models at initialisation and their trainings start from what they did."""
    spec = resolve("vit-micro")
    torch.manual_seed(7)
    want = spec.build(spec.config).state_dict()
    got = materialize(spec, Workload(), torch.device("cpu"), seed=7).state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    other = materialize(spec, Workload(), torch.device("cpu"), seed=8).state_dict()
    assert not all(torch.equal(want[k], other[k]) for k in want if want[k].is_floating_point())


def test_no_help_text_or_doc_lists_claim_ids_by_hand():
    """Which claims there are is said by the catalog: the docs' counts and id lists are generated from it
    (docs/hooks.py, ``<!-- claims: ... -->``), the CLI's help names none, and a probe module says its topic, not
    the claims it serves (the catalog names each claim's probe)."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    by_hand = re.compile(r"\bC\d{2}\s*[–-]\s*C\d{2}\b|\bC\d{2}(?:, C\d{2}){2,}")
    files = [*(root / "docs").rglob("*.md"), *(root / "cli").glob("*.py"), *(root / "claims" / "probes").glob("*.py")]
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files if "evidence" not in p.parts
             for m in by_hand.finditer(p.read_text(encoding="utf-8"))]
    assert not found, found
    assert by_hand.search("C01–C42") and by_hand.search("C10, C11, C19") and not by_hand.search("C10/C11")
