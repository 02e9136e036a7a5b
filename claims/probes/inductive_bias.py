"""What a layer's structure builds in: translation equivariance and locality of real convolutions
(a Conv2d stack, a strided and pooled resnet18) against a ViT with and without its positions, the hierarchy of grid
sizes, and how far one token reaches through Swin's window blocks with and without the shifted windows. Measured on
the real modules, small and on the CPU, in seconds; :func:`influence_share` (a receptive field read from gradients)
is shared with the sequence claims."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torchvision
from torch import Tensor, nn

from architectures.layers.attention import Attention
from architectures.layers.blocks import Block
from architectures.swin import SwinBlock, SwinConfig
from claims.evidence import Context
from claims.model import Evidence, Figure
from claims.probes import CPU, probe
from harness.contract.registry import resolve
from harness.contract.spec import Workload
from harness.engine.models import materialize


def _rel(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def conv_shift_error(seed: int = 0, side: int = 32, shift: tuple[int, int] = (3, 5)) -> float:
    """A stack of two real nn.Conv2d (3×3, zero padding) with a tanh between: max relative difference of
    conv(shift(x)) and shift(conv(x)) on the interior (away from the borders the padding touches)."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Tanh(), nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        a = net(torch.roll(x, shift, dims=(2, 3)))
        b = torch.roll(net(x), shift, dims=(2, 3))
    m = 2 + max(shift)                                    # the receptive field's reach + the wrapped band
    return _rel(a[..., m:-m, m:-m], b[..., m:-m, m:-m])


def circular_resnet18(seed: int = 0) -> nn.Module:
    """torchvision's resnet18 at random initialisation (eval mode), its padding made circular — every
    convolution's, and the stem's max pool's — so that the image borders play no part: what is left of any
    break in shift-equivariance is the network's subsampling (strided convolutions, max pooling)."""
    torch.manual_seed(seed)
    net = torchvision.models.resnet18(weights=None).eval()
    for mod in net.modules():
        if isinstance(mod, nn.Conv2d) and mod.padding != (0, 0):
            mod.padding_mode = "circular"
    pool = net.maxpool
    net.maxpool = nn.Sequential(nn.CircularPad2d(pool.padding),
                                nn.MaxPool2d(pool.kernel_size, pool.stride, padding=0))
    return net


def resnet_shift_error(shift: int, side: int = 128, seed: int = 0) -> float:
    """A real CNN with strides and pooling (:func:`circular_resnet18`: total stride 32): max relative change of
    its global-pooled features when the image is shifted cyclically by ``shift`` px. A network equivariant to
    every shift gives rounding for any shift; subsampling keeps it only for multiples of the total stride."""
    net = circular_resnet18(seed)
    seen: list[Tensor] = []
    hook = net.avgpool.register_forward_hook(lambda mod, a, out: seen.append(out.flatten(1)))
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        net(x)
        net(torch.roll(x, shift, dims=3))
    hook.remove()
    return _rel(seen[1], seen[0])


def vit_shift_error(positions: bool, seed: int = 0) -> float:
    """vit-micro (32², patch 4: an 8×8 grid of patch tokens) at initialisation: shift the image by one patch
    (cyclic, 4 px to the right) and compare the final patch tokens with the unshifted ones rolled by one
    column — max relative difference. ``positions=False`` zeroes the position table first."""
    spec = resolve("vit-micro")
    model = materialize(spec, Workload(), CPU, seed=seed).eval()
    if not positions:
        with torch.no_grad():
            model.pos_embed.zero_()
    p, g = spec.config.patch_size, spec.config.img_size // spec.config.patch_size
    seen: list[Tensor] = []
    hook = model.norm.register_forward_hook(lambda mod, a, out: seen.append(out))
    x = torch.randn(2, 3, spec.config.img_size, spec.config.img_size)
    with torch.no_grad():
        model(x)
        model(torch.roll(x, p, dims=3))
    hook.remove()
    grid = lambda t: t[:, 1:].reshape(t.shape[0], g, g, -1)          # noqa: E731  (B, 1+N, d) -> (B, g, g, d)
    return _rel(grid(seen[1]), torch.roll(grid(seen[0]), 1, dims=2))


