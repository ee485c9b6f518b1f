"""The .pth line (hotfix/startup/files.py): what it relies on is there, and it stays short.

It is compiled at every interpreter start, and its parse was most of what the start-up hook cost
(docs/performance.md, "start-up"); it calls importlib's private ``_load``, present from Python 3.4 to 3.15
(3.15 runs the ``.start`` file instead).  If a Python drops it, this fails here before users see a traceback
at every start.
"""

import _frozen_importlib
import _frozen_importlib_external
import os
import sys
import types

from hotfix.startup import files

MISSING = "hotfix-checkpoint is damaged: _hotfix_boot.py is missing from %s; hotfix is off"


def _run(line, sitedir):
    """What site.addpackage does: exec the line with site's names (sys, os, sitedir) in scope."""
    exec(line, {"sys": sys, "os": os, "sitedir": sitedir})


def test_the_private_loader_the_line_calls_exists():
    assert callable(getattr(_frozen_importlib, "_load", None))
    assert callable(_frozen_importlib_external.PathFinder.find_spec)


def test_wheel_line_is_short_and_one_line():
    line = files.wheel_line(MISSING)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert line.startswith("import ") and len(line) < 400, len(line)  # was 557 characters (1.066 start-up)


def test_wheel_line_loads_the_boot_module_from_its_own_folder_once(tmp_path, monkeypatch, capsys):
    (tmp_path / "_hotfix_boot.py").write_text("RUNS = []\ndef boot(home):\n    RUNS.append(home)\n")
    monkeypatch.delitem(sys.modules, files.BOOT_MODULE, raising=False)
    line = files.wheel_line(MISSING)
    _run(line, str(tmp_path))
    _run(line, str(tmp_path))  # a venv's second reading of site-packages (lib64 -> lib)
    module = sys.modules[files.BOOT_MODULE]
    assert isinstance(module, types.ModuleType) and module.RUNS == [None]
    assert module.__file__ == str(tmp_path / "_hotfix_boot.py")
    assert capsys.readouterr().err == ""


def test_wheel_line_without_its_boot_module_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, files.BOOT_MODULE, raising=False)
    line = files.wheel_line(MISSING)
    _run(line, str(tmp_path))
    _run(line, str(tmp_path))
    assert capsys.readouterr().err == "hotfix: " + MISSING % tmp_path + "\n"
    assert sys.modules[files.BOOT_MODULE] is None  # marked: the second reading says nothing


def test_editable_line_loads_the_checkouts_file_and_says_so_when_gone(tmp_path, monkeypatch, capsys):
    boot = tmp_path / "hotfix" / "startup" / "boot.py"
    boot.parent.mkdir(parents=True)
    boot.write_text("RUNS = []\ndef boot(home):\n    RUNS.append(home)\n")
    line = files.editable_line(str(boot), str(tmp_path), "editable from here, but %s is missing")
    monkeypatch.delitem(sys.modules, files.BOOT_MODULE, raising=False)
    _run(line, "/elsewhere")
    assert sys.modules[files.BOOT_MODULE].RUNS == [str(tmp_path)]
    boot.unlink()
    monkeypatch.delitem(sys.modules, files.BOOT_MODULE)
    _run(line, "/elsewhere")
    assert capsys.readouterr().err == "hotfix: editable from here, but %s is missing\n" % boot
