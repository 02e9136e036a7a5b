"""A real text corpus present on every machine: the Python standard library's own source.

The corpus is the top-level ``*.py`` files of ``sysconfig.get_paths()["stdlib"]`` in sorted order,
read until ``max_bytes`` (default 3 MB), as byte-level tokens: ASCII bytes are their own ids
(vocab 128); the rare non-ASCII byte becomes 0x7F (DEL, otherwise unused in source).
The split is by file: every ``val_every``-th file (sorted order) is validation, the rest training,
so no validation window overlaps a training file. Deterministic for one Python installation
(:meth:`Corpus.info` records the version and a hash). Loading takes well under a second.

Batches are random windows of length T+1 (inputs are the first T, targets the last T) drawn with
a ``torch.Generator``. :func:`recall_task` is a synthetic associative-recall task, generated in code.
"""
from __future__ import annotations

import functools
import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

VOCAB = 128
DEFAULT_MAX_BYTES = 3_000_000
VAL_EVERY = 10


@dataclass(frozen=True)
class Corpus:
    train: Tensor          # (N_train,) int64 token ids
    val: Tensor            # (N_val,) int64 token ids
    files_train: int
    files_val: int
    sha256: str            # of the raw bytes read, in order
    python: str
    root: str

    def info(self) -> dict:
        return {"source": "CPython standard library *.py (top level, sorted)", "root": self.root,
                "python": self.python, "vocab": VOCAB, "tokens_train": int(self.train.numel()),
                "tokens_val": int(self.val.numel()), "files_train": self.files_train,
                "files_val": self.files_val, "sha256": self.sha256[:16]}


def stdlib_files() -> list[Path]:
    """The top-level .py files of the standard library, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"), key=lambda p: p.name)


def encode(raw: bytes) -> Tensor:
    """Bytes -> token ids in [0, 128): non-ASCII bytes map to 127."""
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
    return t.clamp_(max=VOCAB - 1)


@functools.lru_cache(maxsize=4)
def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES, val_every: int = VAL_EVERY) -> Corpus:
    """Read files in sorted order until ``max_bytes``; every ``val_every``-th file is validation."""
    files = stdlib_files()
    if not files:
        raise RuntimeError(f"no .py files under {sysconfig.get_paths()['stdlib']}")
    train, val, total = [], [], 0
    digest = hashlib.sha256()
    for i, path in enumerate(files):
        if total >= max_bytes:
            break
        raw = path.read_bytes()[: max_bytes - total] + b"\n"
        total += len(raw)
        digest.update(raw)
        (val if i % val_every == val_every - 1 else train).append(raw)
    if not val or not train:
        raise RuntimeError(f"max_bytes={max_bytes} too small for a train/validation split")
    return Corpus(encode(b"".join(train)), encode(b"".join(val)), len(train), len(val),
                  digest.hexdigest(), sys.version.split()[0], str(files[0].parent))


def sample_windows(data: Tensor, batch: int, length: int, g: torch.Generator) -> Tensor:
    """``batch`` random windows of ``length`` consecutive tokens: (batch, length)."""
    if data.numel() < length + 1:
        raise ValueError(f"corpus of {data.numel()} tokens is shorter than a window of {length}")
    starts = torch.randint(0, data.numel() - length + 1, (batch,), generator=g)
    return data[starts[:, None] + torch.arange(length)]


def sample_batch(data: Tensor, batch: int, seq_len: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs (B, T) and next-token targets (B, T) from random windows of T+1 tokens."""
    w = sample_windows(data, batch, seq_len + 1, g)
    return w[:, :-1], w[:, 1:]


def recall_task(batch: int, n_pairs: int, vocab: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Associative recall: ``k1 v1 k2 v2 … kn vn q`` -> the value paired with key ``q``.

    Keys are distinct ids in [0, vocab/2), values in [vocab/2, vocab). Returns tokens (B, 2n+1)
    and the answer (B,)."""
    half = vocab // 2
    if n_pairs > half:
        raise ValueError(f"n_pairs ({n_pairs}) exceeds the {half} distinct keys")
    keys = torch.argsort(torch.rand(batch, half, generator=g), dim=1)[:, :n_pairs]
    values = torch.randint(half, vocab, (batch, n_pairs), generator=g)
    pairs = torch.stack([keys, values], dim=2).flatten(1)                 # (B, 2n)
    pick = torch.randint(0, n_pairs, (batch, 1), generator=g)
    query = keys.gather(1, pick)
    return torch.cat([pairs, query], dim=1), values.gather(1, pick).squeeze(1)
