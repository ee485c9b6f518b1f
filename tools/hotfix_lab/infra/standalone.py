"""hotfix's self-contained diagnostics modules, loaded by file path without importing hotfix.

``hotfix/diagnostics/doctor_models.py`` and ``compare.py`` import only torch
and transformers.  A child that must start unpatched (a "without hotfix"
run, a test of auto-activation) cannot ``import hotfix.diagnostics...``: that
imports, and activates, hotfix.  It loads them here instead, by path from this
checkout (tools/ is never installed, so the checkout is always beside it; the
wheel holds the same files).  That also works where hotfix cannot be imported
at all, and beside a user's own ``hotfix/`` folder.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from hotfix_lab.infra.paths import REPO

DIAGNOSTICS = os.path.join(REPO, "hotfix", "diagnostics")


def load(name: str):
    """``hotfix/diagnostics/<name>.py`` as the top-level module ``<name>`` (loaded once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(DIAGNOSTICS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
