"""Patches follow ``importlib.reload`` of their target module.

wrapt post-import hooks fire once per module name.  ``importlib.reload(m)``
re-executes ``m``'s code in the same module object, so afterwards ``m`` holds
new, unpatched objects (``transformers.modeling_layers`` a new
``GradientCheckpointingLayer`` class) and models built from them would be
unfixed.  ``importlib.reload`` is the one import path that calls
``find_spec(name, path, target)`` with the module itself as ``target``; this
finder answers only those calls, and only for the targets of hotfix's patches:
it hands back the spec the other finders give, with a loader that re-applies
the patches once the module has been re-executed.  Every ordinary import
(``target is None``) returns at the first test.  The loader proxy and the
finder loop are the start-up hook's (``hotfix.startup.hook``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Container

from hotfix.startup.hook import LoaderProxy, spec_behind, wrappable

logger = logging.getLogger("hotfix")


class _ReapplyAfterExec(LoaderProxy):
    """Loader proxy: run the real loader, then re-apply."""

    def __init__(self, loader: Any, after: Callable[[Any], None]) -> None:
        super().__init__(loader)
        self._reapply = after

    def after(self, module: Any) -> None:
        try:
            self._reapply(module)
        except Exception as exc:  # never break the user's reload
            logger.warning("hotfix: could not re-apply patches after reloading %s: %r",
                           getattr(module, "__name__", module), exc)


class ReloadWatcher:
    """A ``sys.meta_path`` finder that only acts on ``importlib.reload`` of a target."""

    def __init__(self, targets: Callable[[], Container[str]], on_reloaded: Callable[[Any], None]) -> None:
        self._targets = targets
        self._on_reloaded = on_reloaded

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if target is None or fullname not in self._targets():
            return None
        spec = spec_behind(self, fullname, path, target)
        if wrappable(spec):
            spec.loader = _ReapplyAfterExec(spec.loader, self._on_reloaded)
        return spec


def install(targets: Callable[[], Container[str]], on_reloaded: Callable[[Any], None]) -> ReloadWatcher:
    """Put one watcher at the front of ``sys.meta_path`` (once per process)."""
    for finder in sys.meta_path:
        if isinstance(finder, ReloadWatcher):
            return finder
    watcher = ReloadWatcher(targets, on_reloaded)
    sys.meta_path.insert(0, watcher)
    return watcher
