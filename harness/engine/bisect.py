"""Which commit made a case slower: the commits between a good and a bad ref, searched by halves.

Each probed commit is measured side by side with the good ref, as ``bench check --against`` measures REF and this
checkout: two git worktrees (:func:`harness.engine.ab.worktree`), their workers alternating round by round
(:func:`harness.engine.ab.interleave_versions`). Whether a probe is bad is judged by the caller (the CLI, with the
gate's verdict), so this module knows git and the search, not the statistics.

The search first probes the bad ref itself (if it is not slower than the good one, the range holds no regression),
then halves the commits in between: about ``log2(commits) + 1`` probes. A probe that cannot tell ends the search
"inconclusive", with the range narrowed so far, rather than guessing a side.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.contract.records import CaseRecord
from harness.contract.spec import Case
from harness.engine.ab import PROCESSES, interleave_versions, worktree
from harness.engine.commits import Commit
from harness.engine.env import REPO
from harness.engine.runner import RunOptions

Side = Literal["bad", "good", "inconclusive"]


@dataclass(frozen=True)
class Probe:
    """One probed commit: which side it is on and why (the verdict's text: ratio, interval, what was judged)."""

    commit: Commit
    side: Side
    detail: str = ""
    why: str = ""                       # inconclusive: why the probe could not tell


@dataclass(frozen=True)
class Bisection:
    """The outcome: ``found`` (``first_bad``), ``none`` (the bad ref is not worse than the good one) or
    ``inconclusive`` (``why``; the first bad commit lies after ``last_good`` and at or before ``first_bad``)."""

    outcome: Literal["found", "none", "inconclusive"]
    steps: tuple[Probe, ...]
    good: Commit
    bad: Commit
    first_bad: Commit | None = None
    last_good: Commit | None = None
    why: str = ""


def bisect(good: Commit, commits: Sequence[Commit], probe: Callable[[Commit], Probe],
           on_step: Callable[[Probe], None] | None = None) -> Bisection:
    """Search ``commits`` (oldest first, the last one the bad ref; ``good`` before them) for the first bad one.
    ``probe`` measures one commit against ``good`` and says its side; ``on_step`` sees each probe as it ends."""
    steps: list[Probe] = []

    def step(c: Commit) -> Probe:
        p = probe(c)
        steps.append(p)
        if on_step:
            on_step(p)
        return p

    bad = commits[-1]
    first = step(bad)
    if first.side == "good":
        return Bisection("none", tuple(steps), good, bad, last_good=bad, why="the bad ref is not worse than the good")
    if first.side == "inconclusive":
        return Bisection("inconclusive", tuple(steps), good, bad, first_bad=bad, last_good=good, why=first.why)
    lo, hi = -1, len(commits) - 1              # commits[lo] is good (-1: the good ref), commits[hi] bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = step(commits[mid])
        if p.side == "inconclusive":
            return Bisection("inconclusive", tuple(steps), good, bad, first_bad=commits[hi],
                             last_good=commits[lo] if lo >= 0 else good, why=p.why)
        lo, hi = (lo, mid) if p.side == "bad" else (mid, hi)
    return Bisection("found", tuple(steps), good, bad, first_bad=commits[hi],
                     last_good=commits[lo] if lo >= 0 else good)


@contextmanager
def good_tree(good: Commit, repo: Path = REPO) -> Iterator[Path]:
    """The good ref's worktree, kept for the whole search."""
    with worktree(good.sha, repo, where="--good") as tree:
        yield tree


def measure_commit(cases: Sequence[Case], opts: RunOptions, good: Path, commit: Commit, repo: Path = REPO, *,
                   processes: int = PROCESSES, seed: int = 0,
                   on_pair: Callable[[CaseRecord, CaseRecord], None] | None = None
                   ) -> list[tuple[CaseRecord, CaseRecord]]:
    """(good's record, ``commit``'s record) per case, the two trees measured side by side in alternating workers
    (:func:`harness.engine.ab.interleave_versions`); plug-in files inside ``repo`` are each tree's own version."""
    with worktree(commit.sha, repo, where="--bad") as tree:
        return interleave_versions(cases, opts, good, here=tree, seed=seed, on_pair=on_pair, processes=processes,
                                   plugins_of=repo)
