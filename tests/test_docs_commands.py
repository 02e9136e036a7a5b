"""Every `bench` command the README and the docs' pages show is run, so a renamed option, suite, architecture or
claim fails here: `bench run` with `--dry-run` (the suite loaded, validated and expanded, nothing measured), `--help`
and `bench list` as shown, and every other command parsed by its own click command (an unknown option or a missing
argument fails) with the suite, architecture or claims it names looked up."""
from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cli.app import main
from harness.contract import registry
from harness.contract.plugins import load_files
from harness.contract.suite import find_suite
from tests.test_docs_text import README, ROOT, Command, blocks, commands, registered_names, snippet, user_pages
from tests.helpers import invoke

COMMANDS = commands()
WRITTEN_BY_THE_README = ("my_models.py", "my_suite.toml")
"""Files the README's own-model recipe writes before its command runs."""
NEEDS_A_MACHINE = {"--address": "a Ray cluster", "--devices": "the devices named"}
"""Options whose `bench run` would reach a machine this one may not have: parsed and its suite loaded, not run."""


@pytest.fixture(scope="module")
def readme_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("readme")
    text = README.read_text()
    for name in WRITTEN_BY_THE_README:
        (d / name).write_text(snippet(text, f"# {name}"))
    yield d
    for arch in registered_names((d / "my_models.py").read_text()):   # another module may load the snippet again
        registry._ARCHS.pop(arch, None)


def _localise(args: tuple[str, ...], readme_dir: Path) -> list[str]:
    return [str(readme_dir / a) if a in WRITTEN_BY_THE_README else a for a in args]


def _parse(args: list[str]) -> click.Context:
    """``args`` parsed by the command they name, as the shell would hand them to `bench` (no callbacks run)."""
    with click.Context(main, info_name="bench") as top:
        cmd = main.get_command(top, args[0])
        assert cmd is not None, f"no command {args[0]!r}"
        return cmd.make_context(args[0], args[1:], parent=top)


def _look_up(ctx: click.Context) -> None:
    """The suite, architecture and claims a command names exist."""
    p = ctx.params
    for plugin in p.get("plugins") or ():
        load_files((plugin,))
    if p.get("suite_ref"):
        find_suite(p["suite_ref"])
    if ctx.info_name == "flops":
        registry.resolve(p["arch"])
    if ctx.info_name == "claims" and p.get("only"):
        ids = set(tomllib.loads((ROOT / "claims" / "claims.toml").read_text()))
        assert set(p["only"].split(",")) <= ids, p["only"]


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 30
    assert {c.args[0] for c in COMMANDS if c.args} >= {"run", "list", "show", "report", "export", "baseline", "check",
                                                         "claims", "flops", "runs"}


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_documented_command_runs(cmd: Command, readme_files: Path):
    args = _localise(cmd.args, readme_files)
    if "--help" in args or args[0] == "list":
        result = invoke(*args)
        assert result.exit_code == 0, result.output + result.stderr
        return
    ctx = _parse(args)                      # an unknown option or a missing argument raises here
    if cmd.parsed_only:                     # the page makes its files or repository step by step: options checked
        return
    _look_up(ctx)
    if args[0] == "run" and not any(o in args for o in NEEDS_A_MACHINE):
        result = invoke(*args, *([] if "--dry-run" in args else ["--dry-run"]))
        assert result.exit_code == 0, result.output + result.stderr
        assert "nothing measured or written" in result.output


def test_a_renamed_option_fails():
    with pytest.raises(click.NoSuchOption):
        _parse(["check", "ci", "--quick", "--baselines", "x.json"])
    with pytest.raises(click.UsageError):
        _parse(["export", "latest", "--format", "json", "--no-such-flag"])


SUITE_EXAMPLES = [b for page in user_pages() for b in blocks(page)
                  if b.lang == "toml" and re.search(r"^name = ", b.text, re.M) and "--plugin" not in b.text
                  and not b.text.startswith("# my_suite.toml")]


@pytest.mark.parametrize("block", SUITE_EXAMPLES, ids=lambda b: f"{b.path.relative_to(ROOT)}:{b.line}")
def test_documented_suite_files_load(block, tmp_path: Path):
    """A whole suite file shown on a page is a valid suite: loaded, validated and expanded (--dry-run)."""
    path = tmp_path / "example.toml"
    path.write_text(block.text)
    for args in ((), ("--quick",)):
        result = invoke("run", str(path), "--dry-run", *args)
        assert result.exit_code == 0, result.output + result.stderr
