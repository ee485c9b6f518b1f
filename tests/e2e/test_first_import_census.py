"""hotfix is active whatever a script imports first: the first-import census (tools/hotfix_lab/census/first_import.py).

Before 2026-11-29 the start-up hook's finder armed itself on the first *look-up* of a trigger's spec and let only
that spec's execution activate hotfix: TRL, diffusers, optimum (``importlib.util.find_spec("transformers")``), an
``if find_spec("unsloth"): import unsloth`` guard, ``pkgutil``, a probe in a thread or before a fork left every
fix off for the whole process, silently.  The census runs each case in a fresh interpreter (hotfix installed, no
``import hotfix``) and asks ``hotfix_state`` what is applied *in that process*; this test runs every case and
checks docs/census/first-import.md is the page that run renders (the table in docs is what CI measured): the test
venv's cases, and timm's and open_clip's beside torch 2.11 (its own section, once that side torch is installed).
"""

from __future__ import annotations

import subprocess
import sys

from conftest import IN_CI, REPO, clean_env, matrix_path

import pytest

CENSUS = ["-P", "-m", "hotfix_lab.census.first_import"]
PAGE = REPO / "docs" / "census" / "first-import.md"
SIDE_TORCH = "2.11.0"  # the census's SIDE cases' torch line


def _section(tmp_path, section):
    """The census's run of one section of the page: the text it renders."""
    page = tmp_path / f"first-import-{section}.md"
    proc = subprocess.run([sys.executable, *CENSUS, "--section", section, "--page", str(page)],
                          capture_output=True, text=True, timeout=900, cwd=str(tmp_path), env=clean_env())
    if "is not installed" in proc.stdout and not IN_CI:
        pytest.skip("the census's libraries are not installed in .matrix/ (scripts/test.sh installs them)")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    return page.read_text(), proc.stdout


def test_every_first_import_leaves_hotfix_active(tmp_path):
    rendered, said = _section(tmp_path, "main")
    assert PAGE.read_text().startswith(rendered), "docs/census/first-import.md differs from this run: " + said


@pytest.mark.side_torch  # scripts/test.sh installs the side torch, and timm and open_clip beside it, meanwhile
def test_timm_and_open_clip_first_leave_hotfix_active(tmp_path):
    """Beside torch 2.11 (PyPI has torchvision for it, none for the test venv's CPU torch)."""
    matrix_path("torch", SIDE_TORCH)  # skips where the machine had no disk for it (census.torch_venv says so)
    rendered, said = _section(tmp_path, "side")
    text = PAGE.read_text()
    assert text.endswith(rendered), "docs/census/first-import.md's last section differs from this run: " + said
    assert "\n## " not in text[:len(text) - len(rendered)]  # the page is the two sections, nothing between
