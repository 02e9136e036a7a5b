"""Deprecated path ``harness.spec``, kept so that plug-ins written against it still import: it re-exports
:mod:`harness.contract.spec` and warns. Import from :mod:`harness.api`, the plug-in API, which does not move."""
from __future__ import annotations

import warnings

from harness.contract.spec import *  # noqa: F403 — the old module's public names, unchanged

warnings.warn("harness.spec is deprecated: import from harness.api (register, ArchSpec, Workload, ...)",
              DeprecationWarning, stacklevel=2)
