"""What every ``bench`` command shares: the consoles, the error policy (one line, exit 2 for bad input,
1 for anything unexpected), common options, plug-in loading and the log handler."""
from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.logging import RichHandler

from harness.contract.errors import BenchInputError
from harness.contract.replication import PRECISION
from harness.contract.secrets import hide_passwords, hide_passwords_in
from harness.instruments.load import ROOT_PID_ENV
from harness.contract.plugins import load_files as load_plugin_files

# Pipes and CI logs get a wide, fixed width so tables never fold; a terminal uses its own width.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


DEBUG_KEY = "bench.debug"
"""Where ``--debug`` is kept: the root context's ``meta`` (:func:`debugging` reads it)."""


def _remember_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_root().meta[DEBUG_KEY] = True


def debug_param() -> click.Option:
    """``--debug``, accepted by the group and by every command (before or after the command's name)."""
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True, callback=_remember_debug,
                         help="Show tracebacks: of an unexpected error, and in a failed case's message.")


def debugging() -> bool:
    """Whether this command line asked for ``--debug`` (at the group or at the command)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().meta.get(DEBUG_KEY))


def say_error(message: str) -> None:
    """One line on stderr, with every password hidden (harness.contract.secrets)."""
    click.echo(hide_passwords(message), err=True)


class BenchGroup(click.Group):
    """Every error is one line on stderr (passwords hidden): exit 2 for bad input, 1 for anything unexpected, with
    the traceback under ``--debug``, which the group and every command accept."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.params.append(debug_param())

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(p.name == "debug" for p in cmd.params):
            cmd.params.append(debug_param())
        super().add_command(cmd, name)

    def main(self, args: list[str] | None = None, **kw: Any) -> Any:  # type: ignore[override]
        given = list(args if args is not None else sys.argv[1:])
        debug = "--debug" in (given[:given.index("--")] if "--" in given else given)
        os.environ.setdefault(ROOT_PID_ENV, str(os.getpid()))   # workers measure load from outside this tree
        try:
            return super().main(args=args, standalone_mode=False, **kw)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            err.print("bench: aborted")
            sys.exit(130)
        except click.UsageError as exc:
            where = f" ({exc.ctx.command_path})" if exc.ctx else ""
            say_error(f"bench: error{where}: {exc.format_message()}")
            sys.exit(2)
        except BenchInputError as exc:
            say_error(f"bench: error: {exc}")
            sys.exit(2)
        except Exception as exc:  # noqa: BLE001
            if debug:
                say_error(traceback.format_exc().rstrip())
            say_error(f"bench: internal error: {type(exc).__name__}: {exc}"
                      + ("" if debug else " (rerun with --debug)"))
            sys.exit(1)


store_option = click.option("--store", "store_url", default=None, metavar="URL",
                            help="SQLAlchemy URL of the results store (default: sqlite:///results/bench.sqlite).")
plugin_option = click.option("--plugin", "plugins", multiple=True, metavar="FILE.py",
                             help="A Python file that registers architectures (repeatable).")


def processes_option(default: int, what: str) -> Any:
    """``--processes N``: fresh worker processes per case (harness.engine.replicate); ``what`` says why this default
    (which applies with the ``process`` executor; any other measures in one process unless told otherwise)."""
    return click.option("--processes", type=click.IntRange(min=1), default=None, metavar="N",
                        help=f"Measure each case in N fresh worker processes; intervals and tests over processes "
                             f"(default {default} with the process executor: {what}; else 1).")


def check_processes(processes: int | None, executor: str, default: int = 1) -> int:
    """The processes per case: ``default`` when not given (1 with an executor other than ``process``); more than
    one needs the ``process`` executor (fresh spawned workers)."""
    if processes is None:
        return default if executor == "process" else 1
    if processes > 1 and executor != "process":
        raise BenchInputError(f"--processes {processes} needs the process executor, not {executor}",
                              where="--processes")
    return processes


def max_processes_option(default: str) -> Any:
    """``--max-processes M``: more fresh processes for a group of cases whose interval over processes is still wide
    (harness.engine.replicate.imprecise); ``default`` says what happens when it is not given."""
    return click.option("--max-processes", type=click.IntRange(min=1), default=None, metavar="M",
                        help="Add fresh worker processes (up to M per case) to the cases whose 95% interval over "
                             f"processes is wider than ×/÷{PRECISION:g} (a side-by-side group: its ratios); {default}.")


def check_max_processes(max_processes: int | None, processes: int, default: int) -> int:
    """The most processes a case may get: ``default`` when not given; never fewer than ``processes``, and more
    than one process needs ``--processes`` of two or more (the spread is measured over the first ones)."""
    if max_processes is None:
        return max(default, processes)
    if max_processes < processes:
        raise BenchInputError(f"--max-processes {max_processes} is below --processes {processes}",
                              where="--max-processes")
    if max_processes > processes and processes < 2:
        raise BenchInputError("--max-processes needs --processes 2 or more: the spread between processes is "
                              "measured over those", where="--max-processes")
    return max_processes


def invocation(**resolved: Any) -> dict[str, Any]:
    """How this command was called, as data to store with the run it makes: ``command`` (``bench run``),
    ``arguments`` (by metavar: ``SUITE``), ``options`` (by flag, ``--processes``: every option as parsed, defaults
    included) and ``resolved`` (what the command chose from them: the executor, the processes per case);
    passwords hidden (harness.contract.secrets)."""
    ctx = click.get_current_context()
    arguments, options = {}, {}
    for param in ctx.command.params:
        if param.name is None or param.name not in ctx.params or not param.expose_value:
            continue
        if isinstance(param, click.Argument):
            arguments[param.human_readable_name] = _plain(ctx.params[param.name])
        else:
            options[max(param.opts, key=len)] = _plain(ctx.params[param.name])
    return hide_passwords_in({"command": f"bench {ctx.info_name}", "arguments": arguments, "options": options,
                              "debug": debugging(),
                              **({"resolved": {k: _plain(v) for k, v in resolved.items()}} if resolved else {})})


def _plain(value: Any) -> Any:
    """A parameter's value as JSON data (tuples as lists; anything else not JSON as its text)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def load_plugins(plugins: tuple[str, ...]) -> tuple[str, ...]:
    """Import the --plugin files here; returns their absolute paths for the worker processes."""
    load_plugin_files(plugins)
    return tuple(str(Path(p).resolve()) for p in plugins)


class HidePasswords(logging.Filter):
    """A log record's text with every password hidden (harness.contract.secrets), whatever logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = hide_passwords(record.getMessage()), None
        return True


def show_logs() -> None:
    """Route the library's ``bench`` logger (progress notes, warnings) to stderr, once, passwords hidden."""
    logger = logging.getLogger("bench")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=err, show_time=False, show_path=False, show_level=False, markup=False,
                              rich_tracebacks=False)
        handler.addFilter(HidePasswords())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
