"""The code, suites, claims data and scripts speak of the project as it is: no issue numbers, no "round N", no paths
that leave the repository (``../shared``) and no links out of it (a paper or data set is cited as plain text).
History belongs in CHANGELOG.md; module and test file names say what they hold, not when they were written."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("cli", "claims", "architectures", "reports", "harness", "suites", "scripts", "examples")
HISTORY = re.compile(r"[Ii]ssue \d+|\b[Rr]ound \d+|\.\./shared|https?://")
NAMED_BY_WHEN = re.compile(r"(round|issue)_?\d", re.IGNORECASE)


def _files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".gz", ".png"))


def test_library_code_and_data_carry_no_history_and_no_outside_links() -> None:
    found = []
    for path in _files(FOLDERS):
        rel = path.relative_to(ROOT).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{rel}:{n}: {m.group(0)}" for n, line in enumerate(text.splitlines(), 1)
                  for m in HISTORY.finditer(line)]
    assert not found, "\n".join(found)


def test_modules_and_tests_are_named_by_topic() -> None:
    named = [p.relative_to(ROOT).as_posix() for p in _files((*FOLDERS, "tests"))
             if NAMED_BY_WHEN.search(p.stem)]
    assert named == []


def test_the_patterns_catch_what_they_are_for() -> None:
    """The check can fail: each kind of history is found, and a near miss ("around 0") is not."""
    for text in ("as in issue 25", "Round 3: new claims", "see ../shared/GPU.md", "https://example.org"):
        assert HISTORY.search(text), text
    assert not HISTORY.search("values standardised around 0") and not HISTORY.search("rounds 3 to 5")
    assert NAMED_BY_WHEN.search("test_claims_round3_c02") and not NAMED_BY_WHEN.search("test_rounding")
