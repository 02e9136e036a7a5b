"""The ``bench`` command group. Each command's module is imported when that command runs, not at start: the
modules pull in torch, scipy, pandas, matplotlib and the reports, so ``bench run`` need not import what only
``bench check`` or ``bench claims`` uses (and a bad-input exit comes sooner). ``bench --help`` imports them all."""
from __future__ import annotations

import importlib

import click

from cli.common import BenchGroup

COMMANDS: dict[str, str] = {
    "list": "cli.runs:list_cmd",
    "run": "cli.runs:run_cmd",
    "runs": "cli.runs:runs_cmd",
    "show": "cli.runs:show_cmd",
    "export": "cli.runs:export_cmd",
    "compare": "cli.runs:compare_cmd",
    "merge": "cli.runs:merge_cmd",
    "baseline": "cli.check:baseline_cmd",
    "check": "cli.check:check_cmd",
    "report": "cli.report:report",
    "claims": "cli.claims:claims",
    "flops": "cli.flops:flops",
}
"""Command name → ``module:attribute`` of its click command (tests/test_cli.py checks each name matches)."""


class LazyBenchGroup(BenchGroup):
    """:class:`cli.common.BenchGroup` whose commands (:data:`COMMANDS`) are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyBenchGroup)
@click.version_option(package_name="bench")
def main() -> None:
    """Benchmark and compare Transformers and their rivals; test the textbook trade-offs."""
    from harness.executors.process import skip_main_in_workers

    skip_main_in_workers()      # a worker need not import the command line (harness.executors.process)
