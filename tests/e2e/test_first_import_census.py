"""hotfix is active whatever a script imports first: the first-import census (tools/census/first_import.py).

Before 2026-11-29 the start-up hook's finder armed itself on the first *look-up* of a trigger's spec and let only
that spec's execution activate hotfix: TRL, diffusers, optimum (``importlib.util.find_spec("transformers")``), an
``if find_spec("unsloth"): import unsloth`` guard, ``pkgutil``, a probe in a thread or before a fork left every
fix off for the whole process, silently.  The census runs each case in a fresh interpreter (hotfix installed, no
``import hotfix``) and asks ``hotfix_state`` what is applied *in that process*; this test runs every case and
checks docs/census/first-import.md is the page that run renders (the table in docs is what CI measured).
"""

from __future__ import annotations

import subprocess
import sys

from conftest import IN_CI, REPO, TOOLS, clean_env

import pytest

CENSUS = TOOLS / "census" / "first_import.py"
PAGE = REPO / "docs" / "census" / "first-import.md"


def test_every_first_import_leaves_hotfix_active(tmp_path):
    page = tmp_path / "first-import.md"
    proc = subprocess.run([sys.executable, str(CENSUS), "--page", str(page)], capture_output=True, text=True,
                          timeout=900, cwd=str(tmp_path), env=clean_env())
    if "is not installed" in proc.stdout and not IN_CI:
        pytest.skip("the census's libraries are not installed in .matrix/ (scripts/test.sh installs them)")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert page.read_text() == PAGE.read_text(), "docs/census/first-import.md differs from this run: " + proc.stdout
