"""A dtype name of :data:`harness.contract.spec.DTYPES` as a torch dtype (the instruments and the engine read it)."""
from __future__ import annotations

import torch

from harness.contract.spec import DTYPES, Workload

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
assert set(TORCH_DTYPES) == set(DTYPES), "harness.contract.spec.DTYPES and TORCH_DTYPES must name the same types"


def torch_dtype(w: Workload | str) -> torch.dtype:
    """The torch dtype of a workload (or of a dtype name)."""
    return TORCH_DTYPES[w if isinstance(w, str) else w.dtype]
