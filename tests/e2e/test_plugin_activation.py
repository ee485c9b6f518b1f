"""Auto-activation follows third-party fixes whose targets lie outside transformers/unsloth.

The start-up hook activates hotfix on the first import of transformers,
unsloth or unsloth_zoo.  A plugin fix targeting another library (the README's
``foo.layers``) used to be applied only in processes that also imported one
of those.  Now, when an installed distribution other than hotfix-checkpoint
declares the ``hotfix.patches`` entry-point group, the first top-level import
of a process activates hotfix (boot/_hotfix_boot.py); without such a
distribution nothing changes.
"""

from __future__ import annotations

import textwrap

from conftest import json_lines, run_python

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
