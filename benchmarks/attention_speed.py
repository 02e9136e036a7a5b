"""Our layers vs PyTorch's: an encoder layer vs ``nn.TransformerEncoderLayer`` and our ``Attention`` vs
``nn.MultiheadAttention``, forward (eval + no_grad) and forward + backward (train, dropout 0).

    .venv/bin/python benchmarks/attention_speed.py [--seq 128 512] [--batch 8] [--rounds 4] [--quick]

Both sides get the same weights (checked equal before timing), the same input and pinned CPU
threads. Rounds interleave the contenders (A, B, A, B, …) so that drift on a shared machine hits
both; each round times every contender with ``harness.timing.measure``. The ratio reported is
the median over rounds of ours / theirs (each side's median in that round), with its range, the
ratio of the medians of all samples pooled, and the ratio of the minima (the least disturbed calls).

In eval + no_grad, PyTorch takes a fused "fast path" (``torch._transformer_encoder_layer_fwd``,
``torch._native_multi_head_attention``): that is what users get by default and what "theirs"
measures; "theirs, no fast path" (``torch.backends.mha.set_fastpath_enabled(False)``) is the
module's ordinary path, which uses ``F.scaled_dot_product_attention`` as ours does.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from architectures.layers.attention import Attention  # noqa: E402
from architectures.transformer import EncoderConfig, make_block  # noqa: E402
from harness.stats import summarize  # noqa: E402
from harness.timing import TimingConfig, measure  # noqa: E402


def encoder_layers(d: int, h: int, d_ff: int, activation: str, norm_first: bool) -> tuple[nn.Module, nn.Module]:
    theirs = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, activation=activation, batch_first=True,
                                        norm_first=norm_first)
    cfg = EncoderConfig(d_model=d, n_heads=h, d_ff=d_ff, activation=activation, dropout=0.0,
                        norm_placement="pre" if norm_first else "post")
    ours = make_block(cfg)
    with torch.no_grad():
        ours.attn.qkv.weight.copy_(theirs.self_attn.in_proj_weight)
        ours.attn.qkv.bias.copy_(theirs.self_attn.in_proj_bias)
        ours.attn.out.load_state_dict(theirs.self_attn.out_proj.state_dict())
        ours.mlp.up.load_state_dict(theirs.linear1.state_dict())
        ours.mlp.down.load_state_dict(theirs.linear2.state_dict())
        ours.res_attn.norm.load_state_dict(theirs.norm1.state_dict())
        ours.res_mlp.norm.load_state_dict(theirs.norm2.state_dict())
    return ours, theirs


def attentions(d: int, h: int) -> tuple[nn.Module, nn.Module]:
    theirs = nn.MultiheadAttention(d, h, batch_first=True)
    ours = Attention(d, h)
    with torch.no_grad():
        ours.qkv.weight.copy_(theirs.in_proj_weight)
        ours.qkv.bias.copy_(theirs.in_proj_bias)
        ours.out.load_state_dict(theirs.out_proj.state_dict())
    return ours, _SelfAttention(theirs)


class _SelfAttention(nn.Module):
    """nn.MultiheadAttention called as self-attention, output only (what a model does)."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


def step(model: nn.Module, x: torch.Tensor, mode: str, fastpath: bool = True) -> Callable[[], None]:
    if mode == "fwd":
        model.eval()

        def run() -> None:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            try:
                with torch.no_grad():
                    model(x)
            finally:
                torch.backends.mha.set_fastpath_enabled(True)
        return run
    model.train()

    def run_bwd() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
    return run_bwd


def compare(title: str, ours: nn.Module, theirs: nn.Module, x: torch.Tensor, rounds: int,
            timing: TimingConfig) -> list[tuple[str, float, float, float]]:
    ours.eval(), theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)   # same function first
    rows = []
    for mode in ("fwd", "fwd_bwd"):
        contenders = {"ours": step(ours, x, mode), "theirs": step(theirs, x, mode)}
        if mode == "fwd":
            contenders["theirs, no fast path"] = step(theirs, x, mode, fastpath=False)
        samples: dict[str, list[float]] = {k: [] for k in contenders}
        medians: dict[str, list[float]] = {k: [] for k in contenders}
        for r in range(rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                got = measure(contenders[name], timing).samples_s
                samples[name] += got
                medians[name].append(statistics.median(got))
        ms = {k: summarize(v)["median_ms"] for k, v in samples.items()}
        best = {k: min(v) * 1e3 for k, v in samples.items()}
        for name in contenders:
            if name == "ours":
                continue
            per_round = sorted(a / b for a, b in zip(medians["ours"], medians[name]))
            ratio = statistics.median(per_round)
            rows.append((f"{title} {mode} vs {name}", ms["ours"], ms[name], ratio))
            print(f"{title:22s} {mode:7s} ours {ms['ours']:8.2f} ms | {name:21s} {ms[name]:8.2f} ms | "
                  f"ratio {ratio:5.3f} (rounds {per_round[0]:.3f}-{per_round[-1]:.3f}; "
                  f"pooled medians {ms['ours'] / ms[name]:.3f}, minima {best['ours'] / best[name]:.3f})", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    p.add_argument("--activation", default="relu", choices=["relu", "gelu"])
    p.add_argument("--norm-first", action="store_true", help="pre-norm (default: post-norm, PyTorch's default)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=["layer", "attention"], default=None)
    p.add_argument("--quick", action="store_true", help="TimingConfig.quick() instead of the defaults")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    timing = TimingConfig.quick() if args.quick else TimingConfig()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d={args.d} h={args.heads} "
          f"d_ff={args.d_ff} batch={args.batch} {args.activation} {'pre' if args.norm_first else 'post'}-norm",
          flush=True)
    rows = []
    for seq in args.seq:
        x = torch.randn(args.batch, seq, args.d)
        if args.only in (None, "layer"):
            ours, theirs = encoder_layers(args.d, args.heads, args.d_ff, args.activation, args.norm_first)
            rows += compare(f"encoder layer T={seq}", ours, theirs, x, args.rounds, timing)
        if args.only in (None, "attention"):
            ours, theirs = attentions(args.d, args.heads)
            rows += compare(f"attention T={seq}", ours, theirs, x, args.rounds, timing)
    worst = max(r[3] for r in rows if "no fast path" not in r[0])
    print(f"worst ratio ours/theirs (PyTorch's defaults): {worst:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
