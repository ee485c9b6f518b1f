"""Which patches exist, and attaching them to their targets' imports.

Patches are discovered through the ``hotfix.patches`` entry-point group, so a
third-party package can ship its own fixes by declaring, in its pyproject::

    [project.entry-points."hotfix.patches"]
    my-fix = "my_pkg.my_fix:patch"        # a Patch instance (or a Patch subclass)

The distribution that declared each fix is recorded (``hotfix status`` shows
it).  A source checkout run without installing it has no metadata at all: there
hotfix-checkpoint's own fixes are found by the rule its pyproject table follows
(``built_in_fixes``; a test holds the two equal).

Each patch is attached with a post-import hook on every module in its
``targets`` (``hotfix.startup.post_import``: wrapt's, waiting for an import in
flight): the hook runs at once if the module is already imported (a notebook
that imported transformers before hotfix), once its import has finished where
it is being imported, and otherwise right after the module's first import.
wrapt cannot unregister a hook, so the hook asks the registry whether it is
still active before applying.  A fix whose own module is being imported when
hotfix activates (it imports hotfix at its top) is loaded once that import has
finished.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from importlib import metadata
from typing import Any, Dict, List, Optional, Tuple


from hotfix.config import DISABLED_PATCHES_VAR, Settings, normalize_patch_name, read_settings
from hotfix import relations
from hotfix.startup import post_import, reload_watch
from hotfix.startup.hook import stop_watching_torch
from hotfix.notice import attach_stderr_handler
from hotfix.patch import Patch
from hotfix.startup.hook import DISTRIBUTION, ENTRY_POINT_GROUP, is_third_party

logger = logging.getLogger("hotfix")


def declared_fixes() -> Dict[str, Tuple[str, Optional[str]]]:
    """``entry point name -> (module:attr, distribution name)`` of the group; the first declaration of a name wins."""
    try:
        selected = [(ep, getattr(getattr(ep, "dist", None), "name", None))
                    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    except TypeError:  # Python 3.9: no selection API and no ep.dist
        selected = [(ep, dist.metadata["Name"]) for dist in metadata.distributions()
                    for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    found: Dict[str, Tuple[str, Optional[str]]] = {}
    for ep, distribution in selected:
        found.setdefault(ep.name, (ep.value, distribution))
    if all(is_third_party(distribution) for _, distribution in selected):
        # hotfix-checkpoint itself is not installed here: a checkout run from its root (`python -m hotfix`)
        for name, value in built_in_fixes().items():
            found.setdefault(name, (value, DISTRIBUTION))
    return found


def built_in_fixes() -> Dict[str, str]:
    """hotfix-checkpoint's own fixes, ``name -> module:attr``, by the rule of pyproject's table.

    Each public module of ``hotfix.patches`` is one fix, named as the module with ``-`` for
    ``_``, its Patch the module's ``patch``.  Only where no metadata declares them
    (``declared_fixes``); tests/e2e/test_packaging.py checks the rule yields pyproject's table.
    """
    import importlib
    import pkgutil

    package = importlib.import_module(f"{__package__}.patches")
    return {info.name.replace("_", "-"): f"{package.__name__}.{info.name}:patch"
            for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")}


def _fix_kind(name: str, value: str, distribution: Optional[str]) -> str:
    """How a log line names a fix: hotfix's own, or another distribution's."""
    if not is_third_party(distribution):
        return f"fix {name!r} ({value})"
    return f"third-party fix {name!r} ({value}) from distribution {distribution or 'unknown'}"


def _module_in_flight(value: str) -> Optional[str]:
    """The outermost module of an entry point's ``module:attr`` (the module or a package above it) whose import
    is in flight, or None: loading the fix now would read a half-made module.  hotfix itself is always in flight
    when it activates (the last line of its ``__init__``), with every name a fix imports from it defined: its own
    fixes (``hotfix.patches``) load at once."""
    parts = value.partition(":")[0].strip().split(".")
    return next((name for name in (".".join(parts[:i + 1]) for i in range(len(parts)))
                 if parts[0] != "hotfix" and post_import.in_flight(name)), None)


def _load_entry_point(name: str, value: str) -> Optional[Patch]:
    loaded = metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP).load()
    patch = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(patch, Patch):
        raise TypeError(f"{value} is a {type(patch).__name__}, not a hotfix.Patch")
    if not patch.name:
        raise TypeError(f"{value} has no name")
    return patch


class Registry:
    """The one registry of a process: discovery, activation state, opt-outs."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._patches: Optional[Dict[str, Patch]] = None
        self._hooked: set = set()
        self.active = False
        self.settings = Settings()
        self.load_errors: Dict[str, str] = {}  # entry point name -> "<how the fix is named>: <error>"
        self.sources: Dict[str, Optional[str]] = {}  # patch key -> the distribution that declared it
        self.waiting: Dict[str, str] = {}  # entry point name -> "<how the fix is named>: loads once ..."

    # -- discovery ----------------------------------------------------------
    def patches(self) -> Dict[str, Patch]:
        """All loadable patches by name (discovered once per process; a fix whose module is still being
        imported joins them once that import has finished: ``waiting``)."""
        with self._lock:
            if self._patches is None:
                self._patches = {}
                try:
                    declared = declared_fixes()
                except Exception as exc:
                    logger.warning("hotfix: could not read entry points of %s: %r", ENTRY_POINT_GROUP, exc)
                    declared = {}
                for ep_name, (value, distribution) in sorted(declared.items()):
                    importing = _module_in_flight(value)
                    if importing is None:
                        self._load(ep_name, value, distribution)
                        continue
                    # Its module imports hotfix at its top and is half made now: load it once that import has
                    # finished (whether it succeeded or not).
                    self.waiting[ep_name] = f"{_fix_kind(ep_name, value, distribution)}: loads once {importing} " \
                                            "has finished importing"
                    late = functools.partial(self._load_late, ep_name, value, distribution)
                    post_import.when_imported(importing, late, failed=late)
            return self._patches

    def _load(self, ep_name: str, value: str, distribution: Optional[str]) -> Optional[Patch]:
        try:
            patch = _load_entry_point(ep_name, value)
        except Exception as exc:
            self.load_errors[ep_name] = f"{_fix_kind(ep_name, value, distribution)}: {exc!r}"
            logger.warning("hotfix: %s could not be loaded and is skipped: %r",
                           _fix_kind(ep_name, value, distribution), exc)
            return None
        key = normalize_patch_name(patch.name)
        if key in self._patches:
            logger.warning("hotfix: two patches are named %r; keeping the first (%s)", key, value)
            return None
        self._patches[key] = patch
        self.sources[key] = distribution
        return patch

    def _load_late(self, ep_name: str, value: str, distribution: Optional[str], _finished: Any = None) -> None:
        """A fix whose module was being imported at discovery, now finished (``_finished``: that module, or its name
        where its import failed): load it, and attach it if active."""
        with self._lock:
            self.waiting.pop(ep_name, None)
            patch = self._load(ep_name, value, distribution)
            if patch is None:
                return
            relations.bind(self._patches)
            if self.active and not self.is_opted_out(patch):
                for target in patch.targets:
                    self._attach(normalize_patch_name(patch.name), patch, target)

    # -- activation ---------------------------------------------------------
    def is_opted_out(self, patch: Patch) -> bool:
        names = {normalize_patch_name(name) for name in (patch.name, *patch.aliases)}
        return bool(names & self.settings.disabled_patches)

    def _check_opt_out_names(self, patches: Dict[str, Patch]) -> None:
        """One warning for names no patch answers to, one per former name still in use."""
        former = {normalize_patch_name(alias): patch for patch in patches.values() for alias in patch.aliases}
        for name in sorted(self.settings.disabled_patches & set(former)):
            logger.warning("hotfix: %s names %r, the former name of %s; it still works, but use the new name",
                           DISABLED_PATCHES_VAR, name, former[name].name)
        waiting = {normalize_patch_name(name) for name in self.waiting}  # not loaded yet, named by their entry points
        unknown = sorted(self.settings.disabled_patches - set(patches) - set(former) - waiting)
        if unknown:
            logger.warning(
                "hotfix: %s names unknown patch(es) %s; known patches: %s",
                DISABLED_PATCHES_VAR, ", ".join(unknown), ", ".join(sorted(patches)) or "none",
            )

    def activate(self) -> bool:
        """Attach every patch not opted out; a second call is a no-op."""
        with self._lock:
            if self.active:
                return True
            self.settings = read_settings()
            if self.settings.log_level is not None:
                attach_stderr_handler(self.settings.log_level)  # visible without any logging setup
            if self.settings.disabled:
                logger.info("hotfix: disabled by environment; no patch attached")
                return False
            patches = self.patches()
            self._check_opt_out_names(patches)
            relations.bind(patches)  # what each fix relies on in the others, read once
            self.active = True
            stop_watching_torch()  # before any fix attaches to torch's objects
            logger.info("hotfix: active in this process (pid %d): %d fixes, each applied when its target is imported "
                        "(`import hotfix_state; print(hotfix_state.report())` says which)", os.getpid(), len(patches))
            for key, patch in patches.items():
                if self.is_opted_out(patch):
                    logger.info("hotfix: %s opted out by %s", patch.name, DISABLED_PATCHES_VAR)
                    continue
                for target in patch.targets:
                    self._attach(key, patch, target)
            return True

    def _hooked_targets(self) -> frozenset:
        return frozenset(target for _, target in self._hooked)

    def _on_reload(self, module) -> None:
        """A target module was re-executed by importlib.reload: re-apply its patches."""
        name = getattr(module, "__name__", None)
        with self._lock:
            if not self.active:
                return
            for key, patch in (self._patches or {}).items():
                if (key, name) in self._hooked and not self.is_opted_out(patch):
                    patch.apply(module, reloaded=True)

    def _attach(self, key: str, patch: Patch, target: str) -> None:
        """Apply ``patch`` to ``target`` once its import has finished (``post_import``), or now where it has."""
        if (key, target) in self._hooked:
            # The hook already exists (activate after revert): apply now if the module is loaded and whole,
            # otherwise the waiting hook will.
            module = sys.modules.get(target)
            if module is not None and not post_import.in_flight(target):
                self._on_import(patch, module)
            return
        self._hooked.add((key, target))
        # importlib.reload of a target re-creates its objects: patch them again (one watcher per process).
        reload_watch.install(self._hooked_targets, self._on_reload)

        def hook(module, patch=patch):
            self._on_import(patch, module)

        try:
            post_import.when_imported(target, hook)
        except Exception as exc:  # e.g. the target raised while importing
            logger.warning("hotfix: could not attach %s to %s: %r", patch.name, target, exc)

    def _on_import(self, patch: Patch, module) -> None:
        if self.active and not self.is_opted_out(patch):
            patch.apply(module)

    def revert(self) -> List[str]:
        """Undo every applied patch and stop applying new ones.

        Newest first: patches apply to a shared target in this registry's order, and one may
        wrap what another installed (two fixes' wrappers on ``PreTrainedModel`` enablers), so
        each must find on its objects exactly what it put there.
        """
        with self._lock:
            self.active = False
            reverted = [p.name for p in reversed(list((self._patches or {}).values())) if p.revert()]
            return reverted[::-1]


registry = Registry()
