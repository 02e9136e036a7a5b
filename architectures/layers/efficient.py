"""Long-sequence cores for the one :class:`~architectures.layers.attention.Attention`: sliding window,
BigBird block-sparse, Longformer (window + global tokens), Linformer and Performer (FAVOR+).

A core only mixes q, k, v; the projections, head split, hooks and cache stay in ``Attention``, so
``Attention(d, h, kv, core=SlidingWindowCore(128))`` has exactly the exact layer's parameters (the same
``qkv``/``out`` state-dict keys) plus whatever the core owns (Linformer's E, F). The cores that are
*exact attention over a subset of keys* (window, BigBird, Longformer; Linformer over projected keys) call
the shared ``eager_attention`` / ``sdpa_attention`` kernel; window, BigBird and Longformer gather key
*blocks* so their cost is O(n·keys-per-query), never a dense n×n mask. Each core's ``macs`` is its
forward MAC count as :mod:`harness.instruments.flops` counts it. :func:`approximation_error` measures a layer with an
approximate core against exact attention with the same projection weights.
"""
from __future__ import annotations

import functools
import math
import random

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from architectures.layers.attention import AttnImpl, Core, Heads, Kernel, core_fn, sdpa_attention


def _refuse(core: Core, bias: bool = False, causal: bool = False, cache: bool = False, dropout: bool = False,
            cross: bool = False) -> None:
    """A clear error for what ``core`` cannot honour (it is never silently ignored)."""
    what = [name for name, asked in (("an additive bias", bias), ("a causal mask", causal), ("a KV cache", cache),
                                     ("attention dropout", dropout), ("keys of another length", cross)) if asked]
    if what:
        raise ValueError(f"{type(core).__name__} does not support {' or '.join(what)}")


def approximation_error(variant: nn.Module, exact: nn.Module, x: Tensor, *, causal: bool = False) -> float:
    """‖variant(x) − exact(x)‖_F / ‖exact(x)‖_F, the variant run with ``exact``'s qkv/out weights.

    Both are self-attention :class:`Attention` layers of the same width/heads (``variant`` with an
    approximate core); both are called with ``causal``. Neither module is modified.
    """
    shared = {f"{name}.{p}": t for name in ("qkv", "out") for p, t in getattr(exact, name).named_parameters()}
    mine = dict(variant.named_parameters())
    for key, t in shared.items():
        if key not in mine or mine[key].shape != t.shape:
            raise ValueError(f"the variant and the exact layer differ in {key}")
    with torch.no_grad():
        ref = exact(x, causal=causal)
        got = functional_call(variant, shared, (x,), {"causal": causal}, strict=False)
    return float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))


# ------------------------------------------------------------------------------------------
# Block gathering: the O(n) engine shared by the window and BigBird cores
# ------------------------------------------------------------------------------------------

