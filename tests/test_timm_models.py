"""The ``timm:`` namespace, timm's published table, and Swin V2 / MViT v2 against their published figures.

Two MAC conventions meet here (harness/instruments/flops/formulas.py docstring, harness/engine/flop_table.py):

* **ours** (torchvision's ``_ops``): matmul-like work only — convs, linears, attention's QKᵀ and AV; norms,
  softmax, pooling and other elementwise ops count 0. Counted on fake tensors.
* **fvcore's total** (timm's published ``infer_gmacs``; timm's benchmark.py ``profile_fvcore``: a
  ``FlopCountAnalysis`` of the model on ``torch.ones`` at batch 1): the same matmul-like ops
  (:data:`harness.engine.flop_table.FVCORE_MAC_OPS`) *plus* the elementwise work fvcore has handles for — batch/layer/
  group norm and adaptive average pooling here. fvcore traces with ``torch.jit`` and has no handle for
  ``aten::scaled_dot_product_attention``, so timm's fused attention counts 0 in it: the published figures were
  made with explicit attention matmuls, which we get with ``fused_attn=False`` (``timm.layers.set_fused_attn``).

What is checked, per vendored model: (a) fvcore's total on our side, fused attention off, rounds to the
published GMACs; (b) fvcore's matmul-like part equals our count *exactly*, so published − ours is exactly what
fvcore counts and we do not (its norm and pooling figures), to the table's rounding; and our count is the same
with timm's fused attention on (what ``bench run`` times) and off.
"""
from __future__ import annotations

import ast
import re
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch

timm = pytest.importorskip("timm")

from fvcore.nn import FlopCountAnalysis  # noqa: E402
from timm.layers import use_fused_attn  # noqa: E402

from architectures import timm_models  # noqa: E402
from architectures.timm_models import PUBLISHED_CSV, TIMM_MISSING, published, published_models  # noqa: E402
from harness.contract import registry# noqa: E402
from harness.contract.errors import BenchInputError  # noqa: E402
from harness.instruments.fake import build_fake, new_fake_mode  # noqa: E402
from harness.engine.flop_table import FVCORE_MAC_OPS  # noqa: E402
from harness.contract.spec import Workload  # noqa: E402
from tests.helpers import counted_cost  # noqa: E402

MODELS = published_models()
# fvcore's non-MAC handles that these models reach: norms and pooling (fvcore/nn/jit_handles.py)
FVCORE_ELEMENTWISE = {"batch_norm", "layer_norm", "group_norm", "instance_norm", "adaptive_avg_pool2d"}


def _spec(name: str, **overrides):
    return registry.resolve(f"timm:{name}", **overrides)


@cache
def _ours(name: str, fused_attn: bool = True) -> tuple[int, int]:
    """(params, forward MACs) of ``timm:name`` by our counter, on fake tensors at its default img_size (cached:
    several tests read the same model's count)."""
    spec = _spec(name, fused_attn=fused_attn)
    return counted_cost(spec, Workload(batch_size=1, img_size=spec.config.img_size))


@cache
def _fvcore_by_op(name: str, fused_attn: bool = False) -> dict[str, int]:
    """fvcore's counts per op for ``timm:name`` as timm's benchmark.py takes them: eval, ``torch.ones`` input."""
    spec = _spec(name, fused_attn=fused_attn)
    torch.manual_seed(0)
    model = spec.build(spec.config).eval()
    x = torch.ones(1, 3, spec.config.img_size, spec.config.img_size)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = FlopCountAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        return {op: int(v) for op, v in analysis.by_operator().items()}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- the namespace


