"""Auto-activation follows third-party fixes whose targets lie outside transformers/unsloth.

The start-up hook activates hotfix on the first import of transformers,
unsloth or unsloth_zoo.  A plugin fix targeting another library (the README's
``foo.layers``) used to be applied only in processes that also imported one
of those.  Now, when an installed distribution other than hotfix-checkpoint
declares the ``hotfix.patches`` entry-point group, the first top-level import
of a module outside the standard library activates hotfix (hotfix/startup/boot.py),
once that module ran; without such a distribution nothing changes.

The first import used to activate hotfix *before* its module ran: when it was a
module hotfix itself imports (``import logging`` opens the HF example scripts;
``re``, ``dataclasses``, ``typing``...), activation met it half made ("partially
initialized module 'logging'") and hotfix stayed off for the process.  And
``import hotfix`` first made the hook call the installed hotfix "a different
module named 'hotfix'".
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import CRASH, hotfix_lines, json_lines, run_python

PLUGIN = '''
from hotfix import Patch

class FooLayersFix(Patch):
    name = "foo-layers-fix"
    targets = ("foo_lib.layers",)
    def _apply(self, module):
        self.replace(module, "value", module.value + 10)

patch = FooLayersFix()
'''

PROBE = textwrap.dedent(
    """
    import json, sys
    import foo_lib.layers
    print(json.dumps({"value": foo_lib.layers.value,
                      "hotfix_loaded": "hotfix.registry" in sys.modules,
                      "transformers_loaded": "transformers" in sys.modules}))
    """
)


def _library(tmp_path, with_plugin):
    (tmp_path / "foo_lib").mkdir()
    (tmp_path / "foo_lib" / "__init__.py").write_text("")
    (tmp_path / "foo_lib" / "layers.py").write_text("value = 1\n")
    if with_plugin:
        (tmp_path / "foo_fix.py").write_text(PLUGIN)
        info = tmp_path / "foo_fix-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: foo-fix\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[console_scripts]\nfoo = foo_fix:main\n\n"
                                               "[hotfix.patches]\nfoo-layers-fix = foo_fix:patch\n")
    return tmp_path


def test_plugin_target_outside_transformers_is_patched_under_auto_activation(tmp_path):
    proc = run_python(["-c", PROBE], pythonpath=[_library(tmp_path, True)], timeout=120)
    assert json_lines(proc.stdout) == [{"value": 11, "hotfix_loaded": True, "transformers_loaded": False}], proc.stderr


def test_without_third_party_fixes_other_imports_do_not_activate(tmp_path):
    proc = run_python(["-c", PROBE], pythonpath=[_library(tmp_path, False)], timeout=120)
    assert json_lines(proc.stdout) == [{"value": 1, "hotfix_loaded": False, "transformers_loaded": False}], proc.stderr


def test_disabled_means_no_activation_even_with_plugins(tmp_path):
    proc = run_python(["-c", PROBE], pythonpath=[_library(tmp_path, True)], env={"HOTFIX_DISABLE": "1"}, timeout=120)
    assert json_lines(proc.stdout) == [{"value": 1, "hotfix_loaded": False, "transformers_loaded": False}], proc.stderr


@pytest.mark.parametrize("first", ["logging", "re", "dataclasses", "typing", "importlib.metadata"])
def test_plugin_installed_and_a_module_hotfix_needs_imported_first(tmp_path, first):
    """The script's first import is a standard-library module hotfix itself imports: hotfix is
    active all the same, the plugin's fix is applied, and nothing is printed."""
    proc = run_python(["-c", f"import {first}\n" + PROBE], pythonpath=[_library(tmp_path, True)], timeout=120)
    assert json_lines(proc.stdout) == [{"value": 11, "hotfix_loaded": True, "transformers_loaded": False}], proc.stderr
    assert hotfix_lines(proc.stderr) == [], proc.stderr


@pytest.mark.parametrize("look_up", [
    "import importlib.util; importlib.util.find_spec('foo_lib')",  # HAS_FOO = find_spec("foo_lib") at a script's top
    "import importlib.util; importlib.util.find_spec('numpy')",  # any library outside the standard library
])
def test_plugin_installed_and_a_library_looked_up_first(tmp_path, look_up):
    """With a plugin installed, a look-up of a module that is never executed (a script's ``HAS_NUMPY =
    find_spec("numpy")``) used to take the activation with it: the finder armed on that spec alone, and the
    plugin's fix stayed off for the process.  Now the first import that runs activates hotfix."""
    proc = run_python(["-c", look_up + "\n" + PROBE], pythonpath=[_library(tmp_path, True)], timeout=120)
    assert json_lines(proc.stdout) == [{"value": 11, "hotfix_loaded": True, "transformers_loaded": False}], proc.stderr
    assert hotfix_lines(proc.stderr) == [], proc.stderr


