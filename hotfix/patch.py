"""The contract every fix follows: its lifecycle, and the checks that surround it.

A concrete fix (one module in ``patches/``) subclasses :class:`Patch`, fills in the declarations
(``hotfix.declarations``) and writes only ``_apply(module)``.  It changes its target through
:meth:`Patch.replace` / :meth:`Patch.wrap`, which record the original object in its ledger
(``hotfix.ledger``), so that revert puts back exactly what was there (``is``-identical).  The
public :meth:`apply` / :meth:`revert` own everything else, as OpenTelemetry's ``BaseInstrumentor``
does: the version gate (``hotfix.gate``), the drift check, "already applied", rollback of a failed
apply, and turning any failure into one log line instead of an exception in the user's program.
What a fix relies on in other fixes is bound by the registry at activation (``hotfix.relations``).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hotfix import gate, junction, relations
from hotfix.declarations import Lost, Mechanism, Verdict, declaration_problems
from hotfix.gate import check_range
from hotfix.ledger import Ledger, Undo
from hotfix.notice import repair_notice
from hotfix.versions import reader

__all__ = ["Lost", "Mechanism", "Patch", "Verdict", "check_range"]

logger = logging.getLogger("hotfix")

_UNREAD = object()  # declarations not read yet


class Patch:
    """One fix: what it targets, where it is needed, and how to apply it."""

    #: short, stable, dash-separated; used by HOTFIX_DISABLED_PATCHES
    name: str = ""
    #: former names, still accepted by HOTFIX_DISABLED_PATCHES (with a deprecation warning)
    aliases: Tuple[str, ...] = ()
    #: modules whose import triggers ``_apply(module)`` (once per module)
    targets: Tuple[str, ...] = ()
    #: distribution -> PEP 440 specifier set; every entry must match.  Optional where
    #: ``mechanisms`` are declared: the patch then belongs wherever one of them does.
    affected: Mapping[str, str] = {}
    #: the mechanisms it repairs, each with its own affected range (data; see Mechanism)
    mechanisms: Tuple[Mechanism, ...] = ()
    #: one line a user would recognise (the error text they search for)
    symptom: str = ""
    #: optional: which models / call shapes it covers and how (``hotfix status`` "covers:")
    details: str = ""
    #: upstream issue / PR that introduced or tracks the bug
    upstream: str = ""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._applied_targets: List[str] = []
        self.ledger = Ledger()
        self._warned: set = set()
        self._declaration_error: Any = _UNREAD
        self._relied: Optional[Dict[str, Tuple[Any, ...]]] = None
        self.last_error: Optional[str] = None
        self._built: Any = _UNREAD  # build_wrapper()'s result, once it is asked for
        self.declaration_error()  # read once, when the fix is loaded (its module makes this object)

    # -- what a concrete patch writes ------------------------------------
    def _apply(self, module: Any) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        """Undo every recorded replacement, newest first."""
        self.ledger.undo()

    def build_wrapper(self) -> Any:
        """What this fix puts around its targets' attributes: a wrapt wrapper ``(wrapped, instance, args, kwargs)``,
        or a tuple of them.  Built once, at the first read of :attr:`wrapper` (in ``_apply``: the fix's target has
        imported what the wrapper binds, torch; loading the fix imports none), kept across revert and re-apply."""
        raise NotImplementedError(f"{type(self).__name__} builds no wrapper")

    @property
    def wrapper(self) -> Any:
        """This fix's wrapper (:meth:`build_wrapper`), built at the first read."""
        if self._built is _UNREAD:
            self._built = self.build_wrapper()
        return self._built

    def drift(self, module: Any) -> Optional[str]:
        """Why ``module`` no longer looks like what this patch was written for.

        Returns None when the target matches.  Override to check the symbols
        and shapes ``_apply`` relies on.
        """
        return None

    # -- tools for ``_apply`` --------------------------------------------
    def replace(self, owner: Any, attribute: str, new: Any) -> Any:
        """Set ``owner.attribute = new``, remembering what to restore (``hotfix.ledger``).

        If ``owner.attribute`` is already what this patch installed there, it
        is left alone (and returned): a patch is never stacked on itself.
        """
        return self.ledger.replace(owner, attribute, new)

    def wrap(self, owner: Any, attribute: str, wrapper: Callable) -> Any:
        """Wrap ``owner.attribute`` with a wrapt ``FunctionWrapper`` set on ``owner`` itself (``Ledger.wrap``)."""
        return self.ledger.wrap(owner, attribute, wrapper)

    def join(self, owner: Any, attribute: str, hook: Callable) -> Any:
        """Run ``hook`` (a wrapt wrapper) in the one wrapper that every fix wrapping ``owner.attribute`` shares, at
        this fix's place in ``relations.JOIN_ORDER`` (``hotfix.junction``); its revert takes out this hook only."""
        present = owner.__dict__.get(attribute) if hasattr(owner, "__dict__") else None
        new = junction.joined(owner, attribute, self.name, hook, relations.join_rank)
        if new is present:
            return new
        # its revert takes out this fix's hook only, whatever joined after it (junction.leave)
        return self.ledger.replace(owner, attribute, new, Undo(lambda: junction.leave(owner, attribute, self.name)))

    def installed(self, value: Any) -> bool:
        """Is ``value`` an object this fix put in place (and has not taken back)?"""
        return self.ledger.installed(value)

    def repaired(self, what: str, call: Optional[str] = None) -> None:
        """Tell the user, once per fix and job, that this fix repaired a call (``hotfix.notice``).

        Call it only where the same run without hotfix would have been wrong (crashed, or a
        gradient missing or different): the line says "repaired" and names this fix.  ``call``:
        what was repaired, when not "a checkpointed call".  Cheap after the first time (a set
        lookup), and silent while torch.compile traces: a write to stderr there would be a graph break.
        """
        if self.name in repair_notice.said:
            return
        torch = sys.modules.get("torch")
        if torch is not None and torch.compiler.is_compiling():
            return
        repair_notice.say(self.name, what, self.upstream, call)

    def warn_once(self, key: Any, message: str) -> None:
        """One warning line per ``key`` for the life of this patch object (a case it cannot repair, say)."""
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning("hotfix: %s: %s", self.name, message)

    # -- what it relies on in other fixes (bound by the registry) -----------
    def bind_reliances(self, relied: Mapping[str, Tuple[Any, ...]]) -> None:
        """The fixes this one relies on, by where it relies on them (``hotfix.relations.bind``, at activation)."""
        self._relied = dict(relied)

    def relied_on(self, where: str) -> Tuple[Any, ...]:
        """The fixes this one relies on at ``where`` (a ``hotfix.relations`` key); each has ``name``, ``applied``,
        ``targets`` and ``installed()``.  Not bound by a registry: every one of them counts as not applied."""
        if self._relied is None:
            self._relied = relations.unbound(self.name)
        return self._relied.get(where, ())

    # -- public API (owns the checks) -----------------------------------
    def declaration_error(self) -> Optional[str]:
        """Why this fix's declarations cannot be read (the fix is then never applied), or None.

        Read once, when the object is made (the declarations are class attributes); said once, as a warning.
        """
        if self._declaration_error is _UNREAD:
            error = declaration_problems(self)
            self._declaration_error = error
            if error:
                self.warn_once(error, f"{error}; not applied")
        return self._declaration_error

    def check(self) -> Verdict:
        """Does this patch belong here?  Decided from the installed versions (``hotfix.gate``).

        Where no version parses, the version cannot rule the patch out: the verdict says so and
        :meth:`apply` lets the drift check, which reads the target's actual code, decide.
        A declaration that cannot be read never applies (:meth:`declaration_error`).
        """
        error = self.declaration_error()
        return Verdict(False, error) if error else gate.verdict(self)

    def mechanisms_here(self) -> Tuple[Mechanism, ...]:
        """The declared mechanisms whose affected range holds the installed versions."""
        return () if self.declaration_error() else gate.mechanisms_here(self)

    def uncovered_here(self, model_type: Optional[str] = None) -> Optional[str]:
        """Why this fix does not repair here what the installed versions may have (for ``model_type``, where given),
        or None (``gate.uncovered_here``)."""
        return None if self.declaration_error() else gate.uncovered_here(self, model_type)

    @property
    def distributions(self) -> Tuple[str, ...]:
        """Every distribution a range of this patch names (none where its declarations cannot be read)."""
        return () if self.declaration_error() else gate.distributions(self)

    @property
    def fixed_in(self) -> Optional[str]:
        """The first upstream release with the fix, or None when there is none: the latest ``fixed_in`` of the
        mechanisms where each names one (a fix may declare it instead, as a class attribute)."""
        return None if self.declaration_error() else gate.fixed_in(self)

    @property
    def applied(self) -> bool:
        return bool(self._applied_targets)

    @property
    def applied_targets(self) -> Tuple[str, ...]:
        return tuple(self._applied_targets)

    def apply(self, module: Any, *, reloaded: bool = False) -> bool:
        """Apply to the freshly imported ``module`` if it belongs; never raises.

        ``reloaded``: ``module`` was re-executed by ``importlib.reload``, so it
        holds new objects to patch even if it was patched before.  The undo
        records of the earlier objects are kept: ``revert()`` restores both.
        """
        name = getattr(module, "__name__", repr(module))
        with self._lock:
            if name in self._applied_targets:
                if not reloaded:
                    return True
                self._applied_targets.remove(name)
            for dist in self.distributions:
                reader.warn_once(reader.evidence(dist))  # odd or disagreeing versions: one line per library
            verdict = self.check()
            if not verdict.applies:
                logger.debug("hotfix: %s not applied: %s", self.name, verdict.reason)
                return False
            try:
                reason = self.drift(module)
            except Exception as exc:  # a drift check that breaks is drift too
                reason = f"drift check failed: {exc!r}"
            if reason:
                self.last_error = f"skipped, target changed: {reason}"
                logger.warning("hotfix: patch %s skipped: %s doesn't match: %s", self.name, name, reason)
                return False
            mark = self.ledger.mark()
            try:
                self._apply(module)
            except Exception as exc:
                try:
                    self.ledger.rollback_to(mark)  # what the failed _apply changed before it raised
                except Exception:
                    pass
                self.last_error = f"apply failed: {exc!r}"
                logger.warning("hotfix: patch %s failed to apply to %s and was skipped: %r", self.name, name, exc)
                return False
            self._applied_targets.append(name)
            self.last_error = None
            if reloaded:
                logger.info("hotfix: re-applied %s to %s after importlib.reload (%s)", self.name, name, verdict.reason)
            else:
                logger.info("hotfix: applied %s to %s (%s)", self.name, name, verdict.reason)
            return True

    def revert(self) -> bool:
        """Restore every original object; never raises.  True if anything was undone."""
        with self._lock:
            if not self._applied_targets and not len(self.ledger):
                return False
            try:
                self._revert()
            except Exception as exc:
                self.last_error = f"revert failed: {exc!r}"
                logger.warning("hotfix: patch %s failed to revert: %r", self.name, exc)
                return False
            self._applied_targets.clear()
            logger.info("hotfix: reverted %s", self.name)
            return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} applied={self.applied}>"