def test_module_imports_no_timm_at_top_level():
    """timm is an optional extra: the module's top level imports no timm (only its functions do)."""
    tree = ast.parse(Path(timm_models.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "timm"]


def test_without_timm_a_timm_name_is_one_line_bad_input(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)            # `import timm` now raises ImportError
    with pytest.raises(BenchInputError) as err:
        registry.get("timm:resnet50")
    assert TIMM_MISSING in str(err.value) and "\n" not in str(err.value)
    assert "pip install -c constraints.txt -e '.[timm]'" in str(err.value)


def test_unknown_timm_name_is_bad_input_with_a_hint():
    with pytest.raises(BenchInputError, match=r"timm has no model 'vit_smal_patch16_224'.*vit_small_patch16_224"):
        registry.get("timm:vit_smal_patch16_224")


def test_spec_starts_at_the_models_default_size_and_takes_overrides():
    assert _spec("swinv2_tiny_window8_256").config.img_size == 256
    assert _spec("mvitv2_tiny").config.img_size == 224
    assert _spec("mvitv2_tiny", img_size=160).config.img_size == 160
    assert timm_models.takes_img_size("mvitv2_tiny") and not timm_models.takes_img_size("resnet50")
    with pytest.raises(BenchInputError):
        _spec("mvitv2_tiny", img_size=0)


def test_fused_attn_off_builds_explicit_attention_and_restores_timm_default():
    before = use_fused_attn()
    off = _spec("vit_small_patch16_224", fused_attn=False)
    on = _spec("vit_small_patch16_224")
    with torch.device("meta"):
        off_model, on_model = off.build(off.config), on.build(on.config)
    assert [m.fused_attn for m in off_model.modules() if hasattr(m, "fused_attn")] == [False] * 12
    assert use_fused_attn() == before
    assert {m.fused_attn for m in on_model.modules() if hasattr(m, "fused_attn")} == {before}


@pytest.mark.parametrize(("name", "side"), [("vit_small_patch16_224", 288), ("swin_tiny_patch4_window7_224", 160)])
def test_non_default_img_size_builds_and_runs(name, side):
    """Through the namespace (as a suite passes the workload's img_size into the config) a fixed-size timm model
    is built for the new size and runs on (1, 3, side, side): ViT-S's position table follows it, Swin pads its
    40×40 grid to whole 7×7 windows. (tests/test_vision_zoo.py counts MViT v2 and Swin V2 at several sizes.)"""
    spec = _spec(name, img_size=side)
    mode = new_fake_mode()
    model = build_fake(lambda: spec.build(spec.config).eval(), mode, torch.device("cpu"))
    with mode, torch.no_grad():
        (x,) = spec.make_inputs(spec.config, Workload(img_size=side), torch.device("cpu"))
        assert tuple(x.shape) == (1, 3, side, side)
        assert tuple(model(x).shape) == (1, 1000)
    assert tuple(model.patch_embed.img_size) == (side, side)


# ---------------------------------------------------------------- the vendored table


def test_published_table_names_its_source_and_holds_the_models_we_compare():
    first = PUBLISHED_CSV.read_text().splitlines()[0]
    assert first.startswith("#") and "huggingface/pytorch-image-models" in first
    assert re.search(r"results/benchmark-infer-[\w.-]+\.csv", first) and re.search(r"\b[0-9a-f]{40}\b", first)
    assert {"resnet50", "vit_small_patch16_224", "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256",
            "mvitv2_tiny", "coatnet_0_rw_224", "convnext_tiny"} <= set(MODELS)
    assert published("mvitv2_tiny") == (4.7, 24.17, 224)
    with pytest.raises(KeyError, match="not in timm_published.csv"):
        published("resnet51")


@pytest.mark.parametrize("name", MODELS)
def test_params_equal_published(name):
    params, _ = _ours(name, fused_attn=False)
    assert round(params / 1e6, 2) == published(name).mparams
    assert _spec(name).config.img_size == published(name).img_size


@pytest.mark.parametrize("name", MODELS)
def test_published_gmacs_are_fvcore_total_and_ours_plus_fvcores_elementwise(name):
    """(a) fvcore's total (fused attention off) rounds to the published GMACs; (b) its matmul-like part is our
    count exactly, so published − ours = fvcore's norm and pooling counts (to the table's 0.01 G rounding)."""
    pub = published(name).gmacs
    by_op = _fvcore_by_op(name)
    total = sum(by_op.values())
    assert round(total / 1e9, 2) == pub                                          # (a)
    fv_macs = sum(v for op, v in by_op.items() if op in FVCORE_MAC_OPS)
    elementwise = {op: v for op, v in by_op.items() if op not in FVCORE_MAC_OPS}
    _, ours = _ours(name, fused_attn=False)
    einsum = by_op.get("einsum", 0)    # fvcore reads einsums off np.einsum_path's printout: 4 significant digits
    assert abs(ours - fv_macs) <= einsum * 1e-3                                  # (b); exact without einsums
    assert elementwise and set(elementwise) <= FVCORE_ELEMENTWISE and min(elementwise.values()) > 0
    assert abs(pub * 1e9 - (ours + sum(elementwise.values()))) <= 0.005e9
    assert pub * 1e9 > ours                                                      # published counts more than ours


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "mvitv2_tiny"])
def test_our_count_is_the_same_with_timms_fused_attention(name):
    """What a run times (timm's default: SDPA) counts what the explicit matmuls count (our SDPA formulas)."""
    assert _ours(name) == _ours(name, fused_attn=False)


