"""ViT, Swin and CNN presets: the same networks as torchvision's (params, MACs, outputs), padding
sizes, the analytic cost formulas against the counter (hypothesis), claim C20's token count.

Big models are only counted on fake tensors (no memory, no arithmetic); real forwards run on
small configs, plus one vit_b_16 and one swin_t at 224² for numerical equivalence.
"""
from __future__ import annotations

import pytest
import torch
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from architectures import swin, vit
from architectures.cnn import TORCHVISION_PRESETS, ResNetMicroConfig
from harness.contract import registry
from harness.instruments.fake import build_fake, new_fake_mode
from harness.instruments.flops import count_model, count_params
from harness.contract.spec import Workload

CPU = torch.device("cpu")


def fake_count(build, side: int, batch: int = 1) -> tuple[int, int]:
    """(params, forward MACs) of ``build()`` on a (batch, 3, side, side) image, eval + no_grad, fake tensors."""
    mode = new_fake_mode()
    model = build_fake(build, mode, CPU).eval()
    with mode:
        x = torch.randn(batch, 3, side, side)
        return count_params(model), count_model(model, (x,)).macs


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial weights (torchvision zero-inits its heads) so that outputs can be compared."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if bool((p == 1).all()) else 0.02 * noise)   # norm scales stay near 1
    return model.eval()


# ---------------------------------------------------------------------------------- ViT


def test_vit_b16_matches_torchvision_params_and_macs():
    spec = registry.get("vit-b16")
    meta = torchvision.models.get_model_weights("vit_b_16").DEFAULT.meta
    ours = fake_count(lambda: spec.build(spec.config), 224)
    theirs = fake_count(lambda: torchvision.models.vit_b_16(weights=None), 224)
    assert ours == theirs == (86_567_656, 17_563_828_224)
    assert ours[0] == meta["num_params"] and round(ours[1] / 1e9, 3) == meta["_ops"]
    cost = spec.cost(spec.config, Workload())
    assert (cost["params"], cost["macs"]) == ours


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_small_vit_is_torchvision_vit_either_kernel(impl):
    theirs = randomize_(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=96, num_classes=10))
    cfg = vit.ViTConfig(img_size=32, patch_size=8, n_layers=2, n_heads=4, d_model=64, d_ff=96, num_classes=10,
                        attn_impl=impl)
    ours = vit.ViT(cfg).eval()
    ours.load_state_dict(vit.from_torchvision(theirs.state_dict()))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_vit_b16_tokens_and_patch_dim_claim_c20():
    """C20: 224² with 16² patches -> 196 patches + [CLS] = 197 tokens; a patch holds 3·16·16 = 768 values."""
    cfg = registry.get("vit-b16").config
    assert (cfg.n_patches, cfg.n_tokens, cfg.patch_dim) == (196, 197, 768)
    mode = new_fake_mode()
    model = build_fake(lambda: vit.ViT(cfg), mode, CPU)
    with mode:
        tokens = model.tokens(torch.randn(2, 3, 224, 224))
    assert tuple(tokens.shape) == (2, 197, 768)
    assert model.patch_embed.weight[0].numel() == 768


def test_vit_rejects_other_image_sizes_and_bad_configs():
    spec = registry.resolve("vit-micro", d_model=32, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="takes 32x32 images"):
        spec.build(spec.config)(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match="must divide img_size"):
        vit.ViTConfig(img_size=30, patch_size=4)


def test_vit_presets():
    assert set(registry.list_archs("vit-*")) >= {"vit-ti16", "vit-s16", "vit-b16", "vit-b32", "vit-l16", "vit-micro"}
    micro = registry.get("vit-micro").config
    assert (micro.img_size, micro.patch_size, micro.d_model, micro.n_layers) == (32, 4, 128, 4)


# ---------------------------------------------------------------------------------- Swin


@pytest.mark.parametrize("name", ["swin_t", "swin_s", "swin_b"])
def test_swin_matches_torchvision_params_and_macs(name):
    spec = registry.get(name.replace("_", "-"))
    meta = torchvision.models.get_model_weights(name).DEFAULT.meta
    ours = fake_count(lambda: spec.build(spec.config), 224)
    theirs = fake_count(lambda: torchvision.models.get_model(name, weights=None), 224)
    assert ours == theirs                                   # exact, so within 1% a fortiori
    assert ours[0] == meta["num_params"] and round(ours[1] / 1e9, 3) == meta["_ops"]
    cost = spec.cost(spec.config, Workload())
    assert (cost["params"], cost["macs"]) == ours


@pytest.mark.parametrize("preset, module, builder", [("vit-b16", vit, "vit_b_16"), ("swin-t", swin, "swin_t")])
def test_is_torchvision_network_weight_for_weight(preset, module, builder):
    """torchvision's weights loaded into ours give the same logits: the same network."""
    torch.manual_seed(0)
    theirs = randomize_(torchvision.models.get_model(builder, weights=None))
    spec = registry.get(preset)
    ours = spec.build(spec.config).eval()
    ours.load_state_dict(module.from_torchvision(theirs.state_dict()))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("side", "impl"), [(200, "sdpa"), (160, "eager"), (97, "sdpa"), (97, "eager")])
