"""How many fresh processes measure a case: the plain-data defaults the command line shows (no torch here)."""
from __future__ import annotations

PRECISION = 1.10
"""With ``--max-processes``, processes are added to a group of cases until its 95 % interval over processes is
within ×/÷ this (harness.engine.replicate.imprecise), or the maximum is reached."""

CLAIMS_MAX_FACTOR = 3
"""``bench claims --processes N`` adds processes up to ``N ×`` this where a timed group is still imprecise."""
