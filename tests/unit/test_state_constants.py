"""hotfix/startup/state.py (shipped as ``hotfix_state``) imports nothing of hotfix, so it copies a few of the
start-up hook's names: they must be the hook's."""

from __future__ import annotations

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
