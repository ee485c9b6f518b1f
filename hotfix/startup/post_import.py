"""Post-import hooks that run once a module's import has finished, also where that import is in flight.

wrapt's ``register_post_import_hook`` runs a hook at once for a module already in ``sys.modules``, also for
one whose body is still running: half made, without the names its body defines further down.  hotfix
activates in exactly such places: a third-party fix's module that imports hotfix at its top (``from hotfix
import Patch``) is half made when its own fix is loaded; ``axolotl.monkeypatch.gradient_checkpointing``,
importing transformers first in a process, is half made when the start-up hook activates hotfix there.
:func:`when_imported` waits for those: the import system marks a module whose import is in flight
(``module.__spec__._initializing``, which its own ``_find_and_load`` reads to tell a half-made module) and
clears the mark in ``_load_unlocked`` once the body has run, successfully or not.  Here that clearing runs
the hooks: the spec's class is, for that time, a subclass that sees the attribute set, and is put back at
once.  The hooks run in the importing thread, under the module's own import lock and outside the global one,
where wrapt's post-import hooks run too.  Any other module: wrapt's hook, unchanged.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, List, Optional, Tuple

import wrapt

logger = logging.getLogger("hotfix")

#: the spec attribute holding the hooks that wait for its import: [(hook, failed)]
_WAITING = "_hotfix_waiting_hooks"
_lock = threading.Lock()  # guards the swap of a spec's class against two threads registering at once

Hook = Callable[[Any], None]


def in_flight(name: str) -> bool:
    """Is ``name`` in ``sys.modules`` while its import has not finished (its body still running)?"""
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def when_imported(name: str, hook: Hook, failed: Optional[Callable[[str], None]] = None) -> None:
    """Call ``hook(module)`` once ``name`` is imported: at once where it is (wrapt), once its import in flight
    finishes (``failed(name)`` instead where that import raises), or after its first import (wrapt)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is not None and getattr(spec, "_initializing", False) and _wait(spec, (hook, failed)):
        return
    wrapt.register_post_import_hook(hook, name)


def _wait(spec: Any, entry: Tuple[Hook, Optional[Callable[[str], None]]]) -> bool:
    """Hold ``entry`` until the import system clears ``spec._initializing``; False where the spec cannot hold it."""
    with _lock:
        waiting: Optional[List] = vars(spec).get(_WAITING)
        if waiting is None:
            original = type(spec)
            try:
                spec.__class__ = type("ImportInFlight", (original,), {"__setattr__": _finished_when_cleared,
                                                                      "_hotfix_original": original})
            except TypeError:  # a spec class that refuses (slots, a C type): wrapt's hook, at once
                return False
            waiting = []
            object.__setattr__(spec, _WAITING, waiting)
        waiting.append(entry)
    return True


def _finished_when_cleared(spec: Any, attribute: str, value: Any) -> None:
    """``__setattr__`` of a waiting spec: the import system clearing ``_initializing`` runs the held hooks."""
    object.__setattr__(spec, attribute, value)
    if attribute != "_initializing" or value:
        return
    with _lock:
        spec.__class__ = type(spec)._hotfix_original  # no trace of hotfix left on the spec
        waiting = vars(spec).pop(_WAITING, [])
    module = sys.modules.get(spec.name)
    for hook, failed in waiting:
        try:
            if module is None:  # the import raised: the import system dropped the module
                if failed is not None:
                    failed(spec.name)
            else:
                hook(module)
        except Exception as exc:  # never break the user's import
            logger.warning("hotfix: a post-import hook for %s failed: %r", spec.name, exc)
