"""The ``bench`` command group: every command module adds itself here."""
from __future__ import annotations

import click

from cli import check as check_cmd
from cli import claims as claims_cmd
from cli import flops as flops_cmd
from cli import report as report_cmd
from cli import runs as runs_cmd
from cli.common import BenchGroup
from harness.executors.process import skip_main_in_workers


@click.group(cls=BenchGroup)
@click.version_option(package_name="bench")
def main() -> None:
    """Benchmark and compare Transformers and their rivals; test the textbook trade-offs."""
    skip_main_in_workers()      # a worker need not import the command line (harness.executors.process)


for command in (*runs_cmd.COMMANDS, *check_cmd.COMMANDS, report_cmd.report, claims_cmd.claims, flops_cmd.flops):
    main.add_command(command)
