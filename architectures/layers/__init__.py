"""Shared building blocks: the one attention, positions, norms, MLPs, residual wrappers."""
