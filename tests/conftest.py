"""Shared test plumbing: the release matrix and fresh-interpreter runs.

The suite runs against hotfix installed from a wheel in the test venv (see
scripts/test.sh), never the source tree, so what is tested is what users get.
Other library versions live side by side in .matrix/<name>-<version>/ and are
put first on PYTHONPATH of a child interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TOOLS = REPO / "tools"  # developer tooling shared by tests, bench and the GPU kit (zoo_loader...)
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTFIX_") and k != "PYTHONPATH"}
    paths = [str(p) for p in pythonpath] + [str(TESTS), str(TOOLS)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


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
    return subprocess.run(
        [python or sys.executable, *args],
        env=clean_env(env, pythonpath),
        cwd=str(cwd or TESTS / "_scratch"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


REPAIR_NOTICE = "hotfix: repaired a checkpointed call"


def hotfix_lines(stderr: str) -> List[str]:
    """hotfix's problem lines on stderr (each starts with 'hotfix:'), without its once-per-process repair notice."""
    return [line for line in stderr.splitlines() if line.startswith("hotfix:") and not line.startswith(REPAIR_NOTICE)]


def repair_notices(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith(REPAIR_NOTICE)]


def json_lines(output: str) -> List[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


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
