"""The ``bench`` command group. Each command's module is imported when that command runs, not at start: the
modules pull in torch, scipy, pandas, matplotlib and the reports, so ``bench run`` need not import what only
``bench check`` or ``bench claims`` uses (and a bad-input exit comes sooner). ``bench --help`` imports none of them:
it lists each command with its line from :data:`SHORT_HELP`."""
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

SHORT_HELP: dict[str, str] = {
    "list": "List registered architectures (wildcards allowed) or built-in suites.",
    "run": "Run SUITE (a path or a built-in suite name), storing every case as it finishes; then print what the run "
           "shows (fitted exponents and ratios) and write its HTML report.",
    "runs": "Stored runs, newest first.",
    "show": "One stored run as a table (RUN: an id, an id prefix, or `latest`).",
    "export": "Export one run: JSON (one object per case), CSV (the same, flattened), Parquet (the CSV's table), tidy "
              "CSV (one row per case × metric) or pytest-benchmark's JSON (for `pytest-benchmark compare` and "
              "github-action-benchmark's `tool: pytest`).",
    "compare": "Compare RUN_B against RUN_A case by case: ratio of medians B/A, its 95% interval (over processes "
               "where both were measured in several), verdict (same only when the whole interval lies within 5%).",
    "merge": "Add the runs and cases of other stores (e.g. the local file a run kept while its store was down) to "
             "this store: runs matched by id and cases by key, so merging twice adds nothing.",
    "baseline": "Measure SUITE and write a baseline: every case's deterministic metrics (MACs, params, analytic and "
                "tensor-peak bytes), RSS, timings with their raw samples in rounds (per occasion, each process's "
                "median), and the environment fingerprint.",
    "check": "Measure SUITE again and give each case a verdict against a baseline: deterministic metrics must be "
             "equal; a timing is unchanged only when its whole 95 % interval lies within 5 %, regressed or improved "
             "when shown beyond it, else inconclusive with the smallest slowdown it could see (MDE).",
    "report": "One self-contained HTML report of one or more runs (RUN: an id, an id prefix, or `latest`).",
    "claims": "Test the documents' claims (C01–C42): a verdict for each, with the figures that decided it, the device "
              "that measured them and their provenance.",
    "flops": "MACs of ARCH on one input by three counters side by side: ours (harness.instruments.flops), torch's "
             "stock FlopCounterMode and fvcore's FlopCountAnalysis; totals, or per module with --by-module.",
}
"""Command name → the first sentence of its help, which ``bench --help`` shortens as click would (tests/test_cli.py
checks it gives each command's own short help): listing the commands imports none of them (~4 CPU-s: torch,
scipy.stats, matplotlib, sqlalchemy)."""


class LazyBenchGroup(BenchGroup):
    """:class:`cli.common.BenchGroup` whose commands (:data:`COMMANDS`) are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing of the commands, with a command not imported yet described by :data:`SHORT_HELP`."""
        listed = [(name, self.commands.get(name) or click.Command(name, help=SHORT_HELP[name]))
                  for name in self.list_commands(ctx)]
        listed = [(name, cmd) for name, cmd in listed if not cmd.hidden]
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in listed])


@click.group(cls=LazyBenchGroup)
@click.version_option(package_name="bench")
def main() -> None:
    """Benchmark and compare Transformers and their rivals; test the textbook trade-offs."""
    from harness.executors.process import skip_main_in_workers

    skip_main_in_workers()      # a worker need not import the command line (harness.executors.process)
