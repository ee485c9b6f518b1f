"""Activation: the one module that attaches hotfix's fixes to their targets.

Importing it activates hotfix unless ``HOTFIX_DISABLE`` is set, and never
raises: a failure is one log line and the user's program goes on unpatched.
It is imported by ``hotfix/__init__.py`` (so ``import hotfix`` activates) and
so reached by the start-up hook too; ``import hotfix.auto`` is the explicit
spelling for a ``sitecustomize.py``.  Activation itself only registers wrapt
post-import hooks: each fix is applied when its target module is imported, or
at once when it already is.
"""

from __future__ import annotations

import logging

from hotfix.registry import registry


def activate_safely() -> bool:
    """``registry.activate()``, turning any failure into one warning (hotfix must never break an import)."""
    try:
        return registry.activate()
    except Exception as exc:
        logging.getLogger("hotfix").warning("hotfix: activation failed, continuing without it: %r", exc)
        return False


activate_safely()