def gathered_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, keep: Tensor, block: int,
                       kernel: Kernel = sdpa_attention, dropout_p: float = 0.0, scale: float | None = None,
                       shared: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Each query block attends, through the shared kernel, to the key blocks listed for it.

    q: (B, H, Nq·block, hd), Nq query blocks; k, v: (B, Hkv, S, hd) with nb = ⌈S/block⌉ key
    blocks; idx: (Nq, K) long, key-block numbers in [0, nb] (nb: an all-zero padding block);
    ``shared``: optional (k_s, v_s), each (B, Hkv, G, hd), G keys every query block sees too (Longformer's
    global tokens), placed *before* the gathered ones in one softmax; keep: bool (Nq, block, C) or
    (B, Nq, block, C) with C = G + K·block columns (shared keys first), True where a query may see a
    key (padding and duplicates must be False; every row needs one True). Returns (B, H, Nq·block, hd).
    Cost: Nq·block·(G + K·block) scores per head — linear in length for fixed G and K.
    """
    b, h, _, hd = q.shape
    hkv, s = k.shape[1], k.shape[2]
    nq, n_keys = idx.shape
    nb = -(-s // block)
    pad = (nb + 1) * block - s                                           # ≥ one whole zero block
    kb = F.pad(k, (0, 0, 0, pad)).view(b, hkv, nb + 1, block, hd)         # (B, Hkv, nb+1, blk, hd)
    vb = F.pad(v, (0, 0, 0, pad)).view(b, hkv, nb + 1, block, hd)
    flat = idx.reshape(-1)
    kg = kb[:, :, flat].view(b, hkv, nq, n_keys * block, hd)             # (B, Hkv, Nq, K·blk, hd)
    vg = vb[:, :, flat].view(b, hkv, nq, n_keys * block, hd)
    kg = kg.transpose(1, 2).reshape(b * nq, hkv, n_keys * block, hd)     # (B·Nq, Hkv, K·blk, hd)
    vg = vg.transpose(1, 2).reshape(b * nq, hkv, n_keys * block, hd)
    if shared is not None:
        g = shared[0].shape[2]
        ks, vs = (x.unsqueeze(1).expand(b, nq, hkv, g, hd).reshape(b * nq, hkv, g, hd) for x in shared)
        kg, vg = torch.cat([ks, kg], dim=2), torch.cat([vs, vg], dim=2)   # (B·Nq, Hkv, G+K·blk, hd)
    cols = kg.shape[2]
    qg = q.view(b, h, nq, block, hd).transpose(1, 2).reshape(b * nq, h, block, hd)   # (B·Nq, H, blk, hd)
    mask = keep.expand(b, nq, block, cols).unsqueeze(2)                  # broadcast over batch
    mask = mask.reshape(b * nq, 1, block, cols)                          # (B·Nq, 1, blk, C)
    y = kernel(qg, kg, vg, None, mask, dropout_p, scale)                 # (B·Nq, H, blk, hd)
    return y.view(b, nq, h, block, hd).transpose(1, 2).reshape(b, h, nq * block, hd)   # (B, H, Nq·blk, hd)


def _key_positions(idx: Tensor, block: int) -> Tensor:
    """(Nq, K) key-block numbers -> (Nq, K·block) token positions."""
    offs = torch.arange(block, device=idx.device)
    return (idx.unsqueeze(-1) * block + offs).flatten(1)


class SlidingWindowCore(Core):
    """Sliding window: query i sees keys j with |i − j| ≤ window (causal: 0 ≤ i − j ≤ window).

    Blocked: the sequence is cut into blocks of ``b = min(window, T)``; a query block gathers its
    own and neighbouring key blocks (3 bidirectional, 2 causal) and a band mask inside them keeps
    exactly the window. Equal to dense attention with the band mask; exact when window ≥ T − 1.
    """

    def __init__(self, window: int, impl: AttnImpl = "sdpa") -> None:
        super().__init__()
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.window, self.kernel = window, core_fn(impl)

    def _blocks(self, t: int, causal: bool) -> tuple[int, int, tuple[int, ...]]:
        block = min(self.window, t)
        nb = -(-t // block)
        offsets = (0,) if nb == 1 else (-1, 0) if causal else (-1, 0, 1)
        return block, nb, offsets

    def band_mask(self, t: int, causal: bool = False, device: torch.device | None = None) -> Tensor:
        """The dense (T, T) reference mask the blocked computation equals."""
        i = torch.arange(t, device=device)
        dist = i[:, None] - i[None, :]
        return (dist >= 0) & (dist <= self.window) if causal else dist.abs() <= self.window

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        t = q.shape[2]
        if bias is not None or offset or k.shape[2] != t:
            _refuse(self, bias=bias is not None, cache=offset != 0, cross=k.shape[2] != t)
        block, nb, offsets = self._blocks(t, causal)
        dev = q.device
        idx = torch.arange(nb, device=dev)[:, None] + torch.tensor(offsets, device=dev)   # (nb, K)
        kpos = _key_positions(idx, block)                                # (nb, K·blk), may be <0 or ≥T
        qpos = torch.arange(nb * block, device=dev).view(nb, block, 1)   # (nb, blk, 1)
        dist = qpos - kpos.unsqueeze(1)                                  # (nb, blk, K·blk)
        keep = (dist >= 0) & (dist <= self.window) if causal else dist.abs() <= self.window
        keep = keep & ((kpos >= 0) & (kpos < t)).unsqueeze(1)
        idx = torch.where((idx >= 0) & (idx < nb), idx, nb)              # out of range -> zero block
        qp = F.pad(q, (0, 0, 0, nb * block - t))                         # (B, H, nb·blk, hd)
        return gathered_attention(qp, k, v, idx, keep, block, self.kernel, dropout_p, scale)[:, :, :t]

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        block, nb, offsets = self._blocks(t, causal)
        return 2 * batch * heads.n_heads * nb * block * len(offsets) * block * heads.head_dim

    def extra_repr(self) -> str:
        return f"window={self.window}"

    def decode_window(self) -> int | None:
        """One decoded token sees its ``window`` predecessors and itself: a ring of window + 1 slots."""
        return self.window


@functools.lru_cache(maxsize=256)
def bigbird_pattern(nb: int, n_global: int, n_random: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Key blocks of each non-global query block g..nb−1 (g = min(n_global, nb)).

    Row i lists, without repeats: the global blocks 0..g−1, the window i−1, i, i+1, then up to
    ``n_random`` other blocks drawn with a seeded RNG; padded with ``nb`` (no block) to a fixed
    width of g + 3 + n_random. Deterministic in (nb, n_global, n_random, seed).
    """
    g = min(n_global, nb)
    width = g + 3 + n_random
    rng = random.Random(f"bigbird:{seed}:{nb}")
    rows = []
    for i in range(g, nb):
        fixed = [*range(g), *(j for j in (i - 1, i, i + 1) if g <= j < nb)]
        taken = set(fixed)
        free = nb - len(taken)
        if free <= n_random:
            extra = [j for j in range(g, nb) if j not in taken]
        else:
            extra = []
            while len(extra) < n_random:
                j = rng.randrange(g, nb)
                if j not in taken:
                    taken.add(j)
                    extra.append(j)
        row = fixed + extra
        rows.append(tuple(row + [nb] * (width - len(row))))
    return tuple(rows)


