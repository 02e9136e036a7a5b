"""``bench flops``: ours, torch's stock FlopCounterMode and fvcore side by side, in MACs.

Outside truths: torchvision's published ``meta["_ops"]`` (GMACs, though its docs call them GFLOPS)
for ResNets, and a hand count of nn.MultiheadAttention's MACs, which fvcore (no handle for the fused
``aten::_native_multi_head_attention``) and the stock counter (no formula for it) both miss.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import pytest
import torch
import torchvision

from architectures.inputs import image_inputs
from harness.contract import registry
from harness.engine.flop_table import FlopTable, build_real, flop_table
from harness.instruments.flops import count_model
from harness.contract.spec import ArchSpec, Workload

IMG, PATCH, D, HEADS, MLP, LAYERS = 32, 16, 64, 2, 128, 2
SEQ = (IMG // PATCH) ** 2 + 1                    # patches + the class token
MHA_MACS = 4 * SEQ * D * D + 2 * SEQ * SEQ * D   # q, k, v, out projections + QKᵀ and AV, per layer


@dataclass(frozen=True)
class TinyViTConfig:
    img_size: int = IMG


def small_vit(cfg: object = None) -> torch.nn.Module:
    return torchvision.models.VisionTransformer(image_size=IMG, patch_size=PATCH, num_layers=LAYERS,
                                                num_heads=HEADS, hidden_dim=D, mlp_dim=MLP)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Counts need no speed: one thread spares a shared machine the spinning of idle OpenMP workers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def resnet18_table() -> FlopTable:
    model, inputs = build_real(registry.get("resnet18"), Workload(img_size=224))
    return flop_table(model, inputs)


@pytest.fixture(scope="module")
def vit_table() -> FlopTable:
    torch.manual_seed(0)
    return flop_table(small_vit(), torch.randn(1, 3, IMG, IMG))


@pytest.fixture
def tiny_vit_arch():
    """A registry name for the small torchvision ViT, removed again after the test."""
    spec = registry.register(ArchSpec("test-tv-vit-tiny", "test", TinyViTConfig(), small_vit, image_inputs))
    try:
        yield spec.name
    finally:
        registry._ARCHS.pop(spec.name)


# ------------------------------------------------------------------------------------ the engine

def test_ours_counts_resnets_as_torchvision_publishes(resnet18_table):
    """GMACs = meta["_ops"] to its 3 decimals (the tolerance of test_vision's count_as_published)."""
    meta18 = torchvision.models.ResNet18_Weights.DEFAULT.meta
    assert resnet18_table.ours / 1e9 == pytest.approx(meta18["_ops"], abs=6e-4)
    model, inputs = build_real(registry.get("resnet50"), Workload(img_size=224))
    table50 = flop_table(model, inputs, depth=0, fvcore=False)
    assert table50.ours / 1e9 == pytest.approx(torchvision.models.ResNet50_Weights.DEFAULT.meta["_ops"], abs=6e-4)
    assert table50.fvcore is None and table50.fvcore_note == "not run"


def test_without_attention_all_three_agree_on_every_module(resnet18_table):
    t = resnet18_table
    assert t.ours == t.torch == t.fvcore
    assert [r.path for r in t.rows if r.depth == 1][:3] == ["conv1", "bn1", "relu"]
    assert max(r.depth for r in t.rows) == 4                     # every depth: layer2.0.downsample.0
    for r in t.rows:
        assert None not in (r.ours, r.torch, r.fvcore), r
        assert r.ours == pytest.approx(r.torch, rel=0.01) and r.ours == pytest.approx(r.fvcore, rel=0.01), r
    assert t.differing() == ()
    # fvcore's elementwise counts (BN, pooling) are not MACs: kept apart, not in its column
    assert dict(t.fvcore_elementwise).keys() == {"batch_norm", "adaptive_avg_pool2d"}
    assert t.row("bn1").fvcore == 0


def test_fvcore_and_torch_miss_exactly_the_attention(vit_table):
    t = vit_table
    assert t.ours - t.fvcore == LAYERS * MHA_MACS
    assert t.ours - t.torch == LAYERS * MHA_MACS
    attn = [f"encoder.layers.encoder_layer_{i}.self_attention" for i in range(LAYERS)]
    for path in attn:
        row = t.row(path)
        assert (row.ours, row.torch, row.fvcore) == (MHA_MACS, 0, 0)
        assert t.row(f"{path}.out_proj").ours is None            # never called on the fused path: no figure, not 0
        assert t.row(f"{path}.out_proj").fvcore is None
    differing = {r.path for r in t.differing()}
    blocks = {p.rsplit(".", 1)[0] for p in attn}
    assert differing == {"", "encoder", "encoder.layers", *blocks, *attn}
    mha = [u for u in t.fvcore_unsupported if u.name == "aten::_native_multi_head_attention"]
    assert mha and mha[0].calls == LAYERS and mha[0].ours_formula and t.fvcore_unsupported[0] == mha[0]


def test_ours_is_count_model_and_depth_cuts_rows(vit_table):
    torch.manual_seed(0)
    model, x = small_vit(), torch.randn(1, 3, IMG, IMG)
    assert vit_table.ours == count_model(model.eval(), (x,)).macs
    shallow = flop_table(model, x, depth=1, fvcore=False)
    assert {r.depth for r in shallow.rows} == {0, 1} and shallow.ours == vit_table.ours


def test_fwd_bwd_has_no_fvcore_figure_and_restores_the_model():
    model = small_vit()
    model.eval()
    t = flop_table(model, torch.randn(2, 3, IMG, IMG), depth=1, mode="fwd_bwd")
    assert t.fvcore is None and all(r.fvcore is None for r in t.rows) and "forward only" in t.fvcore_note
    assert t.ours > 2 * flop_table(model, torch.randn(2, 3, IMG, IMG), depth=0, fvcore=False).ours
    assert not model.training and all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="mode"):
        flop_table(model, torch.randn(1, 3, IMG, IMG), mode="bwd")


