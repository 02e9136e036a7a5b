"""Local Relation Networks (Hu, Zhang, Xie & Lin, ICCV 2019, arXiv 1904.11491): ResNet with every
spatial convolution replaced by a k×k *local relation* layer; presets are data.

Local relation layer (:class:`LocalRelation2d`), for an output pixel p' and its k×k window Ω(p')::

    ω_g(p', p) = softmax_{p ∈ Ω(p')}( q_g(p') · k_g(p) + f_geo(p − p')_g )      one weight per group g
    y_c(p')    = Σ_{p ∈ Ω(p')} ω_{g(c)}(p', p) · x_c(p)                          channel c in group g(c)
    out        = W_proj y                                                        1×1 conv, C → C

* Aggregation groups: ``m`` channels share one aggregation weight (the paper's m; m = 8 means
  C/8 groups). When m does not divide C (LR-Net-50's 100 channels) the last group holds the
  C mod m remaining channels: ⌈C/m⌉ groups. The paper does not say how it handled this.
* Query and key: 1×1 convs C → G·``key_dim`` (G groups); with ``key_dim = 1`` (default) the
  appearance composability of a group is the product of two scalars, the query at p' and the key
  at p. The query is taken at the output positions (a strided 1×1 conv), the key at every input
  position. The scalar product follows the reference operator's default (``sim_method=0``,
  query·key summed over a group's key channels, scaled by ``key_dim^-1/2``).
* Geometric prior: a 2-layer MLP (Linear 2 → h, ReLU, Linear h → G) on the k² relative offsets
  (Δy, Δx) ∈ [−k//2, k//2]², shared over positions and images.
* Borders: window positions outside the image are masked out of the softmax (−inf), as the
  reference CUDA operator gives them a large negative logit; the value there is never read.
* Stride s (downsampling blocks and the stem): windows centred on every s-th input pixel
  (strided sampling, padding k//2, like a strided k×k conv: ⌈H/s⌉ outputs per side).
* Output projection ``out_proj``: a 1×1 conv C → C after the aggregation. The paper's table gives
  LR-Net-50 23.3 M parameters; with the projection this implementation has 23.37 M, without it
  20.30 M (the aggregation mixes no channels), so the projection is on by default. The public
  re-implementations (``final1x1``) have it too.

Network (:class:`LRNet`, the paper's table): stem 1×1 conv 3 → 64, 7×7 LR 64 stride 2, 3×3 max
pool stride 2; then torchvision's ResNet bottlenecks (``blocks`` = [3, 4, 6, 3] for LR-Net-50, the
stride on the spatial layer, a 1×1 conv + BN shortcut where the shape changes) whose 3×3 conv is a
k×k LR layer and whose inner width is widened (64 → 100, ..., 512 → 800) to keep ResNet-50's FLOPs;
BN + ReLU after every 1×1 conv and LR layer as in ResNet; global average pool, linear head.

Counting convention (harness/instruments/flops/formulas.py: MACs of matmul-like work only). The two window products
are multiply-accumulates and count: the composability q·k (G·key_dim·k² MACs per output pixel)
and the aggregation Σ ω·x (C·k² MACs per output pixel), window positions outside the image
included (as a conv counts its zero padding). They run as the custom ops ``lrnet::window_dot``,
``lrnet::window_sum`` and (backward only) ``lrnet::window_scatter``, each with a FLOP formula
registered with ``torch.utils.flop_counter`` (an uncounted custom op would be a counting gap), so
their backward (one of each other op per product) is counted in ``fwd_bwd`` too. The geometric
prior's MLP runs once per forward on the k² offsets: k²·(2h + h·G) MACs, independent of the batch.
Softmax, masking, BN, ReLU and pooling count 0. :func:`lrnet_cost` gives parameters and forward
MACs analytically; they equal the counter exactly.

The window ops loop over the k² offsets (never over pixels): each step is one fused multiply-add
of a shifted (strided) slice of the padded input, so nothing k²-times the input is materialised.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import register_flop_formula

from architectures.cnn import shortcut
from architectures.inputs import image_inputs
from harness.api import ArchSpec, Workload, register

# ------------------------------------------------------------------------------------------------
# Window ops: (B, G, ·, H, W) tensors, k×k windows with padding k//2 and stride s
# ------------------------------------------------------------------------------------------------


def _out_side(n: int, stride: int) -> int:
    """Outputs per side of a centred window with padding k//2 and stride s: ⌈n/s⌉."""
    return (n - 1) // stride + 1


