"""Swin Transformer v1 (Liu et al., 2021) from the shared layers; presets are data.

Image (B, 3, S, S) → conv patch partition (B, S/p, S/p, C) → stages of Swin blocks, each
self-attention restricted to M×M windows, every second block with windows shifted by M//2
(cyclic roll + a mask so tokens only attend within their original region), with a patch
merging (2×2 → 2C) between stages → norm → mean pool → head. The learned relative-position
bias and the shift mask reach the one Attention as its additive ``bias``. Feature maps that
are not a multiple of M are zero-padded per block, as torchvision does; the same network as
torchvision's ``swin_t/s/b`` (:func:`from_torchvision` maps its state dict onto this one).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor

from architectures.inputs import image_inputs
from architectures.layers.attention import Attention, AttnImpl
from architectures.layers.blocks import MLP, PreNorm, make_norm
from harness.api import ArchSpec, Workload, register

MASK_VALUE = -100.0   # the reference implementation's additive mask between shifted regions


@dataclass(frozen=True)
class SwinConfig:
    """One Swin: ``depths`` blocks per stage; width and heads double at each stage."""

    img_size: int = 224
    patch_size: int = 4
    embed_dim: int = 96                     # C, the width of stage 1
    depths: tuple[int, ...] = (2, 2, 6, 2)
    n_heads: int = 3                        # heads of stage 1 (head width C / n_heads stays fixed)
    window_size: int = 7                    # M
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    attn_impl: AttnImpl = "sdpa"

    def __post_init__(self) -> None:
        object.__setattr__(self, "depths", tuple(self.depths))   # a TOML list arrives as a list
        for name in ("img_size", "patch_size", "embed_dim", "n_heads", "window_size", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.depths or any(not isinstance(d, int) or d <= 0 for d in self.depths):
            raise ValueError(f"depths must be a non-empty list of positive integers, got {self.depths}")
        if self.embed_dim % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide embed_dim ({self.embed_dim})")
        if self.patch_size > self.img_size:
            raise ValueError(f"patch_size ({self.patch_size}) exceeds img_size ({self.img_size})")
        if self.mlp_ratio <= 0 or int(self.embed_dim * self.mlp_ratio) <= 0:
            raise ValueError(f"mlp_ratio must give a positive MLP width, got {self.mlp_ratio}")

    def stages(self) -> list[tuple[int, int, int, int]]:
        """(side of the feature map, width, heads, depth) per stage, for a square image."""
        side, out = self.img_size // self.patch_size, []
        for i, depth in enumerate(self.depths):
            out.append((side, self.embed_dim * 2 ** i, self.n_heads * 2 ** i, depth))
            side = (side + 1) // 2                                  # patch merging pads odd sides
        return out


def window_partition(x: Tensor, m: int) -> Tensor:
    """(B, H, W, C) with H, W multiples of m -> (B·nW, m·m, C), windows in row-major order."""
    b, h, w, c = x.shape
    x = x.view(b, h // m, m, w // m, m, c)                          # (B, H/m, m, W/m, m, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, m * m, c)        # (B·nW, m², C)


def shift_mask(h: int, w: int, m: int, shift: int, device: torch.device) -> Tensor:
    """Additive (nW, m², m²) mask: MASK_VALUE between tokens that came from different regions
    of the cyclically shifted (h, w) map, 0 within a region."""
    def regions(n: int) -> Tensor:                                  # 0 | 1 | 2 along one axis
        r = torch.zeros(n, dtype=torch.long, device=device)
        r[n - m:] = 1
        r[n - shift:] = 2
        return r
    ids = regions(h)[:, None] * 3 + regions(w)[None, :]             # (H, W)
    ids = window_partition(ids[None, :, :, None], m).squeeze(-1)   # (nW, m²)
    return (ids[:, :, None] != ids[:, None, :]).float() * MASK_VALUE  # (nW, m², m²)


def relative_index(m: int) -> Tensor:
    """(m², m²) index into the (2m-1)² relative-position table: (Δrow + m-1)·(2m-1) + Δcol + m-1."""
    coords = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")).flatten(1)  # (2, m²)
    rel = coords[:, :, None] - coords[:, None, :] + (m - 1)         # (2, m², m²)
    return rel[0] * (2 * m - 1) + rel[1]


@dataclass(frozen=True)
class WindowTables:
    """Index tables of one (Hp, Wp) map, built once per shape and device (never per forward).

    ``gather`` (3·nW·H·m²,): flat positions in a (Hp·Wp·3·H, hd) view of the per-token qkv projection,
    in (q|k|v, window, head, token-in-window) order: the cyclic shift, the window partition and the head
    split as one ``index_select``. ``scatter_window``/``scatter_token`` (Hp·Wp·H,): for each (position,
    head) of the map, the (window·H + head, token-in-window) it came from: the inverse (merge, head
    concat, shift back) as one advanced index. ``mask``: (nW, 1, m², m²) additive shift mask, or None.
    """

    n_windows: int
    gather: Tensor
    scatter_window: Tensor
    scatter_token: Tensor
    mask: Tensor | None


def window_tables(hp: int, wp: int, m: int, shift: int, heads: int, device: torch.device) -> WindowTables:
    """The :class:`WindowTables` of an (hp, wp) map (multiples of m) cut into m×m windows after a cyclic
    shift by ``shift`` (0: none), for ``heads`` heads."""
    nh, nw = hp // m, wp // m
    rows = (torch.arange(hp) + shift) % hp                          # shifted row r holds original row rows[r]
    cols = (torch.arange(wp) + shift) % wp
    src = (rows[:, None] * wp + cols[None, :])                      # (Hp, Wp) original position of each shifted cell
    src = src.view(nh, m, nw, m).permute(0, 2, 1, 3).reshape(nh * nw, m * m)   # (nW, m²)
    part = torch.arange(3)[:, None, None, None] * heads + torch.arange(heads)[None, None, :, None]  # (3, 1, H, 1)
    gather = (src[None, :, None, :] * 3 * heads + part).flatten()  # (3·nW·H·m²,)
    # the inverse: shifted cell (r, c) = window (r//m, c//m), token (r%m, c%m); original p = shifted p + shift
    r = (torch.arange(hp) - shift) % hp                              # original row -> its shifted row
    c = (torch.arange(wp) - shift) % wp
    win = (r[:, None] // m) * nw + (c[None, :] // m)                 # (Hp, Wp)
    tok = (r[:, None] % m) * m + (c[None, :] % m)                    # (Hp, Wp)
    scatter_window = (win.flatten()[:, None] * heads + torch.arange(heads)[None, :]).flatten()  # (Hp·Wp·H,)
    scatter_token = tok.flatten()[:, None].expand(-1, heads).flatten()                          # (Hp·Wp·H,)
    mask = shift_mask(hp, wp, m, shift, torch.device("cpu")).unsqueeze(1) if shift else None   # (nW, 1, m², m²)
    return WindowTables(nh * nw, gather.to(device), scatter_window.to(device), scatter_token.to(device),
                        None if mask is None else mask.to(device))


def _is_fake(t: Tensor) -> bool:
    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _row_aligned(bias: Tensor, multiple: int = 16) -> Tensor:
    """The same values with each row's stride padded to a multiple of ``multiple`` elements: the layout
    the CUDA memory-efficient SDPA kernel needs, so it does not pad a copy of the bias on every call."""
    s = bias.shape[-1]
    pad = (-s) % multiple
    return F.pad(bias, (0, pad))[..., :s] if pad else bias


class ShiftedWindowAttention(nn.Module):
    """Swin's (shifted) window self-attention over a (B, H, W, C) map with the parameters of one
    :class:`Attention` (its ``qkv``, ``out`` and core): windows of M×M tokens (cyclically shifted first when
    ``shift``) attend within themselves, with the learned relative-position bias (+ the shift mask) as the
    core's additive ``bias``.

    The windows are the heads of the core's call: q, k, v are (B, nW·heads, M², hd), so the bias
    (1, nW·heads, M², M²) broadcasts over the batch instead of being repeated per image. The projections run
    per token on the map itself (shifting and windowing commute with them); one gather does the shift, the
    partition and the head split, one the inverse (:class:`WindowTables`, cached per map shape). Under
    no_grad the bias itself is cached too, keyed on the table's version (an optimiser step or a state-dict
    load rebuilds it)."""

    def __init__(self, dim: int, n_heads: int, window: int, shift: int, impl: AttnImpl) -> None:
        super().__init__()
        self.window, self.shift, self.n_heads = window, shift, n_heads
        self.attn = Attention(dim, n_heads, core=impl)
        self.rel_table = nn.Parameter(torch.empty((2 * window - 1) ** 2, n_heads))
        nn.init.trunc_normal_(self.rel_table, std=0.02)
        self.register_buffer("rel_index", relative_index(window), persistent=False)
        self._tables: dict[tuple, WindowTables] = {}
        self._bias: tuple[tuple, Tensor] | None = None

    def tables(self, hp: int, wp: int, shift: int, device: torch.device, cache: bool = True) -> WindowTables:
        """The map's index tables and mask, built on the first call per (hp, wp, device)."""
        key = (hp, wp, shift, device)
        found = self._tables.get(key) if cache else None
        if found is None:
            with torch.inference_mode(False), torch.no_grad():         # ordinary tensors, usable with autograd
                found = window_tables(hp, wp, self.window, shift, self.n_heads, device)
            if cache:
                self._tables[key] = found
        return found

    def bias(self, tables: WindowTables, cache: bool = True) -> Tensor:
        """(1, nW·heads, M², M²) relative-position bias + shift mask in the table's dtype."""
        grad = torch.is_grad_enabled() and self.rel_table.requires_grad
        key = None
        if cache and not grad:
            table = self.rel_table
            key = (id(tables), table.device, table.dtype, table._version, table.data_ptr())
            if self._bias is not None and self._bias[0] == key:
                return self._bias[1]
        t, heads, n = self.window ** 2, self.n_heads, tables.n_windows
        rel = self.rel_table[self.rel_index].permute(2, 0, 1).unsqueeze(0)   # (1, heads, M², M²)
        if tables.mask is not None:
            full = rel + tables.mask.to(rel.dtype)                            # (nW, heads, M², M²)
        else:
            full = rel.expand(n, heads, t, t)
        out = _row_aligned(full.reshape(1, n * heads, t, t))                 # (1, nW·heads, M², M²)
        if key is not None:
            self._bias = (key, out)
        return out

    def forward(self, x: Tensor) -> Tensor:                         # (B, H, W, C) -> (B, H, W, C)
        b, h, w, c = x.shape
        m, heads = self.window, self.n_heads
        pad_b, pad_r = (m - h % m) % m, (m - w % m) % m
        if pad_b or pad_r:
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))                  # (B, Hp, Wp, C)
        hp, wp = h + pad_b, w + pad_r
        shift = self.shift if min(hp, wp) > m else 0                # one window covers it all: no shift
        cache = not (_is_fake(x) or torch.compiler.is_compiling())
        tables = self.tables(hp, wp, shift, x.device, cache)
        n, hd = tables.n_windows, c // heads
        qkv = self.attn.qkv(x).view(b, hp * wp * 3 * heads, hd)      # (B, Hp·Wp·3·heads, hd), per token
        qkv = qkv.index_select(1, tables.gather).view(b, 3, n * heads, m * m, hd)
        q, k, v = qkv.unbind(1)                                      # 3 × (B, nW·heads, M², hd)
        y = self.attn.core(q, k, v, self.bias(tables, cache))       # (B, nW·heads, M², hd)
        y = y[:, tables.scatter_window, tables.scatter_token]       # (B, Hp·Wp·heads, hd), shifted back
        y = self.attn.out(y.view(b, hp, wp, c))                      # (B, Hp, Wp, C)
        return y[:, :h, :w] if pad_b or pad_r else y                 # (B, H, W, C)