def influence_share(fn: Callable[[Tensor], Tensor], x: Tensor, out_index: tuple, reduce_dims: tuple[int, ...]
                    ) -> float:
    """The share of input positions whose gradient on one output (``fn(x)[out_index].sum()``) is non-zero:
    the measured receptive field of that output over the positions of ``x`` (``reduce_dims``: the channel dims)."""
    x = x.clone().requires_grad_(True)
    fn(x)[out_index].sum().backward()
    seen = x.grad.abs().amax(dim=reduce_dims) > 0                    # (positions…)
    return float(seen.float().mean())


def grid_sizes(arch: str, kinds: tuple[type, ...], side_of: Callable[[Tensor], tuple]) -> list[tuple]:
    """The distinct grid sizes the outputs of ``arch``'s modules of ``kinds`` have in one forward of a
    random image (``side_of`` reads a grid size from an output): the model's hierarchy, measured."""
    spec = resolve(arch)
    model = materialize(spec, Workload(), CPU, seed=0).eval()
    sizes: set[tuple] = set()
    hooks = [mod.register_forward_hook(lambda mod, a, out: sizes.add(side_of(out)))
             for mod in model.modules() if isinstance(mod, kinds)]
    side = spec.config.img_size
    with torch.no_grad():
        model(torch.randn(1, 3, side, side))
    for h in hooks:
        h.remove()
    return sorted(sizes)


@probe("inductive_bias", figures=("vit_shift_error", "conv_shift_error", "vit_nopos_shift_error",
                                  "resnet_shift_error_1px", "resnet_shift_error_stride",
                                  "conv_local_share", "attention_local_share", "cnn_grid_sizes",
                                  "vit_grid_sizes"))
