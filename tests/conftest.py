"""Shared test plumbing: the release matrix and fresh-interpreter runs.

The suite runs against hotfix installed from a wheel in the test venv (see
scripts/test.sh), never the source tree, so what is tested is what users get.
Other library versions live side by side in .matrix/<name>-<version>/ and are
put first on PYTHONPATH of a child interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import pytest

from hotfix.diagnostics import children
from hotfix.diagnostics.children import child_env, json_lines  # noqa: F401  (tests import json_lines from here)
from hotfix.notice import REPAIR_NOTICE

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TOOLS = REPO / "tools"  # developer tooling shared by tests, bench and the GPU kit (zoo_loader, tiny_models...)
sys.path.insert(0, str(TOOLS))  # in-process tests import tiny_models / zoo_loader as the children do
MATRIX = REPO / ".matrix"
IN_CI = bool(os.environ.get("CI"))


def matrix_versions(name: str) -> List[str]:
    versions = []
    for line in (TESTS / "matrix.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and parts[0] == name:
            versions.append(parts[1])
    return versions


def matrix_path(name: str, version: str) -> Path:
    path = MATRIX / f"{name}-{version}"
    if not (path / ".complete").exists():
        message = f"{path} is not installed; run scripts/test.sh"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def clean_env(extra: Optional[Dict[str, str]] = None, pythonpath: Iterable[Path] = ()) -> Dict[str, str]:
    """A child's environment: no HOTFIX_* settings, PYTHONPATH = the given paths, tests/ and tools/."""
    return child_env(keep_hotfix_settings=False, pythonpath=[*pythonpath, TESTS, TOOLS], extra=extra)


def run_python(
    args: List[str],
    *,
    env: Optional[Dict[str, str]] = None,
    pythonpath: Iterable[Path] = (),
    cwd: Optional[Path] = None,
    timeout: float = 600,
    python: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh interpreter of the test venv.

    cwd defaults to a directory outside the repository so that the source
    tree's ``hotfix/`` can never shadow the installed one.
    """
    return children.run_python(args, env=clean_env(env, pythonpath), cwd=cwd or TESTS / "_scratch",
                               timeout=timeout, python=python)


def hotfix_lines(stderr: str) -> List[str]:
    """hotfix's problem lines on stderr (each starts with 'hotfix:'), without its once-per-process repair notice."""
    return [line for line in stderr.splitlines() if line.startswith("hotfix:") and not line.startswith(REPAIR_NOTICE)]


def repair_notices(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith(REPAIR_NOTICE)]


@pytest.fixture(scope="session", autouse=True)
def _scratch_dir():
    (TESTS / "_scratch").mkdir(exist_ok=True)
    yield


def pytest_report_header(config):
    try:
        import hotfix

        where = hotfix.__file__
    except Exception as exc:  # pragma: no cover
        where = f"not importable: {exc!r}"
    return [f"hotfix under test: {where}"]
