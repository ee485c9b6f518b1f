"""hotfix/startup/state.py (shipped as ``hotfix_state``) imports nothing of hotfix, so it copies a few of the
start-up hook's names: they must be the hook's."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from hotfix.startup.hook import BOOT as boot



def test_state_reads_the_names_the_start_up_hook_defines():
    import hotfix

    path = Path(hotfix.__file__).resolve().parent / "startup" / "state.py"
    spec = importlib.util.spec_from_file_location("state_under_test", path)
    state = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(state)
    assert state.PACKAGE == boot.PACKAGE and state.DISTRIBUTION == boot.DISTRIBUTION
    assert frozenset(state.TRIGGERS) == boot.TRIGGERS
    assert state.FINDER == boot.ActivateOnFirstImport.__name__ and state.WATCH == boot.FirstImportWatch.__name__
    assert state.DISABLE_VAR == boot.DISABLE_VAR and state.TRUE_VALUES == boot.TRUE_VALUES


def _names_taken_from_boot(source: str) -> list:
    """The names activation.py takes from the boot module: its (compiled-away) import from hotfix.startup.boot."""
    return [alias.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module == "hotfix.startup.boot" for alias in node.names]


def test_second_half_reads_only_names_the_first_half_defines():
    """hotfix/startup/activation.py runs in the boot module's namespace: each name it takes from there (its import
    from hotfix.startup.boot, which never runs) is boot.py's own, defined before the second half runs (a fresh load
    by path, not completed)."""
    import hotfix

    startup = Path(hotfix.__file__).resolve().parent / "startup"
    spec = importlib.util.spec_from_file_location("boot_under_test", startup / "boot.py")
    first = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first)
    assert not hasattr(first, "ActivateOnFirstImport")
    names = _names_taken_from_boot((startup / "activation.py").read_text())
    missing = [name for name in names if not hasattr(first, name)]
    assert names and missing == [], missing
    first.complete(str(startup.parent.parent))
    assert isinstance(first.ActivateOnFirstImport, type) and first.ActivateOnFirstImport.__module__ == "boot_under_test"
