"""The ``bench`` command line (click + rich): parses, calls the library, renders. It is the one package
that joins the others (harness, architectures through the registry, claims, reports); nothing imports it."""
from __future__ import annotations

from cli.app import main

__all__ = ["main"]
