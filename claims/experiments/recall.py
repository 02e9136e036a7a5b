"""C41: multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), attention vs S4D vs Mamba.

A sequence is ``n_pairs`` key-value pairs (distinct keys), then every key again in a random order, each
followed by its value: ``k₁ v₁ … k_P v_P  q₁ a₁ … q_P a_P`` with a_i the value paired with q_i earlier. The
loss and accuracy are at the query positions only (predict a_i from the position of q_i), so each answer
must be retrieved from up to 4·P tokens back by content — what attention does by comparing the query with
every stored key, and what a recurrent model can do only if its fixed-size state has kept all P pairs.

Every variant has the same width and depth (the attention side is ``decoder-tiny`` at those sizes) and is
trained on fresh batches from the same seeded stream for the same steps, cycling through the numbers of
pairs (one model per variant and seed, as Zoology trains on a mix); accuracy is measured per number of pairs
on a fixed held-out set of its own seed. Seeded and deterministic on the CPU.

**State vs what must be stored (QUICK).** At the largest number of pairs (P = 8, 32 tokens, d_model 64) the
decoder's KV cache holds 2·T·d = 4096 numbers per layer; Mamba's state E·N = 128·16 = 2048 (1/2 of it) and
S4D's D·N = 64·64 = 4096 (1×); the pairs themselves, as embeddings, are 2·P·d = 1024 numbers (Mamba's state is
2×, S4D's 4× that). So the state is not starved by arithmetic: a gap measures what the recurrence learns to
keep, not a state too small to hold the pairs. FULL (P = 32, d 128): cache 32768, Mamba 4096 (1/8), S4D
8192 (1/4): there the state is smaller than what attention keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claims.experiments.lm_train import build_lm
from claims.experiments.runner import Experiment, Fields, Seeds, sweep
from claims.experiments.train import CPU, adamw, fit, lr_at
from harness.engine.models import materialize
from harness.instruments.flops import count_params
from harness.contract.registry import resolve
from harness.contract.spec import Workload

HELD_OUT_SEED = 777_777
ATTENTION = "attention"
SSMS = {"s4d": "s4d-lm-tiny", "mamba": "mamba-lm-tiny"}          # variant name -> registered preset

DATA = ("Multi-query associative recall (Zoology, Arora et al. 2023), generated in code: P key-value pairs "
        "(16 keys, 16 values, keys distinct), then all P keys again in random order each followed by its value; "
        "accuracy of the value predicted at the P query positions (chance 1/16). QUICK: attention against Mamba (S4D in "
        "FULL only), d_model 64, 2 layers "
        "(attention: a decoder-tiny with 4 heads and RoPE), one model per variant and seed trained on P = 4, 8 "
        "in turn (sequences of 16, 32 tokens), 2000 steps × 32 fresh sequences at a constant 1e-3 after "
        "warm-up, 256 held-out sequences per P; FULL: 32 keys, P up to 32, d_model 128, 3000 steps. Orders of magnitude smaller "
        "than Zoology's models: the figures show the direction and the trend with P, not their size at scale.")


@dataclass(frozen=True)
class Task:
    """MQAR with ``n_pairs`` pairs: keys are ids [0, n_keys), values [n_keys, n_keys + n_values)."""

    n_pairs: int = 8
    n_keys: int = 64
    n_values: int = 64

    def __post_init__(self) -> None:
        if self.n_pairs <= 0 or self.n_values <= 0:
            raise ValueError(f"n_pairs and n_values must be positive, got {self.n_pairs}, {self.n_values}")
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs ({self.n_pairs}) exceeds the {self.n_keys} distinct keys")

    @property
    def vocab(self) -> int:
        return self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        return 4 * self.n_pairs

    @property
    def query_positions(self) -> Tensor:
        """(P,) the positions of the queries q₁ … q_P (each followed by its answer)."""
        return 2 * self.n_pairs + 2 * torch.arange(self.n_pairs)


def make_batch(task: Task, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Tokens (B, 4P) and the answers (B, P) at :attr:`Task.query_positions`, drawn with ``g``."""
    p = task.n_pairs
    keys = torch.argsort(torch.rand(batch, task.n_keys, generator=g), dim=1)[:, :p]       # (B, P) distinct
    values = torch.randint(task.n_keys, task.vocab, (batch, p), generator=g)              # (B, P)
    order = torch.argsort(torch.rand(batch, p, generator=g), dim=1)                       # (B, P) query order
    queries, answers = keys.gather(1, order), values.gather(1, order)                     # (B, P) each
    pairs = torch.stack([keys, values], dim=2).flatten(1)                                 # (B, 2P)
    asked = torch.stack([queries, answers], dim=2).flatten(1)                             # (B, 2P)
    return torch.cat([pairs, asked], dim=1), answers


def held_out(task: Task, n: int) -> tuple[Tensor, Tensor]:
    """The fixed held-out set of ``n`` sequences (its own seed)."""
    return make_batch(task, n, torch.Generator().manual_seed(HELD_OUT_SEED + task.n_pairs))


