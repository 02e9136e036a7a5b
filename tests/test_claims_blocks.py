"""The added claims C31–C39 (building blocks and named sizes): each probe's figures checked against an
independent count, and each claim's verdict as the documents' numbers make it."""
from __future__ import annotations

import pytest
import torch

from claims.catalog import load_catalog
from claims.model import Evidence, Figure
from claims.probes import analytic_params, blocks
from claims.verdicts import decide
from harness.contract.registry import resolve
from claims.record import to_record

EXPECTED = {"C31": "supported", "C32": "contradicted", "C33": "partly supported", "C34": "supported",
            "C35": "supported", "C36": "contradicted", "C37": "supported", "C38": "partly supported",
            "C39": "supported"}
PROBES = {"named_sizes": blocks.named_sizes, "dot_magnitude": blocks.dot_magnitude,
          "layer_params": blocks.layer_params, "additive_vs_dot": blocks.additive_vs_dot,
          "patch_embedding": blocks.patch_embedding, "layer_norm": blocks.layer_norm,
          "mask_fill": blocks.mask_fill, "pixel_tokens": blocks.pixel_tokens}


MEASURED = {"C34": "additive_vs_dot", "C39": "pixel_tokens"}
"""The claims whose probe times (additive vs dot-product attention, side by side) or reads this process's resident set
(the pixel tokens' q·kᵀ): their tests run in the serial phase (``serial``); the other probes count, so their tests run
beside others (tests/conftest.py's PARTLY_SERIAL_MODULES)."""


class _Probed(dict):
    """Each probe's evidence, run on first use (once per module): a test in the parallel phase never runs the timed
    or memory-measuring probes, which cost 3.5 and 3 CPU-s."""

    def __missing__(self, name: str) -> Evidence:
        self[name] = PROBES[name](None)
        return self[name]


@pytest.fixture(scope="module")
def evidence() -> dict[str, Evidence]:
    return _Probed()


def test_the_measured_claims_are_the_measuring_probes():
    """MEASURED (which tests run serially) names every added claim whose probe times or measures memory."""
    probes = {c.id: c.probe for c in load_catalog() if c.id in EXPECTED}
    assert {cid: probes[cid] for cid in MEASURED} == MEASURED
    assert not set(MEASURED.values()) & {p for cid, p in probes.items() if cid not in MEASURED}


@pytest.mark.parametrize("cid", [pytest.param(cid, marks=pytest.mark.serial) if cid in MEASURED else cid
                                 for cid in sorted(EXPECTED)])
def test_added_claim_verdicts(cid, evidence):
    claim = next(c for c in load_catalog() if c.id == cid)
    assert claim.added
    v = decide(claim, evidence[claim.probe], force=True)     # a timing decides even if other tests load the machine
    assert v.verdict == EXPECTED[cid], v.reason
    assert to_record(v)["chart"]["series"]                      # every claim is shown with a plot


@pytest.mark.parametrize("key", ["gpt3", "llama2_70b"])
def test_named_sizes_analytic_count_equals_the_built_module(key, evidence):
    """The probe counts the 175B / 70B models built on the meta device; the analytic cost agrees."""
    preset, over, _, _ = blocks.NAMED[key]
    spec = resolve(preset, **over)
    with torch.device("meta"):
        model = spec.build(spec.config)
    built = sum(p.numel() for p in model.parameters())
    assert built == analytic_params(preset, **over) == blocks.built_params(preset, **over)
    assert evidence["named_sizes"].figures[f"params_{key}"].value == built


def test_layer_params_match_the_formulas(evidence):
    d = 512
    figs = evidence["layer_params"].figures
    attn = 4 * d * d + 4 * d
    assert figs["attn_over_lstm"].value == pytest.approx(attn / (8 * d * d + 8 * d))
    assert figs["attn_over_gru"].value == pytest.approx(attn / (6 * d * d + 6 * d))
    assert figs["attn_over_conv3"].value == pytest.approx(attn / (3 * d * d + d))


@pytest.mark.serial                    # its evidence comes from the timed probe (additive_vs_dot)
def test_additive_attention_space_is_d_a_times_the_scores(evidence):
    # largest tensors: (B, n, n, d_a) vs (B, n, n) — exactly d_a = 64 apart
    assert evidence["additive_vs_dot"].figures["additive_over_dot_bytes"].value == 64
    a = blocks.Additive(8, 8)
    q = torch.randn(2, 5, 8)
    assert a(q, q, q).shape == (2, 5, 8) and blocks.dot_attention(q, q, q).shape == (2, 5, 8)


def test_patchify_fix_and_document_code(evidence):
    figs = evidence["patch_embedding"].figures
    assert figs["doc_code_one_patch_share"].value == 0.0 and figs["permuted_one_patch_share"].value == 1.0
    assert figs["conv_equals_linear"].value < 1e-4
    x = torch.randn(1, 3, 8, 8)                                           # the fix agrees with a direct slice
    assert torch.equal(blocks._patchify(x, 4)[0, 1], x[0, :, 0:4, 4:8].reshape(-1))


def test_mask_fill_overflows_only_in_fp16(evidence):
    figs = evidence["mask_fill"].figures
    assert figs["works_fp16"].value == 0.0 and "overflow" in figs["works_fp16"].note
    assert figs["works_bf16"].value == 1.0 and figs["masked_weight_fp32"].value == 0.0


def test_a_wrong_figure_flips_an_added_claim(evidence):
    claim = next(c for c in load_catalog() if c.id == "C32")
    wrong = Evidence(figures={**evidence["dot_magnitude"].figures, "std_qk_dk64": Figure(64.0)})
    assert decide(claim, wrong).verdict == "supported"