def inductive_bias(ctx: Context | None) -> Evidence:
    """C44: translation (one-patch shift) equivariance of a real Conv2d stack, of a ViT with its learned
    positions and of the same ViT with them zeroed; locality as the share of an 8×8 grid one output sees
    through one 3×3 Conv2d vs one layer of our Attention."""
    ev = Evidence()
    ev.figures["conv_shift_error"] = Figure(conv_shift_error(), unit="max rel. error",
                                            note="2 Conv2d 3×3 (zero padding), 32² image shifted by (3, 5) px; "
                                                 "interior compared (padding touches only the borders)")
    ev.figures["resnet_shift_error_1px"] = Figure(
        resnet_shift_error(1), unit="max rel. error",
        note="torchvision resnet18 (random init, circular padding: no border effect), 128² image shifted by 1 px: "
             "its global-pooled features before and after")
    ev.figures["resnet_shift_error_stride"] = Figure(
        resnet_shift_error(32), unit="max rel. error",
        note="the same resnet18, the image shifted by its total stride, 32 px")
    ev.figures["vit_shift_error"] = Figure(vit_shift_error(True), unit="max rel. error",
                                           note="vit-micro at init (learned positions, std 0.02), image shifted "
                                                "one patch: final patch tokens vs the unshifted ones rolled")
    ev.figures["vit_nopos_shift_error"] = Figure(vit_shift_error(False), unit="max rel. error",
                                                 note="the same ViT with its position table zeroed")
    torch.manual_seed(0)
    d, g = 16, 8
    conv = nn.Conv2d(d, d, 3, padding=1)
    attn = Attention(d, 2, core="eager").eval()
    centre = (slice(None), slice(None), g // 2, g // 2)
    ev.figures["conv_local_share"] = Figure(
        influence_share(conv, torch.randn(1, d, g, g), centre, (0, 1)), unit="share of positions",
        note=f"one Conv2d 3×3 over an {g}×{g} grid: inputs with a non-zero gradient on the centre output")
    ev.figures["attention_local_share"] = Figure(
        influence_share(attn, torch.randn(1, g * g, d), (slice(None), g * g // 2 + g // 2), (0, 2)),
        unit="share of positions", note=f"one layer of our Attention over the same {g * g} tokens (2 heads)")
    cnn = grid_sizes("resnet-micro", (nn.Conv2d,), lambda out: tuple(out.shape[-2:]))
    vit = grid_sizes("vit-micro", (Block,), lambda out: (out.shape[1],))
    ev.figures["cnn_grid_sizes"] = Figure(float(len(cnn)), unit="grid sizes",
                                          note=f"resnet-micro (32²): its convolutions' output maps {cnn}")
    ev.figures["vit_grid_sizes"] = Figure(float(len(vit)), unit="grid sizes",
                                          note=f"vit-micro (32²): tokens out of every encoder block {vit}")
    ev.notes.append("Only a one-patch shift is tested on the ViT: a shift by part of a patch changes every patch "
                    "token for any model with a stride-p patch embedding, positions or not.")
    return ev



def swin_reach(shifts: tuple[int, ...], side: int = 8, m: int = 4, token: tuple[int, int] = (3, 3),
               seed: int = 0) -> tuple[int, int, float]:
    """Perturb one token of a side×side map and run it through Swin blocks (architectures.swin.SwinBlock, window
    m, each block's cyclic shift from ``shifts``). Returns (tokens changed, m×m windows of the regular partition
    holding a changed token, the largest change outside the perturbed token's window relative to the largest
    change)."""
    cfg = SwinConfig(img_size=side * 4, patch_size=4, embed_dim=32, depths=(len(shifts),), n_heads=2, window_size=m)
    torch.manual_seed(seed)
    blocks = [SwinBlock(32, 2, cfg, shift=s).eval() for s in shifts]
    x = torch.randn(1, side, side, 32)                                  # (B, H, W, C)
    y = x.clone()
    y[0, token[0], token[1]] += torch.randn(32)                         # not a constant: LayerNorm removes that
    with torch.no_grad():
        for b in blocks:
            x, y = b(x), b(y)
    delta = (y - x).abs().amax(-1)[0]                                   # (H, W)
    changed = delta > 1e-6 * float(delta.max())
    wins = changed.reshape(side // m, m, side // m, m).any(3).any(1)    # (H/m, W/m)
    own = torch.zeros_like(changed)
    r, c = (token[0] // m) * m, (token[1] // m) * m
    own[r:r + m, c:c + m] = True
    outside = float(delta[~own].max() / delta.max())
    return int(changed.sum()), int(wins.sum()), outside


@probe("swin_windows", figures=("wmsa_outside_change", "wmsa_windows_reached", "pair_windows_reached",
                                "unshifted_pair_windows_reached", "pair_outside_change"))
def swin_windows(ctx: Context | None) -> Evidence:
    """C45 on our Swin blocks: which tokens one perturbed token reaches after one W-MSA block, after the
    W-MSA + SW-MSA pair Swin alternates, and after two unshifted blocks (the control)."""
    ev = Evidence()
    side, m = 8, 4
    where = f"{side}×{side} map, M = {m}, token (3, 3) perturbed"
    n1, w1, out1 = swin_reach((0,))
    n2, w2, out2 = swin_reach((0, m // 2))
    n0, w0, _ = swin_reach((0, 0))
    ev.figures["wmsa_outside_change"] = Figure(out1, unit="rel. change", note=f"one W-MSA block, {where}: largest "
                                               f"change outside its window / largest change ({n1} tokens changed)")
    ev.figures["wmsa_windows_reached"] = Figure(float(w1), unit="windows", note=f"one W-MSA block, {where}")
    ev.figures["pair_windows_reached"] = Figure(float(w2), unit="windows",
                                                note=f"W-MSA then SW-MSA (shift {m // 2}), {where}: {n2} tokens changed")
    ev.figures["pair_outside_change"] = Figure(out2, unit="rel. change", note="W-MSA then SW-MSA: largest change "
                                               "outside the perturbed token's window / largest change")
    ev.figures["unshifted_pair_windows_reached"] = Figure(float(w0), unit="windows",
                                                          note=f"two W-MSA blocks, no shift, {where}: {n0} tokens "
                                                               "changed")
    return ev
