"""Vision Transformer (Dosovitskiy et al., 2021) from the shared layers; presets are data.

Image (B, 3, S, S) → conv patch embedding (B, N, d), N = (S/p)² → prepend [CLS] → add learned
positions (1, 1+N, d) → L pre-norm encoder blocks (the one Attention + GELU MLP, LayerNorm
eps=1e-6) → final norm → head on [CLS]. The same network as torchvision's ``VisionTransformer``
(:func:`from_torchvision` maps its state dict onto this one).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from architectures.inputs import image_inputs
from architectures.layers.attention import Attention, AttnImpl
from architectures.layers.blocks import MLP, Block, PreNorm, make_norm
from harness.api import ArchSpec, Workload, register

LN_EPS = 1e-6


@dataclass(frozen=True)
class ViTConfig:
    """One ViT: image and patch sides, width, depth, heads, MLP width, classes, attention kernel."""

    img_size: int = 224
    patch_size: int = 16
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int | None = None               # None: 4 · d_model
    num_classes: int = 1000
    attn_impl: AttnImpl = "sdpa"
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("img_size", "patch_size", "d_model", "n_layers", "n_heads", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.img_size % self.patch_size:
            raise ValueError(f"patch_size ({self.patch_size}) must divide img_size ({self.img_size})")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def n_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def n_tokens(self) -> int:
        """Sequence length the encoder sees: patches + [CLS] (197 for ViT-B/16 at 224²)."""
        return self.n_patches + 1

    @property
    def patch_dim(self) -> int:
        """Values in one flattened RGB patch, 3·p² (768 for p=16)."""
        return 3 * self.patch_size ** 2


def encoder_block(cfg: ViTConfig) -> Block:
    """x + Attn(LN(x)), then x + MLP(LN(x)): the shared Block with pre-norm residuals."""
    return Block(Attention(cfg.d_model, cfg.n_heads, core=cfg.attn_impl),
                 MLP(cfg.d_model, cfg.ff_dim, "gelu", cfg.dropout),
                 lambda: PreNorm(make_norm("layernorm", cfg.d_model, LN_EPS), cfg.dropout))


class ViT(nn.Module):
    """Images (B, 3, S, S) -> logits (B, num_classes)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.patch_embed = nn.Conv2d(3, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.n_tokens, d).normal_(std=0.02))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(encoder_block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm("layernorm", d, LN_EPS)
        self.head = nn.Linear(d, cfg.num_classes)

    def tokens(self, images: Tensor) -> Tensor:
        """Patch tokens with [CLS] prepended and positions added: (B, 1+N, d)."""
        b, _, h, w = images.shape
        s = self.cfg.img_size
        if (h, w) != (s, s):
            raise ValueError(f"this ViT takes {s}x{s} images (its position table); got {h}x{w}"
                             f" (set img_size={h} in the config)")
        x = self.patch_embed(images)                                      # (B, d, S/p, S/p)
        x = x.flatten(2).transpose(1, 2)                                  # (B, N, d)
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)       # (B, 1+N, d)
        return self.drop(x + self.pos_embed)

    def forward(self, images: Tensor) -> Tensor:
        x = self.tokens(images)                                           # (B, 1+N, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])                              # (B, num_classes)


def vit_cost(cfg: ViTConfig, w: Workload) -> dict[str, int]:
    """Exact parameters and forward MACs (matmuls and the patch conv, as harness.instruments.flops counts)."""
    d, f, t, n, k = cfg.d_model, cfg.ff_dim, cfg.n_tokens, cfg.n_patches, cfg.num_classes
    block_params = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
    params = (cfg.patch_dim * d + d) + d + t * d + cfg.n_layers * block_params + 2 * d + (d * k + k)
    # per block: q/k/v/out projections 4·T·d², QKᵀ and AV 2·T²·d, MLP 2·T·d·f
    block_macs = 4 * t * d * d + 2 * t * t * d + 2 * t * d * f
    macs = n * cfg.patch_dim * d + cfg.n_layers * block_macs + d * k
    return {"params": params, "macs": w.batch_size * macs}


def from_torchvision(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a torchvision ``VisionTransformer`` state dict to this module's names.

    nn.MultiheadAttention's ``in_proj`` rows are [q; k; v], the layout of ``Attention.qkv``.
    """
    renames = [("conv_proj.", "patch_embed."), ("class_token", "cls_token"),
               ("encoder.pos_embedding", "pos_embed"), ("encoder.ln.", "norm."), ("heads.head.", "head."),
               ("encoder.layers.encoder_layer_", "blocks."), (".ln_1.", ".res_attn.norm."),
               (".ln_2.", ".res_mlp.norm."), (".self_attention.in_proj_", ".attn.qkv."),
               (".self_attention.out_proj.", ".attn.out."), (".mlp.0.", ".mlp.up."), (".mlp.3.", ".mlp.down.")]
    out = {}
    for key, value in state.items():
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value
    return out


# name -> (d_model, n_layers, n_heads, d_ff): Ti/S from DeiT, B/L/H from the ViT paper (Table 1).
SIZES: dict[str, tuple[int, int, int, int]] = {
    "ti": (192, 12, 3, 768),
    "s": (384, 12, 6, 1536),
    "b": (768, 12, 12, 3072),
    "l": (1024, 24, 16, 4096),
}

PRESETS: dict[str, ViTConfig] = {
    f"vit-{size}{patch}": ViTConfig(patch_size=patch, d_model=d, n_layers=l, n_heads=h, d_ff=f)
    for size, (d, l, h, f) in SIZES.items() for patch in (16, 32)
}
PRESETS["vit-h14"] = ViTConfig(patch_size=14, d_model=1280, n_layers=32, n_heads=16, d_ff=5120)
# sized for CPU training experiments (CIFAR-like 32² images, 64 patches of 4²)
PRESETS["vit-micro"] = ViTConfig(img_size=32, patch_size=4, d_model=128, n_layers=4, n_heads=4, d_ff=512,
                                 num_classes=10)

SMALL = (("img_size", 32), ("patch_size", 8), ("d_model", 32), ("n_layers", 2), ("n_heads", 2),
         ("d_ff", 64), ("num_classes", 10))

for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "vit", _cfg, ViT, image_inputs,
                      f"ViT, {_cfg.img_size}² / patch {_cfg.patch_size} ({_cfg.n_tokens} tokens), "
                      f"d={_cfg.d_model}, L={_cfg.n_layers}, h={_cfg.n_heads}",
                      small=SMALL, cost=vit_cost))
