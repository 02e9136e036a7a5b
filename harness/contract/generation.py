"""The generation protocol a model class implements to be timed by ``mode = "generate"``
(harness.engine.generation): ``generation_state(batch, max_len)`` once, ``prefill(tokens, state)`` with the
prompt, then ``decode(token, state)`` once per new token. Typed here (torch-free: tensors are ``Any``) for
plug-ins; :data:`harness.contract.spec.GENERATION_PROTOCOL` names the same three methods."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GenerationState(Protocol):
    """What a model's generation state (a static KV cache, a recurrent state) tells the harness."""

    def nbytes(self) -> int:
        """The bytes the state holds (``kv_cache_bytes``)."""
        ...

    def step_bytes(self, context: int) -> int:
        """The bytes one decode step must at least read and write after ``context`` positions."""
        ...


@runtime_checkable
class GenerativeModel(Protocol):
    """A model that can generate: a state made once per call, a prefill of the prompt, one decode per token."""

    def generation_state(self, batch: int, max_len: int) -> GenerationState:
        """A fresh state for ``batch`` sequences of at most ``max_len`` positions, on the model's device."""
        ...

    def prefill(self, tokens: Any, state: Any) -> Any:
        """Empty ``state`` and run the prompt (B, T) into it -> the logits of its last position (B, vocab)."""
        ...

    def decode(self, token: Any, state: Any) -> Any:
        """One token (B, 1) after those in ``state`` (written into it) -> its logits (B, vocab)."""
        ...
