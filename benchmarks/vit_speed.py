"""Forward latency of our ``vit-b16`` against torchvision's ``vit_b_16``, batch 1, on CPU.

Same weights (loaded through :func:`architectures.vit.from_torchvision`), eval + no_grad, threads
pinned, A/B rounds interleaved (the order alternates each round) so that drift on a shared
machine hits both alike. Prints each round's medians and the ratio of the pooled medians
(ours / torchvision; target <= 1.10)::

    .venv/bin/python benchmarks/vit_speed.py [--rounds 4] [--threads 2] [--impl sdpa] [--profile]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from architectures.vit import ViT, from_torchvision  # noqa: E402
from harness import registry  # noqa: E402
from harness.stats import summarize  # noqa: E402
from harness.timing import TimingConfig, measure  # noqa: E402


def build_pair(impl: str) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    theirs = torchvision.models.vit_b_16(weights=None).eval()
    ours = ViT(registry.resolve("vit-b16", attn_impl=impl).config).eval()
    ours.load_state_dict(from_torchvision(theirs.state_dict()))
    return {"ours": ours, "torchvision": theirs}


def profile(models: dict[str, torch.nn.Module], x: torch.Tensor, rows: int = 12) -> None:
    """Where each model's forward spends its time (self CPU time per aten op)."""
    from torch.profiler import ProfilerActivity, profile as run_profiler
    for name, model in models.items():
        with torch.no_grad():
            for _ in range(2):
                model(x)
            with run_profiler(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    model(x)
        print(f"\n== {name} (5 forwards) ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--impl", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--profile", action="store_true", help="also print a per-op profile of both")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    models = build_pair(args.impl)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (models["ours"](x) - models["torchvision"](x)).abs().max().item()
    print(f"threads={torch.get_num_threads()} impl={args.impl} max |Δlogits|={diff:.2e}")

    samples: dict[str, list[float]] = {name: [] for name in models}
    medians: dict[str, float] = {}
    round_ratios: list[float] = []
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        line = []
        for name in order:
            model = models[name]

            def forward(model: torch.nn.Module = model) -> None:
                with torch.no_grad():
                    model(x)
            result = measure(forward, TimingConfig())
            samples[name].extend(result.samples_s)
            medians[name] = summarize(result.samples_s)["median_ms"]
            line.append(f"{name} {medians[name]:.1f} ms")
        round_ratios.append(medians["ours"] / medians["torchvision"])
        print(f"round {r + 1}: " + ", ".join(line))

    stats = {name: summarize(s) for name, s in samples.items()}
    for name, s in stats.items():
        print(f"{name:12s} median {s['median_ms']:.2f} ms  IQR/median {s['rel_iqr']:.3f}  "
              f"95% CI [{s['ci_low_ms']:.2f}, {s['ci_high_ms']:.2f}]  n={int(s['n_samples'])}")
    ratio = stats["ours"]["median_ms"] / stats["torchvision"]["median_ms"]
    print(f"ratio of medians ours/torchvision = {ratio:.3f} ({'within' if ratio <= 1.10 else 'OVER'} the 1.10 target)")
    # On a shared machine contention only adds time: the fastest samples are the least disturbed.
    print(f"ratio of minima  ours/torchvision = {stats['ours']['min_ms'] / stats['torchvision']['min_ms']:.3f}"
          f"  (rounds' median ratios: {', '.join(f'{r:.2f}' for r in round_ratios)})")
    if args.profile:
        profile(models, x)


if __name__ == "__main__":
    main()
