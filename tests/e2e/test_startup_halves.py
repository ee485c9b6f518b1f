"""The start-up hook in two halves (issue 52 part 4): a process that imports only the standard library runs
the small first half; the first import outside it runs the second half and hands that import on.

Before the split every interpreter loaded the whole hook (the finder, the loader proxies, hotfix's loading, the
third-party scan) at start-up; the first test fails there (the activating finder is in sys.meta_path at once).
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from conftest import hotfix_lines, json_lines, run_python

SITE = Path(sysconfig.get_paths()["purelib"])

HALVES = r"""
import json, sys
def first():
    return [type(f).__name__ for f in sys.meta_path[:1]]
boot = sys.modules["_hotfix_boot"]
seen = {"start": first(), "second_half_at_start": hasattr(boot, "ActivateOnFirstImport")}
import os, textwrap, collections  # standard library: the watch answers, nothing more
seen["after_stdlib"] = first() + [hasattr(boot, "ActivateOnFirstImport")]
import numpy  # the first import outside the standard library
seen["after_numpy"] = first() + [hasattr(boot, "ActivateOnFirstImport"), "hotfix" in sys.modules]
import transformers.modeling_layers as ml
seen["patched"] = "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__
print(json.dumps(seen))
"""


def test_standard_library_only_never_loads_the_second_half():
    proc = run_python(["-c", HALVES], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json_lines(proc.stdout)[0]
    assert seen["start"] == ["FirstImportWatch"] and seen["second_half_at_start"] is False, seen
    assert seen["after_stdlib"] == ["FirstImportWatch", False], seen
    # the activating finder took the watch's place (first), and numpy did not activate hotfix
    assert seen["after_numpy"] == ["ActivateOnFirstImport", True, False], seen
    assert seen["patched"] is True, seen
    assert hotfix_lines(proc.stderr) == [], proc.stderr


# -S: only the fake site's .pth boots; the venv's site-packages is then a plain path (torch, transformers).
DAMAGED_PROBE = r"""
import json, site, sys
sys.path.append(sys.argv[2])
site.addsitedir(sys.argv[1])
import transformers.modeling_layers as ml
print(json.dumps({"patched": "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__}))
"""


def _site_without_second_half(tmp_path):
    """A site-packages copy of hotfix's files without hotfix/startup/activation.py."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("_hotfix_boot.py", "hotfix-checkpoint.pth"):
        shutil.copy(SITE / name, site / name)
    shutil.copytree(SITE / "hotfix", site / "hotfix", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "hotfix" / "startup" / "activation.py").unlink()
    return site


def test_missing_second_half_is_one_clear_line(tmp_path):
    """An install without hotfix/startup/activation.py: ``import transformers`` works, hotfix is off, one line
    says so and how to repair."""
    site = _site_without_second_half(tmp_path)
    proc = run_python(["-S", "-c", DAMAGED_PROBE, str(site), str(SITE)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json_lines(proc.stdout) == [{"patched": False}], proc.stderr
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "hotfix-checkpoint is damaged" in lines[0] and "activation.py" in lines[0], lines
    assert "pip install --force-reinstall" in lines[0], lines


EXPLICIT_PROBE = r"""
import json, site, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]  # the damaged site first: its hotfix is the one imported
site.addsitedir(sys.argv[1])
try:
    import hotfix
    print(json.dumps({"imported": True}))
except ImportError as exc:
    print(json.dumps({"imported": False, "error": str(exc)}))
"""


def test_missing_second_half_fails_an_explicit_import_as_a_damaged_install(tmp_path):
    """The same damage under ``import hotfix``: an ImportError that says the install is damaged and how to repair,
    not importlib's FileNotFoundError from inside the package."""
    site = _site_without_second_half(tmp_path)
    proc = run_python(["-S", "-c", EXPLICIT_PROBE, str(site), str(SITE)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json_lines(proc.stdout)[0]
    assert seen["imported"] is False, seen
    assert seen["error"].startswith("hotfix-checkpoint is damaged: the start-up hook's second half"), seen
    assert "activation.py" in seen["error"] and "pip install --force-reinstall" in seen["error"], seen