# ------------------------------------------------------------------------------------ the CLI

def test_cli_totals_table(cli):
    res = cli("flops", "resnet18")
    assert res.exit_code == 0, res.stderr
    assert "ours (harness.instruments.flops)" in res.stdout and "fvcore FlopCountAnalysis" in res.stdout
    assert "1,814,073,344" in res.stdout and "FLOPs = 2·MACs" in res.stdout


def test_cli_diff_only_lists_the_attention_modules(cli, tiny_vit_arch, tmp_path):
    res = cli("flops", tiny_vit_arch, "--by-module", "--diff-only", "--csv", str(tmp_path / "rows.csv"))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    shown = [ln.split("│")[1].strip() for ln in lines if ln.startswith("│")]
    attn = [f"encoder.layers.encoder_layer_{i}.self_attention" for i in range(LAYERS)]
    assert set(attn) <= set(shown) and "conv_proj" not in shown and "heads" not in shown
    assert "aten::_native_multi_head_attention ×2 (ours has a formula)" in res.stdout
    with open(tmp_path / "rows.csv") as f:
        rows = {r["path"]: r for r in csv.DictReader(f)}
    assert rows[attn[0]]["ours_macs"] == str(MHA_MACS) and rows[attn[0]]["fvcore_macs"] == "0"
    assert rows[f"{attn[0]}.out_proj"]["ours_macs"] == "" and rows[attn[0]]["differs"] == "1"


def test_cli_json(cli, tiny_vit_arch):
    res = cli("flops", tiny_vit_arch, "--json", "--depth", "0")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["unit"] == "MACs" and doc["totals"]["ours"] - doc["totals"]["fvcore"] == LAYERS * MHA_MACS
    assert [r["path"] for r in doc["rows"]] == [""]


@pytest.mark.parametrize("args, key", [
    (["flops", "no-such-arch"], "unknown architecture 'no-such-arch'"),
    (["flops", "decoder-tiny"], "--seq-len"),
    (["flops", "resnet18", "--mode", "bwd"], "--mode"),
    (["flops", "resnet18", "--set", "nope=1"], "nope"),
])
def test_cli_bad_input_is_one_line_exit_2(cli, args, key):
    res = cli(*args)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and key in res.stderr and res.stdout == ""
