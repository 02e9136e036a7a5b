"""The one error type for bad input: the CLI prints it as one line and exits 2."""
from __future__ import annotations


class BenchInputError(ValueError):
    """Bad user input (suite file, option, architecture config, store URL)."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