def test_swin_padding_sizes_match_torchvision(side, impl):
    """Maps that are not multiples of the window (and odd sides at merging) are padded as torchvision pads."""
    kw = dict(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8], window_size=[7, 7])
    theirs = randomize_(torchvision.models.SwinTransformer(**kw, num_classes=10), seed=side)
    cfg = swin.SwinConfig(img_size=side, embed_dim=16, depths=(2, 2, 2, 2), n_heads=1, num_classes=10, attn_impl=impl)
    ours = swin.Swin(cfg).eval()
    ours.load_state_dict(swin.from_torchvision(theirs.state_dict()))
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("side", [160, 200, 97])
def test_swin_t_padded_sizes_count_as_torchvision(side):
    full = registry.resolve("swin-t", img_size=side)
    counted = fake_count(lambda: full.build(full.config), side)
    assert counted == fake_count(lambda: torchvision.models.swin_t(weights=None), side)
    cost = full.cost(full.config, Workload())
    assert (cost["params"], cost["macs"]) == counted


def test_swin_shift_mask_separates_regions():
    mask = swin.shift_mask(14, 14, 7, 3, CPU)                # (nW, 49, 49)
    assert mask.shape == (4, 49, 49)
    assert (mask[0] == 0).all()                              # the top-left window holds one region
    assert set(mask[3].unique().tolist()) == {swin.MASK_VALUE, 0.0}
    assert (mask == mask.transpose(1, 2)).all() and (mask.diagonal(dim1=1, dim2=2) == 0).all()


def test_swin_config_validation_and_toml_lists():
    assert registry.resolve("swin-t", depths=[2, 2]).config.depths == (2, 2)
    with pytest.raises(ValueError, match="depths"):
        swin.SwinConfig(depths=(2, 0))
    with pytest.raises(ValueError, match="must divide embed_dim"):
        swin.SwinConfig(embed_dim=96, n_heads=5)


# ---------------------------------------------------------------------------------- CNNs


@pytest.mark.parametrize("name", sorted(TORCHVISION_PRESETS))
def test_torchvision_cnn_presets_count_as_published(name):
    """Named wrappers build torchvision's network: params exact, MACs = meta["_ops"] (GMACs, 3 decimals)."""
    spec = registry.get(name)
    meta = torchvision.models.get_model_weights(TORCHVISION_PRESETS[name]).DEFAULT.meta
    params, macs = fake_count(lambda: spec.build(spec.config), 224)
    assert params == meta["num_params"]
    assert macs / 1e9 == pytest.approx(meta["_ops"], abs=6e-4)
    assert spec.cost is None


# ---------------------------------------------------------------------------------- cost formulas

def _assert_cost_matches_counter(spec, w: Workload) -> None:
    mode = new_fake_mode()
    model = build_fake(lambda: spec.build(spec.config), mode, CPU).eval()
    with mode:
        inputs = spec.make_inputs(spec.config, w, CPU)
        counted = count_model(model, inputs)
        params = count_params(model)
    cost = spec.cost(spec.config, w)
    assert cost["params"] == params
    assert cost["macs"] == pytest.approx(counted.macs, rel=0.01)
    assert cost["macs"] == counted.macs           # the formulas are exact for these families


_impl = st.sampled_from(["sdpa", "eager"])
vit_configs = st.builds(
    lambda p, n, h, hd, layers, ff, k, impl: dict(img_size=p * n, patch_size=p, d_model=h * hd, n_heads=h,
                                                  n_layers=layers, d_ff=ff, num_classes=k, attn_impl=impl),
    st.integers(1, 8), st.integers(1, 6), st.integers(1, 3), st.integers(1, 8), st.integers(1, 3),
    st.none() | st.integers(1, 48), st.integers(1, 20), _impl)
swin_configs = st.builds(
    lambda p, img, m, h, hd, depths, ratio, k, impl: dict(
        img_size=max(img, p), patch_size=p, window_size=m, embed_dim=h * hd, n_heads=h, depths=tuple(depths),
        mlp_ratio=ratio, num_classes=k, attn_impl=impl),
    st.integers(1, 4), st.integers(4, 72), st.integers(1, 8), st.integers(1, 2), st.integers(1, 6),
    st.lists(st.integers(1, 2), min_size=1, max_size=4), st.sampled_from([1.0, 2.5, 4.0]), st.integers(1, 20), _impl)
resnet_configs = st.builds(
    lambda img, width, stages, blocks, k: dict(img_size=img, width=width, n_stages=stages, blocks=blocks,
                                               num_classes=k),
    st.integers(4, 40), st.integers(1, 8), st.integers(1, 4), st.integers(1, 2), st.integers(1, 20))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.tuples(st.just("vit-micro"), vit_configs), st.tuples(st.just("swin-t"), swin_configs),
                 st.tuples(st.just("resnet-micro"), resnet_configs)),
       st.integers(1, 3))
def test_cost_formula_matches_counter(arch_config, batch):
    """Analytic params are exact and MACs within 1% (in fact exact) of harness.instruments.flops on fake tensors."""
    arch, overrides = arch_config
    _assert_cost_matches_counter(registry.resolve(arch, **overrides), Workload(batch_size=batch))


def test_resnet_micro_cost_at_other_workload_sizes():
    spec = registry.resolve("resnet-micro", width=4)
    _assert_cost_matches_counter(spec, Workload(batch_size=2, img_size=19))
    assert isinstance(spec.config, ResNetMicroConfig)
