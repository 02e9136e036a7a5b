"""The commits of this repository as a history and a bisection see them: a ref resolved with its subject line,
the commits between two refs, and the git order of the commits that stored runs were measured at."""
from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.contract.errors import BenchInputError

REPO = Path(__file__).resolve().parents[2]
"""This checkout (as :data:`harness.engine.env.REPO`; this module imports no torch, so ``bench history`` needs none)."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


def resolve(ref: str, repo: Path = REPO, where: str = "--good") -> Commit:
    """The commit ``ref`` names in ``repo``; an unknown ref raises :class:`BenchInputError`."""
    if _git(repo, "rev-parse", "--git-dir").returncode != 0:
        raise BenchInputError(f"{repo} is not a git checkout: bisect needs one", where=where)
    got = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if got.returncode != 0:
        raise BenchInputError(f"no commit {ref!r} in {repo}", where=where)
    sha = got.stdout.strip()
    return Commit(sha, _git(repo, "log", "-1", "--format=%s", sha).stdout.strip())


def commits_between(good: Commit, bad: Commit, repo: Path = REPO) -> list[Commit]:
    """The commits after ``good`` up to ``bad`` (included), oldest first, along the first-parent line that joins
    them. ``good`` must be an ancestor of ``bad`` (else :class:`BenchInputError`)."""
    if good.sha == bad.sha:
        raise BenchInputError(f"{good.short} is --bad too: nothing between them", where="--good")
    if _git(repo, "merge-base", "--is-ancestor", good.sha, bad.sha).returncode != 0:
        raise BenchInputError(f"{good.short} is not an ancestor of --bad {bad.short}", where="--good")
    got = _git(repo, "log", "--first-parent", "--ancestry-path", "--reverse", "--format=%H%x00%s",
               f"{good.sha}..{bad.sha}")
    out = [Commit(*line.split("\0", 1)) for line in got.stdout.splitlines() if "\0" in line]
    if not out or out[-1].sha != bad.sha:
        raise BenchInputError(f"no first-parent line from {good.short} to {bad.short}", where="--good")
    return out


def git_order(shas: Iterable[str], repo: Path = REPO, since: str | None = None) -> dict[str, tuple[int, str]]:
    """Commit → (its place in git's topological order, oldest first; its subject line) for the commits of
    ``shas`` that ``repo`` has; with ``since`` (a ref) only that commit and its descendants. Commits the
    repository lacks are left out (the caller says so)."""
    known = [s for s in dict.fromkeys(shas) if s and _git(repo, "cat-file", "-e", f"{s}^{{commit}}").returncode == 0]
    if not known:
        return {}
    args = ["rev-list", "--topo-order", "--reverse", "--format=%H%x00%s", *known]
    if since is not None:
        base = resolve(since, repo, where="--since")
        known = [s for s in known if _git(repo, "merge-base", "--is-ancestor", base.sha, s).returncode == 0]
        if not known:
            return {}
        args = [*args[:4], *known, "--not", *_git(repo, "rev-parse", f"{base.sha}^@").stdout.split()]
    lines = [ln for ln in _git(repo, *args).stdout.splitlines() if "\0" in ln]
    wanted, out = set(known), {}
    for i, ln in enumerate(lines):
        sha, subject = ln.split("\0", 1)
        if sha in wanted:
            out[sha] = (i, subject)
    return out
