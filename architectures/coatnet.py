"""CoAtNet (Dai, Liu, Le & Tan, 2021, "CoAtNet: Marrying Convolution and Attention for All Data Sizes")
from the shared layers; presets are data.

Image (B, 3, S, S) → S0 stem (3×3 convs, the first with stride 2) → S1, S2 MBConv stages (pre-norm
BatchNorm, inverted bottleneck ×4 with squeeze-excitation) → S3, S4 Transformer stages with *relative
attention* (global self-attention over the whole feature map plus a learned 2-D relative-position bias of
(2H−1)(2W−1) entries per head, passed to the one :class:`Attention` core as its additive ``bias``) and a
GELU MLP (×4) → global average pool → LayerNorm → head. Every stage halves the side at its first block,
whose shortcut is Proj(Pool(x)) (the paper's appendix): S/2 (stem), S/4, S/8, S/16, S/32.

``layout`` says which stages are convolutional (``C``) and which attend (``T``): the paper's C-C-T-T by
default, its alternatives (C-C-C-C … C-T-T-T, §3.2) as other values — conv early, attention late.

Image sizes: the bias tables are sized from each stage's feature map at ``cfg.img_size`` (a suite's
``img_size`` is written into the config, so a sweep builds each size with its own tables). An image of
another size still runs: each table is resized to the new map (bilinear, corners aligned, so offset 0 keeps its
learned value; timm's ``set_input_size`` resizes bicubically instead); the MACs follow the image, the parameters
the config.

Where it stands against timm's ``coatnet_0_224`` (same blocks, expand-first attention, SE on the expanded
width with ``int(0.25 · C_out)`` channels): ``mbconv_stride="dw"`` and ``head_hidden=768`` give exactly
its parameters and MACs; the presets keep the paper's choices (stride in the first 1×1 conv, "Conv(DepthConv(
Conv(Norm(x), stride=2)))", and a plain pool + norm + linear head). See tests/test_coatnet.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from architectures.inputs import image_inputs
from architectures.layers.attention import Attention, AttnImpl
from architectures.layers.blocks import MLP, PreNorm, make_norm
from harness.api import ArchSpec, Workload, register

LN_EPS = 1e-6
MbConvStride = Literal["1x1", "dw"]


@dataclass(frozen=True)
class CoAtNetConfig:
    """One CoAtNet: ``depths``/``dims`` list S0 (the stem's conv layers and width) then one entry per stage;
    ``layout`` gives each stage's block type, ``C`` (MBConv) or ``T`` (relative-attention Transformer)."""

    img_size: int = 224
    depths: tuple[int, ...] = (2, 2, 3, 5, 2)
    dims: tuple[int, ...] = (64, 96, 192, 384, 768)
    layout: str = "CCTT"
    head_dim: int = 32                    # attention heads of a T stage: its width / head_dim
    expansion: int = 4                    # MBConv inner width: expansion · C_out
    se_ratio: float = 0.25                # squeeze-excitation width: int(se_ratio · C_out)
    mlp_ratio: int = 4
    mbconv_stride: MbConvStride = "1x1"   # a downsampling MBConv strides in its first 1×1 conv (the paper) or
                                          # in the 3×3 depthwise one (timm)
    head_hidden: int | None = None        # a pre-logits Linear + tanh before the head (timm's coatnet_*_224: 768)
    num_classes: int = 1000
    attn_impl: AttnImpl = "sdpa"

    def __post_init__(self) -> None:
        object.__setattr__(self, "depths", tuple(self.depths))   # a TOML list arrives as a list
        object.__setattr__(self, "dims", tuple(self.dims))
        for name in ("img_size", "head_dim", "expansion", "mlp_ratio", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("depths", "dims"):
            if any(not isinstance(v, int) or v <= 0 for v in getattr(self, name)):
                raise ValueError(f"{name} must be positive integers, got {getattr(self, name)}")
        if not re.fullmatch(r"C*T*", self.layout) or not self.layout:
            raise ValueError(f"layout must be C stages then T stages (e.g. 'CCTT'), got {self.layout!r}")
        if not len(self.depths) == len(self.dims) == len(self.layout) + 1:
            raise ValueError(f"depths ({len(self.depths)}) and dims ({len(self.dims)}) need one entry for the stem "
                             f"and one per stage of layout {self.layout!r}")
        for kind, dim in zip(self.layout, self.dims[1:]):
            if kind == "T" and dim % self.head_dim:
                raise ValueError(f"head_dim ({self.head_dim}) must divide the Transformer width {dim}")
            if kind == "C" and int(self.se_ratio * dim) <= 0:
                raise ValueError(f"se_ratio {self.se_ratio} leaves no squeeze-excitation channel at width {dim}")
        if self.mbconv_stride not in ("1x1", "dw"):
            raise ValueError(f"mbconv_stride must be '1x1' or 'dw', got {self.mbconv_stride!r}")
        if self.head_hidden is not None and self.head_hidden <= 0:
            raise ValueError(f"head_hidden must be positive or None, got {self.head_hidden}")
        if self.attn_impl not in ("eager", "sdpa"):
            raise ValueError(f"attn_impl must be 'eager' or 'sdpa', got {self.attn_impl!r}")

    def sides(self, img_size: int | None = None) -> list[int]:
        """Feature-map side after S0, S1, … for a square image (default ``img_size``): each halves, rounding up."""
        side, out = img_size or self.img_size, []
        for _ in self.dims:
            side = -(-side // 2)
            out.append(side)
        return out


def relative_index(h: int, w: int, device: torch.device | None = None) -> Tensor:
    """(h·w, h·w) index into a (2h−1)·(2w−1) relative-position table: (Δrow + h−1)·(2w−1) + Δcol + w−1
    for the pair (query, key) of an h×w map in row-major order."""
    coords = torch.stack(torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device),
                                        indexing="ij")).flatten(1)             # (2, hw)
    rel = coords[:, :, None] - coords[:, None, :]                               # (2, hw, hw)
    return (rel[0] + h - 1) * (2 * w - 1) + rel[1] + w - 1


def pool2(x: Tensor) -> Tensor:
    """2×2 average pooling, stride 2, odd sides rounded up: (B, C, H, W) -> (B, C, ⌈H/2⌉, ⌈W/2⌉)."""
    return F.avg_pool2d(x, 2, ceil_mode=True)


def pool2_cl(x: Tensor) -> Tensor:
    """:func:`pool2` on a channels-last map: (B, H, W, C) -> (B, ⌈H/2⌉, ⌈W/2⌉, C)."""
    return pool2(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class Stem(nn.Module):
    """S0: ``n`` 3×3 convs without bias, the first with stride 2, BatchNorm + GELU between them."""

    def __init__(self, n: int, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 2, 1, bias=False)]
        for _ in range(n - 1):
            layers += [nn.BatchNorm2d(width), nn.GELU(), nn.Conv2d(width, width, 3, 1, 1, bias=False)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:                          # (B, 3, S, S) -> (B, C, S/2, S/2)
        return self.layers(x)


class SqueezeExcite(nn.Module):
    """x · sigmoid(W₂ SiLU(W₁ mean_hw(x))): channel gates from the pooled map."""

    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: Tensor) -> Tensor:                          # (B, C, H, W) -> (B, C, H, W)
        s = x.mean(dim=(2, 3), keepdim=True)                         # (B, C, 1, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """x' = Proj(Pool(x)) + Conv1×1(SE(DWConv3×3(Conv1×1(BN(x))))), BN + GELU after each of the first two
    convs (the paper's pre-norm MBConv); stride 2 in the first 1×1 or the depthwise conv, by ``cfg``. The
    shortcut is the identity when neither side nor width changes; Proj only when the width does."""

    def __init__(self, c_in: int, c_out: int, stride: int, cfg: CoAtNetConfig) -> None:
        super().__init__()
        mid, reduced = cfg.expansion * c_out, int(cfg.se_ratio * c_out)
        s1, s2 = (stride, 1) if cfg.mbconv_stride == "1x1" else (1, stride)
        self.pool = stride == 2
        self.proj = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()
        self.pre_norm = nn.BatchNorm2d(c_in)
        self.expand = nn.Conv2d(c_in, mid, 1, s1, bias=False)
        self.norm1 = nn.BatchNorm2d(mid)
        self.dw = nn.Conv2d(mid, mid, 3, s2, 1, groups=mid, bias=False)
        self.norm2 = nn.BatchNorm2d(mid)
        self.se = SqueezeExcite(mid, reduced)
        self.project = nn.Conv2d(mid, c_out, 1)

    def forward(self, x: Tensor) -> Tensor:                          # (B, C_in, H, W) -> (B, C_out, H/s, W/s)
        shortcut = self.proj(pool2(x) if self.pool else x)
        y = F.gelu(self.norm1(self.expand(self.pre_norm(x))))         # (B, mid, ·, ·)
        y = self.se(F.gelu(self.norm2(self.dw(y))))                  # (B, mid, H/s, W/s)
        return shortcut + self.project(y)


class RelativeAttention(nn.Module):
    """Global multi-head self-attention over a (B, H, W, C_in) map with a learned relative-position bias,
    through the parameters of one :class:`Attention` (its ``qkv``, ``core`` and ``out``), as Swin does.

    softmax(q kᵀ/√hd + B[Δrow, Δcol]) v, B a (2S−1)² × heads table for the S×S map this stage has at the
    configured image size (resized for another map, see the module docstring). At a stage's first block the
    qkv projection reads the narrower input width (C_in → 3·C_out, "expand first", as timm's paper-matching
    coatnet_*_224): it replaces the Attention's own C_out-wide ``qkv``."""

    def __init__(self, c_in: int, c_out: int, head_dim: int, side: int, impl: AttnImpl) -> None:
        super().__init__()
        self.heads, self.side = c_out // head_dim, side
        self.attn = Attention(c_out, self.heads, core=impl)
        if c_in != c_out:
            self.attn.qkv = nn.Linear(c_in, 3 * c_out)
        self.rel_table = nn.Parameter(torch.empty((2 * side - 1) ** 2, self.heads))
        nn.init.trunc_normal_(self.rel_table, std=0.02)
        self.register_buffer("rel_index", relative_index(side, side), persistent=False)

    def bias(self, h: int, w: int) -> Tensor:
        """(1, heads, h·w, h·w) additive score bias for an h×w map."""
        table, index = self.rel_table, self.rel_index                 # ((2S−1)², heads), (S², S²)
        if (h, w) != (self.side, self.side):
            k = 2 * self.side - 1
            grid = table.t().reshape(1, self.heads, k, k)              # (1, heads, 2S−1, 2S−1)
            grid = F.interpolate(grid, size=(2 * h - 1, 2 * w - 1), mode="bilinear", align_corners=True)
            table = grid.reshape(self.heads, -1).t()                   # ((2h−1)(2w−1), heads)
            index = relative_index(h, w, table.device)                 # (hw, hw)
        return table.t()[:, index].unsqueeze(0)                        # (1, heads, hw, hw), contiguous

    def forward(self, x: Tensor) -> Tensor:                          # (B, H, W, C_in) -> (B, H, W, C_out)
        b, h, w, _ = x.shape
        n, hd = h * w, self.attn.head_dim
        qkv = self.attn.qkv(x.reshape(b, n, -1))                       # (B, N, 3·C_out)
        qkv = qkv.view(b, n, 3 * self.heads, hd).transpose(1, 2)       # (B, 3·heads, N, hd)
        q, k, v = qkv.chunk(3, dim=1)                                  # 3 × (B, heads, N, hd)
        y = self.attn.core(q, k, v, self.bias(h, w))                   # (B, heads, N, hd)
        return self.attn.out(y.transpose(1, 2).reshape(b, h, w, -1))   # (B, H, W, C_out)


class TransformerBlock(nn.Module):
    """x' = Proj(Pool(x)) + RelAttn(Pool(LN(x))) at a stage's first block (x + RelAttn(LN(x)) after it),
    then x' + MLP(LN(x')), on channels-last maps (B, H, W, C)."""

    def __init__(self, c_in: int, c_out: int, stride: int, side: int, cfg: CoAtNetConfig) -> None:
        super().__init__()
        self.pool = stride == 2
        self.proj = nn.Linear(c_in, c_out) if c_in != c_out else nn.Identity()
        self.norm1 = make_norm("layernorm", c_in, LN_EPS)
        self.attn = RelativeAttention(c_in, c_out, cfg.head_dim, side, cfg.attn_impl)
        self.mlp = MLP(c_out, cfg.mlp_ratio * c_out, "gelu")
        self.res_mlp = PreNorm(make_norm("layernorm", c_out, LN_EPS))

    def forward(self, x: Tensor) -> Tensor:                          # (B, H, W, C_in) -> (B, H/s, W/s, C_out)
        h = self.norm1(x)
        if self.pool:
            x, h = pool2_cl(x), pool2_cl(h)                            # (B, H/2, W/2, C_in)
        x = self.proj(x) + self.attn(h)
        return self.res_mlp(x, self.mlp)


class CoAtNet(nn.Module):
    """Images (B, 3, S, S) -> logits (B, num_classes)."""

    def __init__(self, cfg: CoAtNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.stem = Stem(cfg.depths[0], cfg.dims[0])
        sides, stages = cfg.sides(), []
        for i, kind in enumerate(cfg.layout, start=1):
            c_in, c, side = cfg.dims[i - 1], cfg.dims[i], sides[i]
            if kind == "C":
                blocks = [MBConv(c_in if j == 0 else c, c, 2 if j == 0 else 1, cfg) for j in range(cfg.depths[i])]
            else:
                blocks = [TransformerBlock(c_in if j == 0 else c, c, 2 if j == 0 else 1, side, cfg)
                          for j in range(cfg.depths[i])]
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.ModuleList(stages)
        width = cfg.dims[-1]
        self.norm = make_norm("layernorm", width, LN_EPS)
        self.pre_logits = nn.Linear(width, cfg.head_hidden) if cfg.head_hidden else None
        self.head = nn.Linear(cfg.head_hidden or width, cfg.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.stem(images)                                          # (B, C0, S/2, S/2)
        channels_last = False
        for kind, stage in zip(self.cfg.layout, self.stages):
            if kind == "T" and not channels_last:                      # layout is C…CT…T: once, at the first T
                x, channels_last = x.permute(0, 2, 3, 1), True          # (B, H, W, C)
            x = stage(x)
        x = x.mean(dim=(1, 2) if channels_last else (2, 3))           # (B, C)
        x = self.norm(x)
        if self.pre_logits is not None:
            x = torch.tanh(self.pre_logits(x))                         # (B, head_hidden)
        return self.head(x)                                            # (B, num_classes)


def _mbconv_cost(cfg: CoAtNetConfig, c_in: int, c: int, side_in: int, side: int) -> tuple[int, int]:
    """(params, MACs per image) of one :class:`MBConv` from a side_in² map to a side² map."""
    mid, r = cfg.expansion * c, int(cfg.se_ratio * c)
    params = 2 * c_in + c_in * mid + 2 * mid + 9 * mid + 2 * mid + (2 * mid * r + r + mid) + (mid * c + c)
    expand_side = side if cfg.mbconv_stride == "1x1" else side_in
    macs = expand_side ** 2 * c_in * mid + side ** 2 * 9 * mid + 2 * mid * r + side ** 2 * mid * c
    if c_in != c:                                                      # Proj on the (pooled) shortcut
        params += c_in * c + c
        macs += side ** 2 * c_in * c
    return params, macs


def _transformer_cost(cfg: CoAtNetConfig, c_in: int, c: int, side: int, table_side: int) -> tuple[int, int]:
    """(params, MACs per image) of one :class:`TransformerBlock` whose attention runs on a side² map (N tokens):
    qkv N·C_in·3C, scores and mix 2·N²·C (quadratic in the map's area), out N·C², MLP 2·N·C·rC."""
    n, heads, f = side * side, c // cfg.head_dim, cfg.mlp_ratio * c
    params = 2 * c_in + (3 * c_in * c + 3 * c) + (2 * table_side - 1) ** 2 * heads + (c * c + c) \
        + 2 * c + (c * f + f) + (f * c + c)
    macs = 3 * n * c_in * c + 2 * n * n * c + n * c * c + 2 * n * c * f
    if c_in != c:                                                      # Proj on the (pooled) shortcut
        params += c_in * c + c
        macs += n * c_in * c
    return params, macs


def coatnet_cost(cfg: CoAtNetConfig, w: Workload) -> dict[str, int]:
    """Exact parameters (bias tables sized at ``cfg.img_size``) and forward MACs on the workload's image
    (``w.img_size``, else ``cfg.img_size``), as :mod:`harness.instruments.flops` counts them (convs, linears, attention)."""
    sides, built = cfg.sides(w.img_size), cfg.sides()
    c0, n0 = cfg.dims[0], cfg.depths[0]
    params = 27 * c0 + (n0 - 1) * (2 * c0 + 9 * c0 * c0)
    macs = sides[0] ** 2 * (27 * c0 + (n0 - 1) * 9 * c0 * c0)
    for i, kind in enumerate(cfg.layout, start=1):
        for j in range(cfg.depths[i]):
            c_in = cfg.dims[i - 1] if j == 0 else cfg.dims[i]
            if kind == "C":
                p, m = _mbconv_cost(cfg, c_in, cfg.dims[i], sides[i - 1] if j == 0 else sides[i], sides[i])
            else:
                p, m = _transformer_cost(cfg, c_in, cfg.dims[i], sides[i], built[i])
            params, macs = params + p, macs + m
    c, k, hid = cfg.dims[-1], cfg.num_classes, cfg.head_hidden
    params += 2 * c + ((c * hid + hid) + (hid * k + k) if hid else c * k + k)
    macs += c * hid + hid * k if hid else c * k
    return {"params": params, "macs": w.batch_size * macs}


def from_timm(state: dict[str, Tensor], head_dim: int = 32) -> dict[str, Tensor]:
    """Rename a timm ``coatnet_*_224`` (MaxxVit, C-C-T-T, two-conv stem) state dict to this module's names.

    timm's 1×1 convs of the Transformer blocks become Linear weights; its head-first qkv rows
    (per head: q, k, v) are reordered to the one Attention's (all q, all k, all v)."""
    mbconv = {"shortcut.expand": "proj", "conv1_1x1": "expand", "conv2_kxk": "dw", "se.fc1": "se.reduce",
              "se.fc2": "se.expand", "conv3_1x1": "project"}
    transformer = {"shortcut.expand": "proj", "norm1.norm": "norm1", "attn.qkv": "attn.attn.qkv",
                   "attn.proj": "attn.attn.out",
                   "norm2": "res_mlp.norm", "mlp.fc1": "mlp.up", "mlp.fc2": "mlp.down"}
    top = {"stem.conv1": "stem.layers.0", "stem.norm1": "stem.layers.1", "stem.conv2": "stem.layers.3",
           "head.norm": "norm", "head.pre_logits.fc": "pre_logits", "head.fc": "head"}
    attending = {k.removesuffix("attn.qkv.weight") for k in state if k.endswith("attn.qkv.weight")}
    out = {}
    for key, value in state.items():
        key = key.replace("attn.rel_pos.relative_position_bias_table", "attn.rel_table")
        parent, _, leaf = key.rpartition(".")
        if not key.startswith("stages."):
            out[f"{top.get(parent, parent)}.{leaf}"] = value
            continue
        _, i, _, j, name = parent.split(".", 4)                       # stages.i.blocks.j.name
        t = f"stages.{i}.blocks.{j}." in attending
        new = (transformer if t else mbconv).get(name, name)
        if t and value.dim() == 4:                                    # a 1×1 conv as a Linear
            value = value.flatten(1)
        if new == "attn.attn.qkv":                                    # (heads, q|k|v, hd) rows -> (q|k|v, heads, hd)
            heads = value.shape[0] // (3 * head_dim)
            value = value.reshape(heads, 3, head_dim, *value.shape[1:]).transpose(0, 1).reshape(value.shape)
        out[f"stages.{i}.{j}.{new}.{leaf}"] = value
    return out


# The paper's model sizes: L (S0's conv layers, then blocks per stage) and D (widths), C-C-T-T, heads of 32.
PRESETS: dict[str, CoAtNetConfig] = {
    "coatnet-0": CoAtNetConfig(depths=(2, 2, 3, 5, 2), dims=(64, 96, 192, 384, 768)),
    "coatnet-1": CoAtNetConfig(depths=(2, 2, 6, 14, 2), dims=(64, 96, 192, 384, 768)),
}

SMALL = (("img_size", 32), ("depths", (2, 2, 1, 2, 1)), ("dims", (8, 8, 16, 16, 32)), ("head_dim", 8),
         ("num_classes", 10))

for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "coatnet", _cfg, CoAtNet, image_inputs,
                      f"CoAtNet (Dai et al., 2021), {_cfg.img_size}², {'-'.join(_cfg.layout)}, "
                      f"L={_cfg.depths}, D={_cfg.dims}, relative attention in the T stages",
                      small=SMALL, cost=coatnet_cost))
