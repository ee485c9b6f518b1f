#!/usr/bin/env python3
"""Where a test run's time goes: renders the time log scripts/test.sh asks the tests for (issue 52, part 2).

    bash scripts/test.sh ...                     # writes .ci-log/ (HOTFIX_CI_LOG): a JSON line per test phase
                                                 # and per child interpreter started through tests' run_python
    python -P -m hotfix_lab.bench.ci_time .ci-log --wall 1850 --machine "2-vCPU AMD EPYC" > docs/ci-time.md

Test phases are summed per tier and per file (setup holds a module fixture's training); children are summed by
interpreter, the releases first on their PYTHONPATH, and whether hotfix was off (HOTFIX_DISABLE=1: an upstream
half, a fact about pinned releases) or on.  Times are worker time: two xdist workers run at once, so the sums are
about twice the wall time.  Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Tuple


def read(folder: Path) -> Tuple[List[dict], List[dict]]:
    """(test phases, children) from every file of the log folder."""
    phases, children = [], []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            (children if "child" in record else phases).append(record)
    return phases, children


def _tier(nodeid: str) -> str:
    parts = _file(nodeid).split("/")
    return parts[0] if len(parts) > 1 else "?"


def _file(nodeid: str) -> str:
    """The test file, relative to tests/ (pytest names it from the rootdir, a child's PYTEST_CURRENT_TEST may not)."""
    name = nodeid.split("::", 1)[0]
    return name[len("tests/"):] if name.startswith("tests/") else name


def _minutes(seconds: float) -> str:
    return "%d:%02d" % divmod(round(seconds), 60)


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> List[str]:
    header = list(header)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return out


def render(phases: List[dict], children: List[dict], wall: float = 0.0, machine: str = "", top: int = 25) -> str:
    by_tier: Dict[str, float] = collections.Counter()
    tests_in_tier: Dict[str, set] = collections.defaultdict(set)
    by_file: Dict[str, float] = collections.Counter()
    for phase in phases:
        by_tier[_tier(phase["test"])] += phase["s"]
        tests_in_tier[_tier(phase["test"])].add(phase["test"])
        by_file[_file(phase["test"])] += phase["s"]
    child_by_file: Dict[str, float] = collections.Counter()
    upstream_by_file: Dict[str, float] = collections.Counter()
    by_kind: Dict[Tuple[str, str, str], List[float]] = collections.defaultdict(list)
    forked: Dict[Tuple[str, str, str], List[float]] = collections.defaultdict(list)  # from a warm interpreter
    for child in children:
        name = _file(child["child"])
        child_by_file[name] += child["wall_s"]
        if child["upstream"]:
            upstream_by_file[name] += child["wall_s"]
        releases = ", ".join(child["releases"]) or "(the test venv's)"
        kind = (child["python"], releases, "upstream" if child["upstream"] else "hotfix")
        by_kind[kind].append(child["wall_s"])
        if child.get("warm"):
            forked[kind].append(child["wall_s"])
    total = sum(by_tier.values())
    lines = ["# Where the test run's time goes", ""]
    when = datetime.date.today().isoformat()
    lines.append("Rendered %s by `tools/hotfix_lab/bench/ci_time.py` from the time log of one `bash scripts/test.sh` run%s%s. "
                 "Times are worker time (two xdist workers run at once: the sums are about twice the wall time); "
                 "a test's setup holds its module fixtures (often a training run shared by the file's tests)."
                 % (when, " on " + machine if machine else "", ", wall %s" % _minutes(wall) if wall else ""))
    lines += ["", "## By tier", ""]
    lines += _table(["tier", "tests", "worker time", "share"],
                    [(tier, len(tests_in_tier[tier]), _minutes(seconds), "%.0f %%" % (100 * seconds / total))
                     for tier, seconds in sorted(by_tier.items(), key=lambda item: -item[1])])
    lines += ["", "All tests: %s of worker time%s." % (_minutes(total), (", about %s of wall time with two workers, "
                                                                          "the rest of the run: installs, the wheel, pytest starting" % _minutes(total / 2)) if wall else "")]
    lines += ["", "## The %d slowest test files" % top, "",
              "Children: wall time of the child interpreters the file started through `run_python` (census and sweep "
              "tools start their own, counted in the file's time only; a file may run children side by side, so their "
              "sum can pass the file's own time); upstream: those with HOTFIX_DISABLE=1.", ""]
    lines += _table(["file", "worker time", "children", "of them upstream"],
                    [(name, _minutes(seconds), _minutes(child_by_file[name]), _minutes(upstream_by_file[name]))
                     for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:top]])
    lines += ["", "## Children by environment", ""]
    kinds = sorted(by_kind.items(), key=lambda item: -sum(item[1]))
    rows = [(python, releases, side, len(times), _minutes(sum(times)), len(forked[(python, releases, side)]))
            for (python, releases, side), times in kinds[:top]]
    rest = [time for _, times in kinds[top:] for time in times]
    if rest:
        rows.append(("%d other environments" % (len(kinds) - top), "", "", len(rest), _minutes(sum(rest)),
                     sum(len(forked[kind]) for kind, _ in kinds[top:])))
    lines += _table(["interpreter", "releases first on PYTHONPATH", "hotfix", "children", "wall time",
                     "of them forked warm"], rows)
    upstream = sum(sum(times) for (_, _, side), times in by_kind.items() if side == "upstream")
    every = sum(sum(times) for times in by_kind.values())
    warm = [time for times in forked.values() for time in times]
    lines += ["", "Children in all: %d, %s; with hotfix off (upstream halves): %s (%.0f %%); forked from a warm "
              "interpreter (tests/support/warm_interpreter.py): %d, %s."
              % (len(children), _minutes(every), _minutes(upstream), 100 * upstream / every if every else 0,
                 len(warm), _minutes(sum(warm))), ""]
    return "\n".join(lines)


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the folder scripts/test.sh wrote (HOTFIX_CI_LOG)")
    parser.add_argument("--wall", type=float, default=0.0, help="the run's wall time in seconds, to quote")
    parser.add_argument("--machine", default="", help="the machine, in words, to quote")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    phases, children = read(args.log)
    if not phases:
        print(f"ci_time: no test phases in {args.log}", file=sys.stderr)
        return 1
    sys.stdout.write(render(phases, children, args.wall, args.machine, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
