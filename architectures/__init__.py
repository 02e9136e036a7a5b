"""Built-in architectures. Importing this package imports every module in it, and each module
registers its own presets (``harness.api.register``) — a new family is a new file here."""
from __future__ import annotations

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.ispkg:
        importlib.import_module(f"{__name__}.{_info.name}")