def recall_loss(model: nn.Module, tokens: Tensor, answers: Tensor, task: Task) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy of the answers at the query positions, accuracy there)."""
    logits = model(tokens)[:, task.query_positions].float()                              # (B, P, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answers.reshape(-1))
    return loss, (logits.argmax(-1) == answers).float().mean()


@torch.no_grad()
def evaluate(model: nn.Module, data: tuple[Tensor, Tensor], task: Task, batch: int = 128) -> dict[str, float]:
    """Held-out loss and accuracy at the query positions (eval mode)."""
    model.eval()
    tokens, answers = data
    losses, accs = [], []
    for i in range(0, tokens.shape[0], batch):
        loss, acc = recall_loss(model, tokens[i:i + batch], answers[i:i + batch], task)
        losses.append(float(loss) * tokens[i:i + batch].shape[0])
        accs.append(float(acc) * tokens[i:i + batch].shape[0])
    return {"loss": sum(losses) / tokens.shape[0], "acc": sum(accs) / tokens.shape[0]}


@dataclass(frozen=True)
class Setup:
    pairs: tuple[int, ...] = (4, 8)            # evaluated per number of pairs (the trend); trained on all of them
    n_keys: int = 16
    n_values: int = 16
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4                           # attention only
    positions: str = "rope"                    # attention only
    steps: int = 2000                          # attention is still on its plateau at 1500 steps (P = 4, 8, seed 0)
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 50
    lr_floor: float = 1.0                      # constant after the warm-up: recall is learnt late (a plateau)
    weight_decay: float = 0.0
    clip: float = 1.0
    eval_n: int = 256
    ssms: tuple[str, ...] = tuple(SSMS)

    def __post_init__(self) -> None:
        if not self.pairs or any(p <= 0 or p > self.n_keys for p in self.pairs):
            raise ValueError(f"pairs must be in [1, n_keys={self.n_keys}], got {self.pairs}")
        unknown = set(self.ssms) - set(SSMS)
        if unknown:
            raise ValueError(f"unknown SSM variant(s) {sorted(unknown)}; known: {', '.join(SSMS)}")
        if self.steps <= 0 or self.batch <= 0 or self.eval_n <= 0:
            raise ValueError("steps, batch and eval_n must be positive")


# QUICK compares attention with Mamba only: S4D (the time-invariant SSM, a third of the trials' time) is in FULL.
QUICK = Setup(ssms=("mamba",))
FULL = Setup(pairs=(4, 8, 16, 32), n_keys=32, n_values=32, d_model=128, steps=3000, eval_n=512)


@dataclass(frozen=True)
class Build:
    """``build(seed)``: variant ``variant``'s model at the setup's width and depth over ``vocab`` (picklable, so a
    worker process can build it)."""

    s: Setup
    variant: str
    vocab: int
    max_len: int

    def __call__(self, seed: int) -> nn.Module:
        s = self.s
        if self.variant == ATTENTION:
            return build_lm(seed, vocab_size=self.vocab, d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads,
                            d_ff=4 * s.d_model, max_seq_len=max(64, self.max_len), positions=s.positions)
        spec = resolve(SSMS[self.variant], vocab_size=self.vocab, d_model=s.d_model, n_layers=s.n_layers)
        return materialize(spec, Workload(), CPU, seed=seed)


def builders(s: Setup, vocab: int, max_len: int) -> dict[str, Build]:
    """Per variant, ``seed -> model`` at the setup's width and depth over ``vocab``."""
    return {name: Build(s, name, vocab, max_len) for name in (ATTENTION, *s.ssms)}


def train_one(model: nn.Module, tasks: list[Task], s: Setup, seed: int) -> Fields:
    """AdamW (β = 0.9, 0.98) on fresh batches of seed ``seed``'s stream, the tasks taken in turn (step i trains on
    ``tasks[i % len(tasks)]``), warm-up then ``lr_floor``·lr; per task (number of pairs) the held-out figures."""
    g = torch.Generator().manual_seed(20_000 + seed)

    def loss_at(step: int) -> Tensor:
        task = tasks[step % len(tasks)]
        return recall_loss(model, *make_batch(task, s.batch, g), task)[0]

    losses = fit(model, adamw(model, s.lr, s.weight_decay, betas=(0.9, 0.98)), s.steps,
                 lambda step: lr_at(step, s.steps, s.lr, s.warmup, s.lr_floor), loss_at, clip=s.clip)
    tail = losses[-max(1, len(losses) // 10):]
    return {"train_loss": sum(tail) / len(tail),
            "by_pairs": {str(t.n_pairs): evaluate(model, held_out(t, s.eval_n), t) for t in tasks}}


def trial(build: Build, seed: int, tasks: list[Task], s: Setup) -> Fields:
    """One (variant, seed) of the sweep: its model built and trained (module-level: a worker process runs it)."""
    return train_one(build(seed), tasks, s, seed)


def measure(s: Setup, seeds: Seeds) -> tuple[Fields, Fields]:
    tasks = [Task(p, s.n_keys, s.n_values) for p in s.pairs]
    builds = builders(s, tasks[0].vocab, max(t.seq_len for t in tasks))
    trained = sweep(builds, seeds, partial(trial, tasks=tasks, s=s))
    variants = {name: {"params": count_params(build(0)), **trained[name]} for name, build in builds.items()}
    att = trained[ATTENTION]["by_pairs"]
    gap = {name: {p: [a - b for a, b in zip(att[p]["acc"], trained[name]["by_pairs"][p]["acc"])] for p in att}
           for name in s.ssms}
    task = {"pairs": list(s.pairs), "seq_len": {str(t.n_pairs): t.seq_len for t in tasks}, "vocab": tasks[0].vocab,
            "n_keys": s.n_keys, "n_values": s.n_values, "chance_acc": 1 / s.n_values}
    scale = {"params": {name: v["params"] for name, v in variants.items()}, "steps": s.steps,
             "sequences_trained": s.steps * s.batch, "models_trained": len(seeds) * len(builds)}
    return {"task": task, "variants": variants, "acc_gap_vs_attention": gap}, scale


EXPERIMENT = Experiment("C41", QUICK, FULL, measure, parallel=True)
run = EXPERIMENT.run
