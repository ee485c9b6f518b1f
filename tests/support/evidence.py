"""Evidence recorded, not re-measured: an upstream half kept as a fact about immutable artifacts.

An upstream run (HOTFIX_DISABLE=1) of a pinned release on a pinned torch is a fact about those artifacts and about
the case's own code: it cannot change between two CI runs unless one of them does.  A test asks for such a half
through ``upstream(record, cell, parts, guards, measure, facts)`` and reads what comes back exactly as it read the
measured value.  The record's key is the cell's own parts (releases, torch, Python, machine, the case's arguments)
and the digest of the files that make the case (``guards``: the lab's case and infrastructure, hotfix's comparison
rule, the test file; globs as statistical_size reads them).  What a run does (``HOTFIX_EVIDENCE``):

* unset (CI, a developer's run): a record with this key is the answer, except for the cells sampled this run, which
  are measured again and must show the recorded ``facts`` (the test fails where they disagree: a record can never
  drift from what upstream does); a cell without a current record is measured, and says so on stderr;
* ``full``: every cell measured; where a current record exists its facts must agree;
* ``record``: every cell measured and its record written (tests/evidence/<record>.json: commit it).

Sampled: one cell in SAMPLE_EVERY, chosen by the cell's name and the commit count of HEAD, so that successive
commits re-measure every recorded cell within SAMPLE_EVERY commits; outside a git checkout every cell is measured.
Only facts that do not depend on the CPU's floating-point kernels are recorded (verdicts, error texts), never a
loss or a gradient to compare with a live run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Sequence, TypeVar

from support.statistical_size import REPO, digest

RECORDS = REPO / "tests" / "evidence"
MODE_VAR = "HOTFIX_EVIDENCE"
MODES = ("", "full", "record")
SAMPLE_EVERY = 4
#: what every upstream half of the lab is made of, besides the test's own guards
LAB_GUARDS = ("tools/hotfix_lab/infra/*.py", "hotfix/diagnostics/*.py")

T = TypeVar("T")


def mode() -> str:
    value = os.environ.get(MODE_VAR, "").strip().lower()
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r}: one of full, record, or unset")
    return value


def key(parts: Dict[str, Any], guards: Sequence[str]) -> str:
    """The record's key: the cell's parts, the interpreter and machine, and the digest of the files it is made of."""
    whole = dict(parts, python="%d.%d" % sys.version_info[:2], machine=platform.machine())
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode() + digest([*LAB_GUARDS, *guards]).encode()
                          ).hexdigest()


@functools.lru_cache(maxsize=None)
def commit_count() -> int:
    """HEAD's commit count, or -1 outside a git checkout (then every cell is measured); asked of git once a run."""
    try:
        proc = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=str(REPO), capture_output=True, text=True,
                              timeout=30)
        return int(proc.stdout.strip()) if proc.returncode == 0 else -1
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return -1


def sampled(record: str, cell: str, count: int) -> bool:
    """Is ``cell`` of ``record`` re-measured at the commit with this count?"""
    if count < 0:
        return True
    slot = int(hashlib.sha256(f"{record}:{cell}".encode()).hexdigest()[:8], 16) % SAMPLE_EVERY
    return slot == count % SAMPLE_EVERY


def _path(record: str) -> Path:
    return RECORDS / f"{record}.json"


def read(record: str) -> Dict[str, Dict[str, Any]]:
    path = _path(record)
    return json.loads(path.read_text()) if path.exists() else {}


def _write(record: str, cell: str, entry: Dict[str, Any]) -> None:
    records = read(record)
    records[cell] = entry
    path = _path(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def upstream(record: str, cell: str, parts: Dict[str, Any], guards: Sequence[str], measure: Callable[[], T],
             facts: Callable[[T], Any]) -> T:
    """The upstream half ``cell`` of ``record``: recorded, or measured (see the module's docstring).  ``measure``
    returns a JSON value; ``facts`` projects what a re-measurement must agree on."""
    import datetime

    import pytest

    wanted = mode()
    current = key(parts, guards)
    found = read(record).get(cell)
    current_record = found if found and found.get("key") == current else None
    if wanted == "" and current_record and not sampled(record, cell, commit_count()):
        return current_record["value"]
    value = json.loads(json.dumps(measure()))  # as a record would give it back
    shown = json.loads(json.dumps(facts(value)))
    if current_record is not None and shown != current_record["facts"]:
        pytest.fail(f"evidence {record}/{cell}: upstream now shows {shown!r}, the record "
                    f"({current_record['measured']}) {current_record['facts']!r}: find why, then "
                    f"{MODE_VAR}=record and commit tests/evidence/{record}.json")
    if wanted == "record":
        _write(record, cell, {"key": current, "measured": datetime.date.today().isoformat(), "value": value,
                              "facts": shown})
    elif current_record is None:
        print(f"evidence {record}/{cell}: no current record (measured; {MODE_VAR}=record writes it)", file=sys.stderr)
    return value