def _shifted(xp: Tensor, j: int, k: int, stride: int, ho: int, wo: int) -> Tensor:
    """Offset j = (dy, dx) of the padded (..., H+2p, W+2p) input, sampled at the output positions."""
    dy, dx = divmod(j, k)
    return xp[..., dy:dy + stride * (ho - 1) + 1:stride, dx:dx + stride * (wo - 1) + 1:stride]


def _pad(x: Tensor, k: int) -> Tensor:
    p = k // 2
    return F.pad(x.flatten(1, 2), (p, p, p, p)).unflatten(1, x.shape[1:3])   # (B, G, c, H+2p, W+2p)


@torch.library.custom_op("lrnet::window_dot", mutates_args=())
def window_dot(q: Tensor, key: Tensor, k: int, stride: int) -> Tensor:
    """out[b,g,j,i,l] = Σ_d q[b,g,d,i,l] · key[b,g,d, s·i + dy_j − k//2, s·l + dx_j − k//2] (0 outside).

    q (B, G, d, Ho, Wo), key (B, G, d, H, W) -> (B, G, k², Ho, Wo)."""
    ho, wo = q.shape[-2:]
    kp = _pad(key, k)                                               # (B, G, d, H+2p, W+2p)
    out = q.new_empty(q.shape[0], q.shape[1], k * k, ho, wo)
    for j in range(k * k):
        shifted = _shifted(kp, j, k, stride, ho, wo)                # (B, G, d, Ho, Wo)
        if q.shape[2] == 1:
            torch.mul(q[:, :, 0], shifted[:, :, 0], out=out[:, :, j])
        else:
            torch.sum(q * shifted, dim=2, out=out[:, :, j])
    return out


@torch.library.custom_op("lrnet::window_sum", mutates_args=())
def window_sum(w: Tensor, x: Tensor, k: int, stride: int) -> Tensor:
    """y[b,g,c,i,l] = Σ_j w[b,g,j,i,l] · x[b,g,c, s·i + dy_j − k//2, s·l + dx_j − k//2] (0 outside).

    w (B, G, k², Ho, Wo), x (B, G, c, H, W) -> (B, G, c, Ho, Wo)."""
    ho, wo = w.shape[-2:]
    xp = _pad(x, k)                                                 # (B, G, c, H+2p, W+2p)
    y = x.new_zeros(x.shape[0], x.shape[1], x.shape[2], ho, wo)
    for j in range(k * k):
        y.addcmul_(w[:, :, j:j + 1], _shifted(xp, j, k, stride, ho, wo))   # w broadcast over the c channels
    return y


@torch.library.custom_op("lrnet::window_scatter", mutates_args=())
def window_scatter(w: Tensor, g: Tensor, k: int, stride: int, h: int, wd: int) -> Tensor:
    """The transpose of :func:`window_sum` in x: dx[b,g,c,p] = Σ_{j,p' : s·p'+o_j = p} w[b,g,j,p'] · g[b,g,c,p'].

    w (B, G, k², Ho, Wo), g (B, G, c, Ho, Wo) -> (B, G, c, h, wd)."""
    ho, wo = w.shape[-2:]
    p = k // 2
    dxp = g.new_zeros(g.shape[0], g.shape[1], g.shape[2], h + 2 * p, wd + 2 * p)
    for j in range(k * k):
        _shifted(dxp, j, k, stride, ho, wo).addcmul_(w[:, :, j:j + 1], g)
    return dxp[..., p:p + h, p:p + wd].contiguous()


@window_dot.register_fake
def _(q, key, k, stride):
    return q.new_empty(q.shape[0], q.shape[1], k * k, q.shape[3], q.shape[4])


@window_sum.register_fake
def _(w, x, k, stride):
    return x.new_empty(x.shape[0], x.shape[1], x.shape[2], w.shape[3], w.shape[4])


@window_scatter.register_fake
def _(w, g, k, stride, h, wd):
    return g.new_empty(g.shape[0], g.shape[1], g.shape[2], h, wd)


