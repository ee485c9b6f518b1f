"""A statistical test's size: full where the code it guards changed since its last full run, else its CI size.

A test that proves an absence by many random trials (no deadlock in 50 fresh interpreters) costs CI minutes on
every run, and re-proves the same code.  Such a test declares two sizes and the files it guards.  It runs its full
size where the guarded files differ from their digest at its last passing full run (kept in
``full_size_runs.json`` beside this file, written by that run: commit it with the change), or where
``HOTFIX_FULL_SIZE=1`` asks; else its CI size, which must still prove the claim (each test says why).  A clean
clone knows from its own files whether the guarded code changed: a change not yet proven at full size runs at
full size in CI until its digest is committed.

    HOTFIX_FULL_SIZE=1 .venv-test/bin/python -m pytest tests/e2e/test_startup_concurrency.py   # then commit the json
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple, Sequence

from hotfix.config import TRUE_VALUES  # HOTFIX_* switches read as hotfix reads them

REPO = Path(__file__).resolve().parents[2]
RUNS = Path(__file__).with_name("full_size_runs.json")
FULL_VAR = "HOTFIX_FULL_SIZE"


class Size(NamedTuple):
    trials: int
    full: bool
    why: str


def digest(guards: Sequence[str]) -> str:
    """One digest of the guarded files (paths relative to the repository; a glob matches files in order)."""
    hasher = hashlib.sha256()
    for pattern in guards:
        for path in sorted(REPO.glob(pattern)):
            hasher.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return hasher.hexdigest()


def _runs() -> dict:
    try:
        return json.loads(RUNS.read_text())
    except (OSError, ValueError):
        return {}


def size_of(test: str, ci: int, full: int, guards: Sequence[str]) -> Size:
    """How many trials ``test`` runs here, and why."""
    if os.environ.get(FULL_VAR, "").strip().lower() in TRUE_VALUES:
        return Size(full, True, f"{FULL_VAR} asks for the full size")
    if _runs().get(test) != digest(guards):
        return Size(full, True, "the code it guards changed since its last full run (tests/support/full_size_runs.json)")
    return Size(ci, False, "the code it guards passed the full size as it is; CI size")


def record_full_run(test: str, guards: Sequence[str]) -> None:
    """After a passing full-size run: the guarded files' digest, so that CI runs the CI size until they change."""
    runs = _runs()
    runs[test] = digest(guards)
    RUNS.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
