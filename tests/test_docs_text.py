"""What the docs tests read from the README and the docs' pages: the fenced blocks, the `bench` commands they show,
the README's tables (no torch here)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EVIDENCE = DOCS / "evidence"
SHELL_LANGS = ("console", "sh", "bash", "shell", "yaml")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int              # 1-based line of the opening fence
    lang: str
    text: str
    parsed_only: str = ""  # the reason, where a `<!-- parsed only: REASON -->` line stands right above the fence


@dataclass(frozen=True)
class Command:
    path: Path
    line: int
    args: tuple[str, ...]  # after `bench`
    parsed_only: str = ""  # its block's reason to parse the command only (it needs files or a repository the page
                           # makes step by step); the options are still checked against the command

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}:bench {' '.join(self.args)}"


def user_pages() -> list[Path]:
    """The README and the docs' hand-written pages (the evidence records are dated history, not user pages)."""
    pages = sorted(p for p in DOCS.rglob("*.md") if EVIDENCE not in p.parents)
    return [README, *pages]


def blocks(path: Path) -> list[Block]:
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)", lines[i])
        if m:
            start, lang, body = i, m.group(2), []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            above = lines[start - 1].strip() if start else ""
            marker = re.match(r"^<!-- parsed only: (.+) -->$", above)
            out.append(Block(path, start + 1, lang, "\n".join(body), marker.group(1) if marker else ""))
        i += 1
    return out


def _command_lines(b: Block) -> list[tuple[int, str]]:
    """(line, shell text) of each command a shell block shows: `$ ` lines of a console block, every line of a
    sh block, the `run:` steps of a workflow."""
    out = []
    for k, raw in enumerate(b.text.splitlines()):
        line = raw.strip()
        if b.lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        elif b.lang == "yaml":
            m = re.match(r"^-?\s*run:\s*(.*)$", line)
            if not m:
                continue
            line = m.group(1)
        out.append((b.line + 1 + k, line))
    return out


def commands(paths: list[Path] | None = None) -> list[Command]:
    """Every `bench …` command shown in a shell block of ``paths`` (default: the user pages)."""
    found = []
    for path in paths or user_pages():
        for b in blocks(path):
            if b.lang not in SHELL_LANGS:
                continue
            for line, text in _command_lines(b):
                text = text.replace("${{ github.base_ref }}", "main")
                for part in re.split(r"&&|\|\||;", text):
                    if not part.strip().startswith(("bench ", ".venv/bin/bench ")):
                        continue                                    # not ours: python -c "…; …", prose in brackets
                    words = shlex.split(part.split(" | ")[0], comments=True)    # `bench … | head -1`: the command
                    if words and words[0] in ("bench", ".venv/bin/bench"):
                        found.append(Command(path, line, tuple(words[1:]), b.parsed_only))
    return found


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``| header |`` (cells stripped)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.replace(" ", "").startswith(f"|{header}|"):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]])
            return rows
    raise AssertionError(f"no table with the header {header!r}")


def registered_names(source: str) -> list[str]:
    """The architecture names a plug-in's source registers (``ArchSpec("NAME", ...)``)."""
    return re.findall(r'ArchSpec\(\s*"([^"]+)"', source)


def snippet(text: str, first_line: str) -> str:
    """The body of the fenced block whose first line is ``first_line``."""
    m = re.search(r"```\w*\n" + re.escape(first_line) + r"\n(.*?)```", text, re.S)
    assert m, f"no fenced block starting {first_line!r}"
    return first_line + "\n" + m.group(1)


# -- the extraction itself -----------------------------------------------------------------------------------
def test_commands_are_taken_from_shell_blocks_only(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```console", "$ bench run ci --quick   # a comment", "output: bench run not-a-command", "```",
        "```", "bench run in-an-output-block", "```",
        "```sh", ".venv/bin/bench runs && .venv/bin/bench export latest --format json", "make run", "```",
        "```yaml", "      - run: .venv/bin/bench check ci --against origin/${{ github.base_ref }}", "```"]))
    assert [c.args for c in commands([page])] == [
        ("run", "ci", "--quick"), ("runs",), ("export", "latest", "--format", "json"),
        ("check", "ci", "--against", "origin/main")]
    assert [c.line for c in commands([page])] == [2, 9, 9, 13]


def test_table_rows_and_snippets():
    text = "| suite | question |\n|---|---|\n| `a` | x \\| y |\n\n```python\n# f.py\nx = 1\n```\n"
    assert table_rows(text, "suite") == [["`a`", "x \\| y"]]
    assert snippet(text, "# f.py") == "# f.py\nx = 1\n"