def _save(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.args = inputs[2:]


def _dot_backward(ctx, grad):
    q, key = ctx.saved_tensors
    k, stride = ctx.args
    dq = window_sum(grad, key, k, stride)                                       # Σ_j grad_j · key_j
    dkey = window_scatter(grad, q, k, stride, key.shape[3], key.shape[4])       # grad_j · q back to p
    return dq, dkey, None, None


def _sum_backward(ctx, grad):
    w, x = ctx.saved_tensors
    k, stride = ctx.args
    dw = window_dot(grad, x, k, stride)                                         # Σ_c grad_c · x_c,j
    dx = window_scatter(w, grad, k, stride, x.shape[3], x.shape[4])
    return dw, dx, None, None


def _scatter_backward(ctx, grad):
    w, g = ctx.saved_tensors
    k, stride, _, _ = ctx.args
    return window_dot(g, grad, k, stride), window_sum(w, grad, k, stride), None, None, None, None


torch.library.register_autograd("lrnet::window_dot", _dot_backward, setup_context=_save)
torch.library.register_autograd("lrnet::window_sum", _sum_backward, setup_context=_save)
torch.library.register_autograd("lrnet::window_scatter", _scatter_backward, setup_context=_save)


@register_flop_formula(torch.ops.lrnet.window_dot)
def _window_dot_flops(q_shape, key_shape, k, stride, *args, **kwargs) -> int:
    b, g, d, ho, wo = q_shape
    return 2 * b * g * d * k * k * ho * wo


@register_flop_formula([torch.ops.lrnet.window_sum, torch.ops.lrnet.window_scatter])
def _window_sum_flops(w_shape, x_shape, k, stride, *args, **kwargs) -> int:
    b, g, jj, ho, wo = w_shape
    return 2 * b * g * x_shape[2] * jj * ho * wo          # window_scatter: x_shape is g's (B, G, c, Ho, Wo)


# ------------------------------------------------------------------------------------------------
# The layer and the network
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LRNetConfig:
    """LR-Net: stem (1×1 conv to ``stem_width``, k×k LR stride 2, max pool), then bottleneck stages:
    stage i has ``blocks[i]`` blocks of 1×1 conv → k×k LR (``widths[i]`` channels) → 1×1 conv to
    ``out_widths[i]``; stages after the first halve the resolution in their first block."""

    img_size: int = 224
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    widths: tuple[int, ...] = (100, 200, 400, 800)             # LR layer width per stage (ResNet-50: 64..512)
    out_widths: tuple[int, ...] = (256, 512, 1024, 2048)
    stem_width: int = 64
    kernel: int = 7                                            # k: the window is k×k
    m: int = 8                                                 # channels sharing one aggregation weight
    key_dim: int = 1                                           # query/key channels per aggregation group
    geo_hidden_ratio: float = 0.5                              # geometric-prior MLP width / groups
    out_proj: bool = True                                      # 1×1 conv C → C after the aggregation
    num_classes: int = 1000

    def __post_init__(self) -> None:
        for name in ("blocks", "widths", "out_widths"):
            object.__setattr__(self, name, tuple(getattr(self, name)))   # a TOML list arrives as a list
        for name in ("img_size", "stem_width", "kernel", "m", "key_dim", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (a centred window), got {self.kernel}")
        if self.geo_hidden_ratio <= 0:
            raise ValueError(f"geo_hidden_ratio must be positive, got {self.geo_hidden_ratio}")
        for name in ("blocks", "widths", "out_widths"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v <= 0 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {values}")
        if not len(self.blocks) == len(self.widths) == len(self.out_widths):
            raise ValueError(f"blocks, widths and out_widths need one entry per stage, got "
                             f"{len(self.blocks)}, {len(self.widths)}, {len(self.out_widths)}")


def groups_of(channels: int, m: int) -> int:
    """Aggregation groups: ⌈C/m⌉ (the last one holds C mod m channels when m does not divide C)."""
    return -(-channels // m)


def geo_hidden(groups: int, ratio: float) -> int:
    """Hidden width of the geometric-prior MLP."""
    return max(1, round(ratio * groups))


class LocalRelation2d(nn.Module):
    """k×k local relation layer: (B, C, H, W) -> (B, C, ⌈H/s⌉, ⌈W/s⌉); see the module docstring."""

    def __init__(self, channels: int, kernel: int = 7, m: int = 8, stride: int = 1, key_dim: int = 1,
                 geo_hidden_ratio: float = 0.5, out_proj: bool = True) -> None:
        super().__init__()
        self.channels, self.kernel, self.m, self.stride, self.key_dim = channels, kernel, m, stride, key_dim
        self.groups = groups_of(channels, m)
        self.query = nn.Conv2d(channels, self.groups * key_dim, 1, stride=stride)
        self.key = nn.Conv2d(channels, self.groups * key_dim, 1)
        hidden = geo_hidden(self.groups, geo_hidden_ratio)
        self.geo = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, self.groups))
        r = torch.arange(kernel, dtype=torch.float32) - kernel // 2
        self.register_buffer("offsets", torch.cartesian_prod(r, r), persistent=False)   # (k², 2): (Δy, Δx)
        self.proj = nn.Conv2d(channels, channels, 1, bias=False) if out_proj else nn.Identity()

    def border_mask(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(k², Ho, Wo) additive mask: 0 where the window position lies in the image, −inf outside."""
        k, s, p = self.kernel, self.stride, self.kernel // 2
        d = torch.arange(k, device=device)
        rows = torch.arange(_out_side(h, s), device=device)[None] * s + d[:, None] - p      # (k, Ho)
        cols = torch.arange(_out_side(w, s), device=device)[None] * s + d[:, None] - p      # (k, Wo)
        inside = ((rows >= 0) & (rows < h))[:, None, :, None] & ((cols >= 0) & (cols < w))[None, :, None, :]
        zero = torch.zeros((), device=device, dtype=dtype)
        return torch.where(inside, zero, float("-inf")).flatten(0, 1)                        # (k², Ho, Wo)

    def forward(self, x: Tensor) -> Tensor:                                 # (B, C, H, W)
        b, c, h, w = x.shape
        g, d, k, s = self.groups, self.key_dim, self.kernel, self.stride
        q = self.query(x).unflatten(1, (g, d))                              # (B, G, d, Ho, Wo)
        key = self.key(x).unflatten(1, (g, d))                              # (B, G, d, H, W)
        if d > 1:
            q = q * d ** -0.5
        logits = window_dot(q, key, k, s)                                   # (B, G, k², Ho, Wo)
        geo = self.geo(self.offsets).t()                                    # (G, k²)
        logits = logits + (geo[:, :, None, None] + self.border_mask(h, w, x.device, logits.dtype))   # one pass
        weights = logits.softmax(dim=2)                                     # over the k² window
        full = c // self.m                                                  # groups of exactly m channels
        parts = []
        if full:
            parts.append(window_sum(weights[:, :full], x[:, :full * self.m].unflatten(1, (full, self.m)), k, s))
        if full < g:                                                        # the last, smaller group
            parts.append(window_sum(weights[:, full:], x[:, full * self.m:].unsqueeze(1), k, s))
        y = torch.cat([p.flatten(1, 2) for p in parts], dim=1) if len(parts) > 1 else parts[0].flatten(1, 2)
        return self.proj(y)                                                 # (B, C, Ho, Wo)


class Bottleneck(nn.Module):
    """relu(BN(1×1 up(relu(BN(LR(relu(BN(1×1 down(x))))))) + shortcut(x)), stride on the LR layer."""

    def __init__(self, c_in: int, width: int, c_out: int, stride: int, cfg: LRNetConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.lr = LocalRelation2d(width, cfg.kernel, cfg.m, stride, cfg.key_dim, cfg.geo_hidden_ratio, cfg.out_proj)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.shortcut = shortcut(c_in, c_out, stride)

    def forward(self, x: Tensor) -> Tensor:                                 # (B, C_in, H, W) -> (B, C_out, H/s, W/s)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.lr(y)))
        return self.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class LRNet(nn.Module):
    """Images (B, 3, S, S) -> logits (B, num_classes)."""

    def __init__(self, cfg: LRNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        sw = cfg.stem_width
        self.stem = nn.Sequential(
            nn.Conv2d(3, sw, 1, bias=False), nn.BatchNorm2d(sw), nn.ReLU(),
            LocalRelation2d(sw, cfg.kernel, cfg.m, 2, cfg.key_dim, cfg.geo_hidden_ratio, cfg.out_proj),
            nn.BatchNorm2d(sw), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1))
        blocks, c_in = [], sw
        for i, (n, width, c_out) in enumerate(zip(cfg.blocks, cfg.widths, cfg.out_widths)):
            for j in range(n):
                blocks.append(Bottleneck(c_in, width, c_out, 2 if i > 0 and j == 0 else 1, cfg))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, cfg.num_classes)

    def forward(self, images: Tensor) -> Tensor:                            # (B, 3, S, S)
        x = self.blocks(self.stem(images))                                  # (B, C_last, S/32, S/32)
        return self.head(x.mean(dim=(2, 3)))                                # (B, num_classes)


# ------------------------------------------------------------------------------------------------
# Analytic cost
# ------------------------------------------------------------------------------------------------


def local_relation_cost(cfg: LRNetConfig, c: int, side_in: int, stride: int, batch: int) -> tuple[int, int]:
    """(parameters, forward MACs) of one :class:`LocalRelation2d` on a square (side_in)² input."""
    g, d, kk = groups_of(c, cfg.m), cfg.key_dim, cfg.kernel ** 2
    h = geo_hidden(g, cfg.geo_hidden_ratio)
    o = _out_side(side_in, stride)
    params = 2 * (c * g * d + g * d) + (2 * h + h) + (h * g + g) + (c * c if cfg.out_proj else 0)
    per_image = (o * o * c * g * d + side_in * side_in * c * g * d    # query (strided) and key 1×1 convs
                 + o * o * g * d * kk                                 # composability q·k over the window
                 + o * o * c * kk                                     # aggregation Σ ω·x
                 + (o * o * c * c if cfg.out_proj else 0))            # output projection
    return params, batch * per_image + kk * (2 * h + h * g)           # + the geometric prior, once


def lrnet_cost(cfg: LRNetConfig, w: Workload) -> dict[str, int]:
    """Exact parameters (convs, LR layers, BN scale/shift, head) and forward MACs, eval + no_grad."""
    b, side, sw = w.batch_size, w.img_size or cfg.img_size, cfg.stem_width
    params, macs = 3 * sw + 2 * sw, b * side * side * 3 * sw           # stem 1×1 conv + BN
    p, m = local_relation_cost(cfg, sw, side, 2, b)
    params, macs = params + p + 2 * sw, macs + m
    side = _out_side(_out_side(side, 2), 2)                            # LR stride 2, then max pool 3 s2 p1
    c_in = sw
    for i, (n, width, c_out) in enumerate(zip(cfg.blocks, cfg.widths, cfg.out_widths)):
        for j in range(n):
            stride = 2 if i > 0 and j == 0 else 1
            o = _out_side(side, stride)
            p, m = local_relation_cost(cfg, width, side, stride, b)
            params += c_in * width + p + width * c_out + 2 * (width + width + c_out)
            macs += b * (side * side * c_in * width + o * o * width * c_out) + m
            if stride != 1 or c_in != c_out:                           # 1×1 conv + BN shortcut
                params += c_in * c_out + 2 * c_out
                macs += b * o * o * c_in * c_out
            c_in, side = c_out, o
    params += c_in * cfg.num_classes + cfg.num_classes
    macs += b * c_in * cfg.num_classes
    return {"params": params, "macs": macs}


# ------------------------------------------------------------------------------------------------
# Presets
# ------------------------------------------------------------------------------------------------

PRESETS: dict[str, LRNetConfig] = {
    "lrnet-50": LRNetConfig(),                                   # the paper's table: 7×7, m = 8
    "lrnet-26": LRNetConfig(blocks=(2, 2, 2, 2)),
}
# 32²: stages at 8² and 4²; 10 channels with m = 4 exercise the smaller last group (4 + 4 + 2)
LRNET_SMALL = (("img_size", 32), ("blocks", (1, 1)), ("widths", (10, 16)), ("out_widths", (16, 32)),
               ("stem_width", 8), ("m", 4), ("num_classes", 10))

for _name, _cfg in PRESETS.items():
    register(ArchSpec(
        _name, "lrnet", _cfg, LRNet, image_inputs,
        f"LR-Net, ResNet bottlenecks {list(_cfg.blocks)} with {_cfg.kernel}×{_cfg.kernel} local relation layers "
        f"(m={_cfg.m}) instead of 3×3 convs, widths {list(_cfg.widths)}",
        small=LRNET_SMALL, cost=lrnet_cost))
