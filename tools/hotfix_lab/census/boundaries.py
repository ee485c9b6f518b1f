"""Patch releases at boundaries: a mechanism's state can change inside a transformers minor line.

The census measures the last patch release of each line (and the first where a declared range starts);
a window opened and closed by patch releases (Gemma-4's KV sharing lost under checkpointing on 5.5.0 -
5.5.1, huggingface/transformers#45242, restored in 5.5.2 by #45312) falls between them.  The bisect:
measure the first patch release of every line that has several; where the first and the last
disagree on a cell (its verdict through one checkpoint function, hotfix off or on), measure that cell
on every patch release between them.  A window that opens and closes strictly between the first and
the last patch release of a line is not seen: the first and the last agree there.

``plan(rows, torch)`` says what is left to measure; ``lines(rows, torch)`` what the rows show, for the
page (tools/hotfix_lab/census/render.py) and tests/versions/test_version_gates.py.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from hotfix_lab.census import releases

#: verdicts that are not a measurement: a cell with one on either side is not compared
UNMEASURED = ("error",)


class Line(NamedTuple):
    """One minor line with several patch releases, as the rows of one torch show it."""

    releases: List[str]  # every final release of the line, oldest first
    measured: bool  # its first and last patch release both have rows to compare
    disagree: List[str]  # cases whose verdicts differ between them, sorted
    compared: List[str]  # the cases both have rows of (a bisect asked for some cells only: those), sorted


def _verdicts(rows: List[Dict], torch: str, release: str) -> Dict[Tuple[str, str, bool], str]:
    """(function, case, hotfix) -> verdict of the regular transformers rows of ``release`` under ``torch``."""
    return {(r["function"], r["case"], r["hotfix"]): r["verdict"] for r in rows
            if r["dimension"] == "transformers" and not r.get("line") and r["torch"] == torch
            and r["release"] == release}


def disagreeing(rows: List[Dict], torch: str, first: str, last: str) -> Optional[Tuple[List[str], List[str]]]:
    """(the cases whose verdict differs between ``first`` and ``last``, any function, hotfix off or on; the cases
    compared); None when either release has no rows under ``torch``."""
    a, b = _verdicts(rows, torch, first), _verdicts(rows, torch, last)
    if not a or not b:
        return None
    both = a.keys() & b.keys()
    return (sorted({case for function, case, hotfix in both
                    if a[function, case, hotfix] != b[function, case, hotfix]
                    and not {a[function, case, hotfix], b[function, case, hotfix]} & set(UNMEASURED)}),
            sorted({case for _, case, _ in both}))


def lines(rows: List[Dict], torch: str) -> List[Line]:
    """Every census line with several patch releases, oldest first."""
    out = []
    for patch_releases in releases.patch_lines():
        found = disagreeing(rows, torch, patch_releases[0], patch_releases[-1])
        disagree, compared = found or ([], [])
        out.append(Line(patch_releases, found is not None, disagree, compared))
    return out


def firsts() -> List[str]:
    """The first patch release of every census line that has several: the bisect's first measurement."""
    return [patch_releases[0] for patch_releases in releases.patch_lines()]


def plan(rows: List[Dict], torch: str) -> Dict[str, List[str]]:
    """release -> the cases to measure there: each case where its line's first and last patch release disagree,
    on every release between them that has no row of it yet (under ``torch``, any function or hotfix state)."""
    todo: Dict[str, List[str]] = {}
    for line in lines(rows, torch):
        wanted = _verdicts(rows, torch, line.releases[0]).keys()
        for release in line.releases[1:-1]:
            have = _verdicts(rows, torch, release).keys()
            missing = [case for case in line.disagree if any(key[1] == case and key not in have for key in wanted)]
            if missing:
                todo[release] = missing
    return todo
