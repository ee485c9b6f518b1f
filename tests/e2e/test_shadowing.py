"""Start-up runs only hotfix's own code, found by location; a damaged install says so.

A user's project may hold its own ``hotfix.py`` (or ``hotfix/``) next to
``train.py``, or put a ``_hotfix_boot.py`` on PYTHONPATH.  The start-up hook
used to import both by name: the user's file ran at ``import transformers``
(an argparse in it ended the program with rc=2) and hotfix stayed off in
silence.  Installing and uninstalling PyPI's unrelated ``hotfix`` deletes
``site-packages/hotfix/__init__.py``: hotfix was silently off afterwards.
"""

from __future__ import annotations

import shutil
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conftest import hotfix_lines, json_lines, run_python

SITE = Path(sysconfig.get_paths()["purelib"])

# A user's module that must never run: it exits the program like an argparse
# script started without its arguments.
USER_MODULE = "import sys\nsys.stderr.write('USER MODULE RAN\\n')\nsys.exit(2)\n"

TRAIN = textwrap.dedent(
    """
    import json, sys
    import torch, transformers
    from hotfix_lab.infra import tiny_models
    from hotfix_lab.infra import standalone
    compare = standalone.load("compare")  # hotfix's comparison rule, without importing hotfix
    model, batch = tiny_models.whisper(0)
    def grads():
        return compare.collect_grads(model)
    model(**batch).loss.backward(); reference = grads(); model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    try:
        model(**batch).loss.backward()
        ok = compare.compare_grads(reference, grads()).ok
    except RuntimeError as exc:
        ok = compare.short_error(exc)
    hotfix = sys.modules.get("hotfix")
    print(json.dumps({"trains": ok, "hotfix_file": getattr(hotfix, "__file__", None),
                      "active": bool(sys.modules.get("hotfix.registry") and sys.modules["hotfix.registry"].registry.active)}))
    """
)


def _project(tmp_path, layout):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    if layout == "hotfix.py":
        (project / "hotfix.py").write_text(USER_MODULE)
    elif layout == "hotfix/":
        (project / "hotfix").mkdir()
        (project / "hotfix" / "__init__.py").write_text(USER_MODULE)
    return project


@pytest.mark.parametrize("how", ["script", "cwd -c (notebook-like)", "PYTHONPATH=."])
@pytest.mark.parametrize("layout", ["hotfix.py", "hotfix/"])
def test_users_own_hotfix_module_never_runs(tmp_path, layout, how):
    """The installed hotfix is loaded by location and fixes Whisper; the user's
    module never runs; one line names the shadowing file."""
    project = _project(tmp_path, layout)
    if how == "script":
        proc = run_python([str(project / "train.py")], cwd=project, timeout=300)
    elif how == "PYTHONPATH=.":
        proc = run_python([str(project / "train.py")], cwd=tmp_path, pythonpath=[project], timeout=300)
    else:
        proc = run_python(["-c", TRAIN], cwd=project, timeout=300)
    assert "USER MODULE RAN" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json_lines(proc.stdout)[0]
    assert seen == {"trains": True, "hotfix_file": str(SITE / "hotfix" / "__init__.py"), "active": True}, seen
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and "shadows the installed hotfix-checkpoint" in lines[0], proc.stderr
    assert str(project / "hotfix") in lines[0], lines


def test_users_own_boot_module_on_pythonpath_is_ignored(tmp_path):
    """A ``_hotfix_boot.py`` earlier on PYTHONPATH is not what the .pth line runs."""
    (tmp_path / "_hotfix_boot.py").write_text(USER_MODULE)
    proc = run_python(["-c", TRAIN], pythonpath=[tmp_path], timeout=300)
    assert "USER MODULE RAN" not in proc.stderr and "Error processing line" not in proc.stderr, proc.stderr
    assert json_lines(proc.stdout)[0]["trains"] is True, proc.stderr[-2000:]
    assert hotfix_lines(proc.stderr) == [], proc.stderr


def _fake_site(tmp_path, init_text):
    """A site-packages copy of hotfix's files, with hotfix/__init__.py replaced or removed."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("_hotfix_boot.py", "hotfix-checkpoint.pth"):
        shutil.copy(SITE / name, site / name)
    shutil.copytree(SITE / "hotfix", site / "hotfix", ignore=shutil.ignore_patterns("__pycache__"))
    if init_text is None:
        (site / "hotfix" / "__init__.py").unlink()
    else:
        (site / "hotfix" / "__init__.py").write_text(init_text)
    return site


# -S: no site processing, so only the fake site's .pth boots; the venv's
# site-packages is then added as a plain path (torch, transformers).
DAMAGED_PROBE = r"""
import json, site, sys
sys.path.append(sys.argv[2])
site.addsitedir(sys.argv[1])
import transformers.modeling_layers as ml
print(json.dumps({"transformers": sys.modules["transformers"].__version__,
                  "patched": "_gradient_checkpointing_func" in ml.GradientCheckpointingLayer.__dict__}))
"""


@pytest.mark.parametrize("damage", ["missing __init__.py", "foreign __init__.py"])
def test_damaged_install_is_one_clear_line(tmp_path, damage):
    """PyPI's unrelated ``hotfix`` deleted or overwrote ``hotfix/__init__.py``:
    ``import transformers`` works, hotfix is off, and one line says why and how to repair."""
    site = _fake_site(tmp_path, None if damage.startswith("missing") else "VERSION = '1.0.4'\n")
    proc = run_python(["-S", "-c", DAMAGED_PROBE, str(site), str(SITE)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json_lines(proc.stdout) == [{"transformers": "4.56.2", "patched": False}], proc.stderr
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "hotfix-checkpoint is damaged" in lines[0] and "pip install --force-reinstall" in lines[0], lines
    assert ("missing" in lines[0]) == damage.startswith("missing"), lines


def test_damaged_install_status_command_says_so(tmp_path):
    """``python -m hotfix status`` on an install without ``hotfix/__init__.py``:
    exit status 2 and the repair line, not a traceback."""
    site = _fake_site(tmp_path, None)
    probe = "import runpy, sys; sys.path[:0] = [sys.argv[1]]; sys.argv[1:] = ['status']; " \
            "runpy.run_module('hotfix', run_name='__main__', alter_sys=True)"
    proc = run_python(["-S", "-c", probe, str(site)], timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and "damaged" in lines[0] and "--force-reinstall" in lines[0], proc.stderr