class SwinBlock(nn.Module):
    """x + WindowAttn(LN(x)), then x + MLP(LN(x)), on (B, H, W, C)."""

    def __init__(self, dim: int, n_heads: int, cfg: SwinConfig, shift: int) -> None:
        super().__init__()
        self.attn = ShiftedWindowAttention(dim, n_heads, cfg.window_size, shift, cfg.attn_impl)
        self.mlp = MLP(dim, int(dim * cfg.mlp_ratio), "gelu")
        self.res_attn = PreNorm(make_norm("layernorm", dim))
        self.res_mlp = PreNorm(make_norm("layernorm", dim))

    def forward(self, x: Tensor) -> Tensor:
        x = self.res_attn(x, self.attn)
        return self.res_mlp(x, self.mlp)


class PatchMerging(nn.Module):
    """2×2 neighbours concatenated (odd sides zero-padded), normed, projected 4C -> 2C."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = make_norm("layernorm", 4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:                         # (B, H, W, C) -> (B, ⌈H/2⌉, ⌈W/2⌉, 2C)
        h, w = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)  # (B, H/2, W/2, 4C)
        return self.reduction(self.norm(x))


class Swin(nn.Module):
    """Images (B, 3, S, S) -> logits (B, num_classes)."""

    def __init__(self, cfg: SwinConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c, m = cfg.embed_dim, cfg.window_size
        self.patch_embed = nn.Conv2d(3, c, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.embed_norm = make_norm("layernorm", c)
        self.stages = nn.ModuleList(
            nn.ModuleList(SwinBlock(dim, heads, cfg, shift=(m // 2) * (i % 2)) for i in range(depth))
            for _, dim, heads, depth in cfg.stages())
        self.merges = nn.ModuleList(PatchMerging(dim) for _, dim, _, _ in cfg.stages()[:-1])
        width = cfg.stages()[-1][1]
        self.norm = make_norm("layernorm", width)
        self.head = nn.Linear(width, cfg.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.embed_norm(self.patch_embed(images).permute(0, 2, 3, 1))   # (B, S/p, S/p, C)
        for i, stage in enumerate(self.stages):
            for block in stage:
                x = block(x)
            if i < len(self.merges):
                x = self.merges[i](x)                                        # (B, H/2, W/2, 2C)
        return self.head(self.norm(x).mean(dim=(1, 2)))                     # (B, num_classes)


def swin_cost(cfg: SwinConfig, w: Workload) -> dict[str, int]:
    """Exact parameters; forward MACs from the paper's Ω(W-MSA) = 4hwC² + 2M²hwC per block (h, w
    padded to multiples of M) plus the MLP 2hwC·rC, patch embedding, merging and head."""
    if w.img_size and w.img_size != cfg.img_size:
        cfg = replace(cfg, img_size=w.img_size)                      # the image the inputs will have
    c0, m, p, k = cfg.embed_dim, cfg.window_size, cfg.patch_size, cfg.num_classes
    side0 = cfg.img_size // p
    params = (3 * p * p * c0 + c0) + 2 * c0
    macs = side0 * side0 * c0 * 3 * p * p
    stages = cfg.stages()
    for i, (side, c, heads, depth) in enumerate(stages):
        r = int(c * cfg.mlp_ratio)
        params += depth * (4 * c + (4 * c * c + 4 * c) + (2 * m - 1) ** 2 * heads + (2 * c * r + r + c))
        padded = -(-side // m) * m
        macs += depth * (4 * padded ** 2 * c * c + 2 * m * m * padded ** 2 * c + 2 * side * side * c * r)
        if i < len(stages) - 1:
            half = (side + 1) // 2
            params += 2 * 4 * c + 4 * c * 2 * c
            macs += half * half * 4 * c * 2 * c
    cf = stages[-1][1]
    params += 2 * cf + cf * k + k
    macs += cf * k
    return {"params": params, "macs": w.batch_size * macs}


def from_torchvision(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a torchvision ``SwinTransformer`` (v1) state dict to this module's names."""
    inner = {"norm1.": "res_attn.norm.", "norm2.": "res_mlp.norm.", "attn.proj.": "attn.attn.out.",
             "attn.qkv.": "attn.attn.qkv.", "attn.relative_position_bias_table": "attn.rel_table",
             "mlp.0.": "mlp.up.", "mlp.3.": "mlp.down."}
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] != "features":
            out[key] = value                                          # norm.*, head.*
            continue
        i, rest = int(parts[1]), ".".join(parts[2:])
        if i == 0:                                                    # conv, Permute, LayerNorm
            out[{"0": "patch_embed.", "2": "embed_norm."}[parts[2]] + parts[3]] = value
        elif i % 2 == 0:                                              # PatchMerging
            out[f"merges.{i // 2 - 1}.{rest}"] = value
        elif not rest.endswith("relative_position_index"):            # a stage's blocks
            block, name = rest.split(".", 1)
            for old, new in inner.items():
                name = name.replace(old, new) if name.startswith(old) else name
            out[f"stages.{i // 2}.{block}.{name}"] = value
    return out


# torchvision's v1 configurations (Swin paper Table 7): C, depths, stage-1 heads; M=7 at 224².
PRESETS: dict[str, SwinConfig] = {
    "swin-t": SwinConfig(embed_dim=96, depths=(2, 2, 6, 2), n_heads=3),
    "swin-s": SwinConfig(embed_dim=96, depths=(2, 2, 18, 2), n_heads=3),
    "swin-b": SwinConfig(embed_dim=128, depths=(2, 2, 18, 2), n_heads=4),
}

SMALL = (("img_size", 32), ("embed_dim", 16), ("depths", (2, 2)), ("n_heads", 2), ("window_size", 3),
         ("num_classes", 10))

for _name, _cfg in PRESETS.items():
    register(ArchSpec(_name, "swin", _cfg, Swin, image_inputs,
                      f"Swin v1, {_cfg.img_size}², C={_cfg.embed_dim}, depths={_cfg.depths}, M={_cfg.window_size}",
                      small=SMALL, cost=swin_cost))