class BigBirdCore(Core):
    """BigBird-style block-sparse, bidirectional: blocks of ``block`` tokens; the first ``n_global``
    blocks are global (they see every key and every query sees them); every other query block sees
    its window blocks (i−1, i, i+1) and ``n_random`` random blocks (seeded, fixed per length).

    Global rows: exact attention over all T keys (g·block·T scores); the rest through
    :func:`gathered_attention` over (g + 3 + n_random)·block keys each — O(n) in all.
    """

    def __init__(self, block: int, n_global: int = 1, n_random: int = 2, seed: int = 0,
                 impl: AttnImpl = "sdpa") -> None:
        super().__init__()
        if block <= 0 or n_global < 0 or n_random < 0:
            raise ValueError(f"need block > 0, n_global >= 0, n_random >= 0; got {block}, {n_global}, {n_random}")
        self.block, self.n_global, self.n_random, self.seed = block, n_global, n_random, seed
        self.kernel = core_fn(impl)

    def block_mask(self, t: int) -> Tensor:
        """(nb, nb) bool: query block i may see key block j."""
        nb = -(-t // self.block)
        g = min(self.n_global, nb)
        allowed = torch.zeros(nb, nb + 1, dtype=torch.bool)
        allowed[:g] = True
        rows = bigbird_pattern(nb, self.n_global, self.n_random, self.seed)
        if rows:
            allowed[torch.arange(g, nb)[:, None], torch.tensor(rows)] = True
        return allowed[:, :nb]

    def dense_mask(self, t: int) -> Tensor:
        """The dense (T, T) reference mask of the same pattern."""
        m = self.block_mask(t)
        return m.repeat_interleave(self.block, 0).repeat_interleave(self.block, 1)[:t, :t]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        t, blk, dev = q.shape[2], self.block, q.device
        if bias is not None or causal or offset or k.shape[2] != t:
            _refuse(self, bias=bias is not None, causal=causal, cache=offset != 0, cross=k.shape[2] != t)
        nb = -(-t // blk)
        g = min(self.n_global, nb)
        g_rows = min(g * blk, t)
        parts = []
        if g_rows:
            parts.append(self.kernel(q[:, :, :g_rows], k, v, None, None, dropout_p, scale))   # (B, H, g·blk, hd)
        if g < nb:
            idx = torch.tensor(bigbird_pattern(nb, self.n_global, self.n_random, self.seed), device=dev)
            kpos = _key_positions(idx, blk)                              # (nb−g, K·blk)
            keep = (kpos < t).unsqueeze(1).expand(-1, blk, -1)             # padding blocks/tokens off
            qs = F.pad(q[:, :, g_rows:], (0, 0, 0, (nb - g) * blk - (t - g_rows)))   # (B, H, (nb−g)·blk, hd)
            parts.append(gathered_attention(qs, k, v, idx, keep, blk, self.kernel, dropout_p, scale)[:, :, :t - g_rows])
        return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]   # (B, H, T, hd)

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        nb = -(-t // self.block)
        g = min(self.n_global, nb)
        rows_global = min(g * self.block, t)
        width = g + 3 + self.n_random
        sparse = (nb - g) * self.block * width * self.block
        return 2 * batch * heads.n_heads * heads.head_dim * (rows_global * t + sparse)

    def extra_repr(self) -> str:
        return f"block={self.block}, n_global={self.n_global}, n_random={self.n_random}, seed={self.seed}"


class LongformerCore(Core):
    """Longformer (Beltagy, Peters & Cohan 2020), bidirectional: a (dilated) sliding window plus symmetric
    global tokens — not BigBird's blocks.

    Query i sees key j when |i − j| ≤ ``window``·``dilation`` and ``dilation`` divides i − j: ``window``
    keys on each side, every ``dilation``-th position (the project's window convention, that of
    :class:`SlidingWindowCore`: ±window, 2·window + 1 keys; the paper's window size w is 2·window). A
    *global* token — the first ``n_global_tokens`` positions (a CLS-like prefix) and any of
    ``global_positions`` (those ≥ T are ignored) — sees every key, and every query sees it.

    One softmax per query over local ∪ global keys, each key once: the local part masks the global keys
    out of the window, which sit once in front of every block's keys. The local part is blocked like
    :class:`SlidingWindowCore`, within each residue class mod ``dilation`` (positions r, r+d, r+2d, …,
    where a dilated window is a plain one), through :func:`gathered_attention` with the G global keys
    shared: (G + 3·block) scores per query. The G global rows are exact attention over all T keys, and
    replace theirs. O(n·(window + G)) time and memory, never an n×n score matrix.
    """

    def __init__(self, window: int, n_global_tokens: int = 1, dilation: int = 1,
                 global_positions: tuple[int, ...] = (), impl: AttnImpl = "sdpa") -> None:
        super().__init__()
        if window <= 0 or dilation <= 0 or n_global_tokens < 0:
            raise ValueError(f"need window > 0, dilation > 0, n_global_tokens >= 0; "
                             f"got {window}, {dilation}, {n_global_tokens}")
        if any(p < 0 for p in global_positions):
            raise ValueError(f"global_positions must be >= 0, got {global_positions}")
        self.window, self.n_global_tokens, self.dilation = window, n_global_tokens, dilation
        self.global_positions = tuple(sorted(set(global_positions)))
        self.kernel = core_fn(impl)

    def globals_at(self, t: int) -> list[int]:
        """The global token positions of a length-t sequence, ascending."""
        return sorted(set(range(min(self.n_global_tokens, t))) | {p for p in self.global_positions if p < t})

    def _layout(self, t: int) -> tuple[int, int, int, tuple[int, ...]]:
        """(dilation d, block, blocks per residue class nb, neighbour offsets) of a length-t sequence.

        A dilation ≥ t leaves each query only itself locally, as d = t does: d = min(dilation, t)."""
        d = max(min(self.dilation, t), 1)
        per_class = -(-t // d)                                           # ⌈t/d⌉ positions per residue class
        block = min(self.window, per_class)
        nb = -(-per_class // block)
        return d, block, nb, (0,) if nb == 1 else (-1, 0, 1)

    def dense_mask(self, t: int, device: torch.device | None = None) -> Tensor:
        """The dense (T, T) reference mask the blocked computation equals: window ∪ global rows ∪ global columns."""
        i = torch.arange(t, device=device)
        dist = i[:, None] - i[None, :]
        local = (dist.abs() <= self.window * self.dilation) & (dist % self.dilation == 0)
        glob = torch.zeros(t, dtype=torch.bool, device=device)
        glob[self.globals_at(t)] = True
        return local | glob[:, None] | glob[None, :]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        b, h, t, hd = q.shape
        if bias is not None or causal or offset or k.shape[2] != t:
            _refuse(self, bias=bias is not None, causal=causal, cache=offset != 0, cross=k.shape[2] != t)
        d, block, nb, offsets = self._layout(t)
        m, dev = nb * block, q.device                                    # m: padded length of a residue class
        glob = torch.tensor(self.globals_at(t), dtype=torch.long, device=dev)   # (G,)
        is_global = torch.zeros(m * d, dtype=torch.bool, device=dev)
        is_global[glob] = True

        def residues(x: Tensor) -> Tensor:                               # (B, h', T, hd) -> (B·d, h', m, hd)
            x = F.pad(x, (0, 0, 0, m * d - t))                           # position p = i·d + r at [i, r]
            return x.view(b, x.shape[1], m, d, hd).permute(0, 3, 1, 2, 4).reshape(b * d, x.shape[1], m, hd)

        idx = torch.arange(nb, device=dev)[:, None] + torch.tensor(offsets, device=dev)   # (nb, K)
        kpos = _key_positions(idx, block)                                # (nb, K·blk) in-class, may be <0 or ≥m
        qpos = torch.arange(m, device=dev).view(nb, block, 1)            # (nb, blk, 1)
        r = torch.arange(d, device=dev).view(d, 1, 1, 1)
        q_at, k_at = qpos * d + r, kpos.unsqueeze(1) * d + r             # (d, nb, blk, 1), (d, nb, 1, K·blk)
        local = (qpos - kpos.unsqueeze(1)).abs() <= self.window          # (nb, blk, K·blk)
        local = local & (kpos >= 0).unsqueeze(1) & (k_at < t) & ~is_global[k_at.clamp(0, m * d - 1)]
        local = local | (q_at >= t)                                      # padding queries: any key (dropped)
        keep = torch.cat([local.new_ones(d, nb, block, len(glob)), local.expand(d, nb, block, -1)], dim=-1)
        keep = keep.expand(b, d, nb, block, keep.shape[-1]).reshape(b * d, nb, block, keep.shape[-1])
        idx = torch.where((idx >= 0) & (idx < nb), idx, nb)              # out of range -> zero block
        shared = None
        if len(glob):
            shared = tuple(x[:, :, glob].unsqueeze(1).expand(b, d, x.shape[1], len(glob), hd)
                           .reshape(b * d, x.shape[1], len(glob), hd) for x in (k, v))   # 2 × (B·d, Hkv, G, hd)
        y = gathered_attention(residues(q), residues(k), residues(v), idx, keep, block, self.kernel, dropout_p,
                               scale, shared=shared)                     # (B·d, H, m, hd)
        y = y.view(b, d, h, m, hd).permute(0, 2, 3, 1, 4).reshape(b, h, m * d, hd)[:, :, :t]   # (B, H, T, hd)
        if len(glob):
            rows = self.kernel(q[:, :, glob], k, v, None, None, dropout_p, scale)   # (B, H, G, hd): every key
            y = y.index_copy(2, glob, rows)
        return y

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        d, block, nb, offsets = self._layout(t)
        g = len(self.globals_at(t))
        local = d * nb * block * (g + len(offsets) * block)              # padded queries × (global + gathered) keys
        return 2 * batch * heads.n_heads * heads.head_dim * (local + g * t)

    def extra_repr(self) -> str:
        extra = f", global_positions={self.global_positions}" if self.global_positions else ""
        return f"window={self.window}, n_global_tokens={self.n_global_tokens}, dilation={self.dilation}{extra}"


class LinformerCore(Core):
    """Linformer, bidirectional: keys and values projected along the sequence, n → ``proj_len``, by
    learned E, F of shape (proj_len, max_seq_len) (shared across heads); softmax attention over the
    projected keys through the shared kernel. A length T < max_seq_len uses E[:, :T]."""

    def __init__(self, max_seq_len: int, proj_len: int, impl: AttnImpl = "sdpa") -> None:
        super().__init__()
        if proj_len <= 0 or max_seq_len <= 0:
            raise ValueError(f"proj_len and max_seq_len must be positive, got {proj_len}, {max_seq_len}")
        self.max_seq_len, self.proj_len, self.kernel = max_seq_len, proj_len, core_fn(impl)
        self.E = nn.Parameter(torch.randn(proj_len, max_seq_len) / math.sqrt(proj_len))
        self.F = nn.Parameter(torch.randn(proj_len, max_seq_len) / math.sqrt(proj_len))

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        s = k.shape[2]
        if bias is not None or causal or offset:
            _refuse(self, bias=bias is not None, causal=causal, cache=offset != 0)
        if s > self.max_seq_len:
            raise ValueError(f"Linformer projects at most max_seq_len={self.max_seq_len} tokens; got {s}")
        k = torch.einsum("kn,bhnd->bhkd", self.E[:, :s], k)                # (B, Hkv, k, hd)
        v = torch.einsum("kn,bhnd->bhkd", self.F[:, :s], v)                # (B, Hkv, k, hd)
        return self.kernel(q, k, v, None, None, dropout_p, scale)         # (B, H, T, hd)

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        s = t if s is None else s
        projections = 2 * batch * heads.n_kv_heads * self.proj_len * s * heads.head_dim
        return projections + 2 * batch * heads.n_heads * t * self.proj_len * heads.head_dim

    def extra_repr(self) -> str:
        return f"max_seq_len={self.max_seq_len}, proj_len={self.proj_len}"


def orthogonal_gaussian(m: int, d: int, seed: int = 0) -> Tensor:
    """(m, d) rows: stacked d×d random orthogonal blocks, each row rescaled to a χ_d-distributed
    norm (so rows are marginally N(0, I) yet exactly orthogonal within a block)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    blocks = []
    for _ in range(-(-m // d)):
        qmat, _ = torch.linalg.qr(torch.randn(d, d, generator=g, device="cpu"))
        blocks.append(qmat.T)
    w = torch.cat(blocks)[:m]                                            # (m, d), unit rows
    return w * torch.randn(m, d, generator=g, device="cpu").norm(dim=1, keepdim=True)


class PerformerCore(Core):
    """Performer (FAVOR+), bidirectional: exp(scale·q·k) ≈ φ(q)·φ(k) with positive orthogonal random
    features φ(x) = exp(ωᵀx̂ − ‖x̂‖²/2)/√m, x̂ = x·√scale (scale 1/√hd: x̂ = x / hd^¼), so attention
    costs O(n·m·hd): out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1). The ``n_features`` × ``head_dim`` matrix ω is
    a fixed buffer drawn from ``seed``. The stabilisers (a per-query and a per-head max) cancel in
    the ratio."""

    def __init__(self, head_dim: int, n_features: int, seed: int = 0, eps: float = 1e-6) -> None:
        super().__init__()
        if n_features <= 0 or head_dim <= 0:
            raise ValueError(f"head_dim and n_features must be positive, got {head_dim}, {n_features}")
        self.head_dim, self.n_features, self.eps = head_dim, n_features, eps
        omega = orthogonal_gaussian(n_features, head_dim, seed)
        self.register_buffer("omega", omega.to(torch.get_default_device()))   # (m, hd); meta under fake builds

    def validate(self, heads: Heads) -> None:
        if heads.head_dim != self.head_dim:
            raise ValueError(f"PerformerCore drew features for head_dim {self.head_dim}, "
                             f"the attention has head_dim {heads.head_dim}")

    def features(self, x: Tensor, is_query: bool, scale: float | None = None) -> Tensor:
        """φ(x): (…, T, hd) -> (…, T, m)."""
        x = x * (self.head_dim ** -0.25 if scale is None else math.sqrt(scale))
        proj = x @ self.omega.T                                          # (…, T, m)
        half_sq = (x * x).sum(-1, keepdim=True) / 2                      # (…, T, 1)
        stab = proj.amax(-1, keepdim=True) if is_query else proj.amax((-2, -1), keepdim=True)
        return (torch.exp(proj - half_sq - stab.detach()) + self.eps) / math.sqrt(self.n_features)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                offset: int = 0, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
        if bias is not None or causal or offset or dropout_p:
            _refuse(self, bias=bias is not None, causal=causal, cache=offset != 0, dropout=dropout_p > 0)
        b, h, t, hd = q.shape
        hkv, m = k.shape[1], self.n_features
        qf = self.features(q, True, scale).view(b, hkv, h // hkv, t, m)   # (B, Hkv, G, T, m)
        kf = self.features(k, False, scale)                              # (B, Hkv, S, m)
        kv = kf.transpose(-2, -1) @ v                                    # (B, Hkv, m, hd)
        k_sum = kf.sum(dim=-2)                                           # (B, Hkv, m)
        num = qf @ kv.unsqueeze(2)                                       # (B, Hkv, G, T, hd)
        den = qf @ k_sum[:, :, None, :, None]                            # (B, Hkv, G, T, 1)
        return (num / den).view(b, h, t, hd)                             # (B, H, T, hd)

    def macs(self, heads: Heads, batch: int, t: int, s: int | None = None, causal: bool = False) -> int:
        s = t if s is None else s
        m, hd, h, hkv = self.n_features, heads.head_dim, heads.n_heads, heads.n_kv_heads
        feats = batch * (h * t + hkv * s) * hd * m                       # ωᵀx for queries and keys
        return feats + batch * hkv * m * s * hd + batch * h * t * m * (hd + 1)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, n_features={self.n_features}"