WHISPER_AFTER_LOGGING = textwrap.dedent(
    """
    import logging
    import json, sys, transformers
    from hotfix_lab.infra import tiny_models
    from hotfix_lab.infra import standalone
    compare = standalone.load("compare")  # hotfix's comparison rule, without importing hotfix
    model, batch = tiny_models.whisper(0)
    model(**batch).loss.backward(); reference = compare.collect_grads(model); model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    try:
        model(**batch).loss.backward()
        trains = compare.compare_grads(reference, compare.collect_grads(model)).ok
    except RuntimeError as exc:
        trains = compare.short_error(exc)
    registry = sys.modules.get("hotfix.registry")
    print(json.dumps({"active": bool(registry and registry.registry.active), "trains": trains}))
    """
)


def test_plugin_installed_import_logging_first_then_whisper_trains(tmp_path):
    """The issue's reproduction: a plugin installed, ``import logging`` then transformers:
    hotfix is active and Whisper with reentrant checkpointing trains with the gradients of a
    step without checkpointing (it used to crash: hotfix off)."""
    proc = run_python(["-c", WHISPER_AFTER_LOGGING], pythonpath=[_library(tmp_path, True)], timeout=300)
    assert json_lines(proc.stdout) == [{"active": True, "trains": True}], proc.stderr[-3000:]
    assert CRASH not in proc.stdout
    assert hotfix_lines(proc.stderr) == [], proc.stderr


def test_import_hotfix_first_with_a_plugin_installed(tmp_path):
    """``import hotfix`` as the first import, a plugin installed: active, the plugin applied, and
    no line (the hook used to say "a different module named 'hotfix' is already imported
    (.../site-packages/hotfix/__init__.py) ... not active")."""
    proc = run_python(["-c", "import hotfix\n" + PROBE], pythonpath=[_library(tmp_path, True)], timeout=120)
    assert json_lines(proc.stdout) == [{"value": 11, "hotfix_loaded": True, "transformers_loaded": False}], proc.stderr
    assert hotfix_lines(proc.stderr) == [], proc.stderr


def test_a_foreign_hotfix_imported_first_is_named(tmp_path):
    """A user's own ``hotfix.py`` imported first, a plugin installed: that one is really a
    different module, and the one line says so; hotfix-checkpoint stays off, the program runs."""
    library = tmp_path / "library"
    library.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "hotfix.py").write_text("MINE = True\n")
    proc = run_python(["-c", "import hotfix\n" + PROBE], cwd=project, pythonpath=[_library(library, True)],
                      timeout=120)
    assert json_lines(proc.stdout) == [{"value": 1, "hotfix_loaded": False, "transformers_loaded": False}], proc.stderr
    lines = hotfix_lines(proc.stderr)
    assert len(lines) == 1 and "a different module named 'hotfix' is already imported" in lines[0], proc.stderr
    assert str(project / "hotfix.py") in lines[0], lines


# --------------------------------------------------------------------------- the fix's own module imported first
FIX_FIRST = textwrap.dedent(
    """
    import io, json, sys
    import foo_fix  # imports hotfix at its top: hotfix activates while foo_fix is half made
    import foo_lib.layers
    import hotfix, hotfix.cli
    from hotfix.registry import registry
    status = io.StringIO()
    hotfix.cli.status(import_targets=False, out=status)
    print(json.dumps({"value": foo_lib.layers.value,
                      "status": [line.strip() for line in status.getvalue().splitlines() if "foo-layers-fix" in line],
                      "errors": list(registry.load_errors.values())}))
    hotfix.revert(); hotfix.activate()
    print(json.dumps({"again": foo_lib.layers.value}))
    """
)
#: what the probe prints when the fix was loaded once its module's import finished (in every install mode)
LOADED = [{"value": 11, "status": ["foo-layers-fix: APPLIED to foo_lib.layers  (from foo-fix)"], "errors": []},
          {"again": 11}]


@pytest.mark.parametrize("mode", ["start-up hook", "pip install --target", "checkout"])
def test_a_fix_module_imported_before_hotfix_is_loaded_once_its_import_finished(tmp_path, mode):
    """Issue 40, defect 1: the README's fix module (``from hotfix import Patch`` at its top) imported first.
    Activation ran while it was half made: "partially initialized module 'foo_fix' has no attribute 'patch'",
    and the fix was never loaded in that process, not even after ``hotfix.revert(); hotfix.activate()``.  Now it
    is loaded once its import has finished, applied, and ``hotfix status`` shows it: with the start-up hook, with
    hotfix in a ``--target`` folder (no hook; ``python -S``), and from a source checkout."""
    from conftest import REPO, dependencies

    (tmp_path / "library").mkdir()
    library = _library(tmp_path / "library", True)
    args, path = ["-c", FIX_FIRST], [library]
    if mode == "pip install --target":
        import zipfile

        wheel = sorted((REPO / "dist").glob("hotfix_checkpoint-*.whl"))[-1]  # scripts/test.sh built it
        target = tmp_path / "target"
        zipfile.ZipFile(wheel).extractall(target)  # a pure wheel: what pip install --target puts there
        args, path = ["-S", *args], [library, target, dependencies(tmp_path / "deps")]
    elif mode == "checkout":
        args, path = ["-S", *args], [library, REPO, dependencies(tmp_path / "deps")]
    proc = run_python(args, pythonpath=path, timeout=120)
    assert json_lines(proc.stdout) == LOADED, proc.stdout + proc.stderr[-3000:]
    assert hotfix_lines(proc.stderr) == [], proc.stderr
