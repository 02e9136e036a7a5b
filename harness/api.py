"""The plug-in API: everything an architecture outside this repository needs, at one path that stays put when
the harness's inside moves. A plug-in imports from here only::

    from harness.api import ArchSpec, Workload, register

    register(ArchSpec(name="my-net", family="mine", description="...", config=MyConfig(), build=build,
                      make_inputs=make_inputs))

- :func:`register` (one :class:`ArchSpec` per preset), :func:`register_namespace` (``ns:NAME`` resolved on
  demand), :func:`get`, :func:`resolve` and :func:`list_archs` to read the registry back;
- :class:`ArchSpec` (a preset: config, ``build(config) -> nn.Module``, ``make_inputs(config, workload, device)``)
  and :class:`Workload` (what a case runs: batch, sequence or image size, dtype, device, mode);
- the generation protocol (``mode = "generate"``): :class:`GenerativeModel` and :class:`GenerationState`, whose
  method names are :data:`GENERATION_PROTOCOL`;
- :class:`BenchInputError` (bad input: one line, exit 2) and :class:`Quoted` (a published figure, labelled).

The older paths ``harness.registry`` and ``harness.spec`` still import, with a DeprecationWarning."""
from __future__ import annotations

from harness.contract.errors import BenchInputError
from harness.contract.generation import GenerationState, GenerativeModel
from harness.contract.quoted import Quoted
from harness.contract.registry import get, list_archs, register, register_namespace, resolve
from harness.contract.spec import GENERATION_PROTOCOL, ArchSpec, Workload

__all__ = ["GENERATION_PROTOCOL", "ArchSpec", "BenchInputError", "GenerationState", "GenerativeModel", "Quoted",
           "Workload", "get", "list_archs", "register", "register_namespace", "resolve"]
