"""Small-scale accuracy experiments (CPU, minutes): each module has ``DATA`` and ``run(quick, seeds)``."""
