"""Is hotfix active in *this* process, and which fixes are applied?  Asking activates nothing.

``import hotfix`` switches hotfix on, and ``hotfix status`` runs in a process of its own, so neither can tell
whether a script that never imported hotfix got its fixes.  This module can: the wheel ships it at the root of
site-packages as ``hotfix_state`` (setup.py), it imports nothing but ``sys`` and ``os``, and it only reads what the process
already holds (``sys.modules["hotfix"]``, the start-up hook's finder in ``sys.meta_path``)::

    import hotfix_state
    print(hotfix_state.report())   # one line: active, and the fixes applied here; or why not
    hotfix_state.active()          # True / False
    hotfix_state.applied()         # {"transformers-checkpoint-layer-io": ["transformers.modeling_utils", ...], ...}

A fix is applied once its target module is imported, so ask after the imports whose fixes you want to see.
"""

import os
import sys

PACKAGE = "hotfix"
DISTRIBUTION = "hotfix-checkpoint"
TRIGGERS = ("transformers", "unsloth", "unsloth_zoo")
#: the start-up hook's finder classes, found by their names (the boot module is loaded by path): the watch that
#: stands first until the first import outside the standard library (hotfix/startup/boot.py), and the finder that
#: then takes its place (hotfix/startup/activation.py)
WATCH, FINDER = "FirstImportWatch", "ActivateOnFirstImport"
DISABLE_VAR = "HOTFIX_DISABLE"
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
# These copy boot.py's (this module imports nothing of hotfix); tests/unit/test_state_constants.py holds them equal.


def _hotfix():
    """hotfix-checkpoint's package where this process imported it, else None."""
    module = sys.modules.get(PACKAGE)
    return module if getattr(module, "DISTRIBUTION", None) == DISTRIBUTION else None


def active():
    """Are hotfix's fixes switched on in this process (each applied once its target is imported)?"""
    module = _hotfix()
    registry = getattr(getattr(module, "registry", None), "active", False)
    return bool(registry)


def applied():
    """The fixes applied in this process: {fix name: [the modules it is applied to]}."""
    module = _hotfix()
    if module is None or not active():
        return {}
    return {patch.name: list(patch.applied_targets)
            for patch in module.registry.patches().values() if patch.applied}


def _finder():
    return next((finder for finder in sys.meta_path if type(finder).__name__ in (WATCH, FINDER)), None)


def report():
    """One line: whether hotfix is active here, the fixes applied, or why it is not active."""
    module = sys.modules.get(PACKAGE)
    if module is not None and _hotfix() is None:
        return ("hotfix is NOT active in this process: a different module named 'hotfix' is imported (%s)"
                % (getattr(module, "__file__", None) or module,))
    if active():
        fixes = applied()
        names = ", ".join(sorted(fixes)) if fixes else "none yet (each applies when its target module is imported)"
        return "hotfix is active in this process (pid %s); fixes applied: %s" % (os.getpid(), names)
    if module is not None:
        return ("hotfix is imported but NOT active in this process (HOTFIX_DISABLE is set, or hotfix.revert() "
                "was called)")
    if os.environ.get(DISABLE_VAR, "").strip().lower() in TRUE_VALUES:
        return "hotfix is NOT active in this process: %s=%s" % (DISABLE_VAR, os.environ[DISABLE_VAR])
    finder = _finder()
    if finder is None:
        return ("hotfix is NOT active in this process: its start-up finder is not in sys.meta_path (no start-up "
                "hook ran here: not installed in this environment's site-packages, `pip install --target`, "
                "python -S; or something removed it); add `import hotfix` at the top of the script")
    loaded = [name for name in TRIGGERS if sys.modules.get(name) is not None]
    if getattr(finder, "finished", False):
        return ("hotfix is NOT active in this process: its activation failed (a 'hotfix:' line on stderr says "
                "why)")
    if loaded:
        return ("hotfix is NOT active in this process yet: %s was imported past its start-up finder; the next "
                "import activates it, or `import hotfix` now" % ", ".join(loaded))
    return ("hotfix is not active in this process yet: its start-up hook activates it at the first import of %s"
            % (", ".join(TRIGGERS[:-1]) + " or " + TRIGGERS[-1]))