def test_fvcore_misses_timms_fused_attention():
    """Why the published figures need fused attention off: with timm's default SDPA, fvcore's trace counts no
    attention matmul at all — ViT-S/16 loses exactly its QKᵀ and AV (2·197²·384 MACs × 12 blocks)."""
    off, on = _fvcore_by_op("vit_small_patch16_224"), _fvcore_by_op("vit_small_patch16_224", fused_attn=True)
    assert off["matmul"] == 2 * 197 ** 2 * 384 * 12
    assert "matmul" not in on
    assert sum(off.values()) - sum(on.values()) == off["matmul"]


# ---------------------------------------------------------------- Swin V2 (torchvision) and MViT v2 (timm)


@cache
def _swin_v2_t_256() -> tuple[int, int]:
    """(params, MACs) of ``torchvision:swin_v2_t`` at 256², by our counter on fake tensors."""
    return counted_cost(registry.resolve("torchvision:swin_v2_t", img_size=256), Workload(img_size=256))


def test_swin_v2_t_through_torchvision_matches_its_weights_meta():
    """torchvision's published ``num_params`` and ``_ops`` (GMACs, 3 decimals: our convention) for Swin V2-T,
    read from the weights' meta (no download), at the weights' crop size (256)."""
    from torchvision.models import Swin_V2_T_Weights
    weights = Swin_V2_T_Weights.DEFAULT
    assert weights.transforms.keywords["crop_size"] == 256
    params, macs = _swin_v2_t_256()
    assert params == weights.meta["num_params"]
    assert round(macs / 1e9, 3) == weights.meta["_ops"]


def test_swin_v2_t_torchvision_and_timm_are_the_same_network():
    """torchvision's swin_v2_t and timm's swinv2_tiny_window8_256 (window 8, 256²): by our counter equal MACs, so
    the published table's timm row checks torchvision's model too. Their parameters differ by exactly the key
    bias torchvision keeps in each block's ``qkv.bias`` (3C, its k third zeroed in every forward) where timm has
    ``q_bias`` and ``v_bias`` only: C per block, 4416 in all; both round to the published 28.35 M."""
    tv_params, tv_macs = _swin_v2_t_256()
    timm_params, timm_macs = _ours("swinv2_tiny_window8_256", fused_attn=False)
    assert tv_macs == timm_macs
    spec = registry.resolve("torchvision:swin_v2_t")
    with torch.device("meta"):
        model = spec.build(spec.config)
    k_bias = sum(m.qkv.bias.numel() // 3 for m in model.modules() if hasattr(m, "cpb_mlp"))
    assert tv_params - timm_params == k_bias == 4416
    assert round(tv_params / 1e6, 2) == round(timm_params / 1e6, 2) == published("swinv2_tiny_window8_256").mparams


def test_mvit_v2_tiny_matches_the_published_row():
    params, macs = _ours("mvitv2_tiny", fused_attn=False)
    assert (round(params / 1e6, 2), published("mvitv2_tiny").img_size) == (24.17, 224)
    assert 4.6e9 < macs < published("mvitv2_tiny").gmacs * 1e9    # norms (fvcore) are the rest; see above
