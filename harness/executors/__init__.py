"""Where cases run: in this process (``inline``), in a reused, spawned worker (``process``), in one such worker per
device of this machine (``devices=cuda:0,cuda:1``) or as Ray tasks (``ray``, ``ray=ADDRESS``; an optional extra,
imported only when asked for)."""
from __future__ import annotations

from harness.executors.base import Executor
from harness.executors.devices import DevicesExecutor, parse_devices
from harness.executors.inline import InlineExecutor
from harness.executors.process import ProcessExecutor

EXECUTORS: dict[str, type[Executor]] = {"process": ProcessExecutor, "inline": InlineExecutor}
"""The executors that take no argument (``bench run --executor``'s other choice, ``ray``, is made by name)."""


def make_executor(name: str) -> Executor:
    """The executor ``name``: ``process``, ``inline``, ``devices=DEV,DEV,...`` or ``ray`` / ``ray=ADDRESS``."""
    kind, _, arg = name.partition("=")
    if kind == "devices":
        return DevicesExecutor(parse_devices(arg))
    if kind == "ray":
        from harness.executors.ray_executor import RayExecutor   # ray is optional: imported only here
        return RayExecutor(address=arg or None)
    return EXECUTORS[name]()
