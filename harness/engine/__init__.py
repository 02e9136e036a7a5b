"""The engine: a Run, its cases' steps, models built and compiled, A/B workers."""
