"""The contract every fix follows, and the checks that surround it.

A concrete fix (one module in ``patches/``) subclasses :class:`Patch`, fills in
the declarations and writes only ``_apply(module)``.  It changes its target
through :meth:`Patch.replace` / :meth:`Patch.wrap`, which record the original
object so that the default ``_revert()`` puts back exactly what was there
(``is``-identical).  The public :meth:`apply` / :meth:`revert` own everything
else, as OpenTelemetry's ``BaseInstrumentor`` does: version gate, drift check,
"already applied", and turning any failure into one log line instead of an
exception in the user's program.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import wrapt
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from hotfix.notice import repair_notice
from hotfix.versions import reader, version_in_range

logger = logging.getLogger("hotfix")

_ABSENT = object()  # marks an attribute the owner did not define itself


@dataclass(frozen=True)
class Verdict:
    """Whether a patch belongs on this machine, and the sentence saying why."""

    applies: bool
    reason: str


@dataclass(frozen=True)
class Mechanism:
    """One way a fix's bug shows, and the releases that have it: declared data, read without importing torch.

    ``affected`` maps each distribution to a PEP 440 specifier set (every entry
    must match); ``fixed_in`` is the first release without it (None: none yet).
    ``unreached`` (same form) names releases that have, or may have, the
    mechanism but that the fix does not act on (older than the code it hooks, or
    than the releases hotfix supports): ``hotfix status`` says "NOT COVERED"
    there, never "not needed".  ``lost`` (:class:`Lost`, each with its reason) names
    releases where upstream drops the mechanism's state before any checkpoint
    function sees it, so that the fix, applied, cannot restore it: NOT COVERED there
    too.  The census (tools/census/) measures every release line against these.
    """

    name: str
    affected: Mapping[str, str] = field(default_factory=dict)
    fixed_in: Optional[str] = None
    summary: str = ""
    unreached: Mapping[str, str] = field(default_factory=dict)
    lost: Tuple["Lost", ...] = ()


@dataclass(frozen=True)
class Lost:
    """Releases where upstream drops a mechanism's state before any checkpoint function sees it (the fix, applied,
    cannot restore it): ``hotfix status`` and ``hotfix doctor`` say "NOT COVERED" there, with ``reason``."""

    affected: Mapping[str, str]  # distribution -> PEP 440 specifier set, every entry (as Mechanism.affected)
    reason: str  # what is dropped, where, and the upstream issue
    # the models whose state is dropped (transformers' config.model_type), () for any: where two declarations hold
    # one release, the census names the one of the model it measured (hotfix status, not knowing the model, says both)
    model_types: Tuple[str, ...] = ()  # a list reads the same


def _range_problems(ranges: Any, where: str) -> List[str]:
    """Why ``ranges`` (distribution -> PEP 440 specifier set) cannot be read, one phrase per entry; [] when it can."""
    if not isinstance(ranges, Mapping):
        return [f"{where} is a {type(ranges).__name__}, not a mapping of distribution to specifier set"]
    problems = []
    for dist, spec in ranges.items():
        if not isinstance(dist, str) or not dist:
            problems.append(f"{where} names the distribution {dist!r}, not a distribution name")
            continue
        if not _is_specifier_set(spec):
            problems.append(f"{where} range of {dist} {spec!r} is not a PEP 440 specifier set")
    return problems


def _lost_problems(mechanism: Mechanism) -> List[str]:
    """Why ``mechanism.lost`` cannot be read, one phrase each; [] when it can."""
    where = f"mechanism {mechanism.name!r}: lost"
    if not isinstance(mechanism.lost, (tuple, list)):
        return [f"{where} is a {type(mechanism.lost).__name__}, not a tuple of hotfix.Lost"]
    problems = []
    for index, lost in enumerate(mechanism.lost):
        if not isinstance(lost, Lost):
            problems.append(f"{where}[{index}] is a {type(lost).__name__}, not a hotfix.Lost")
            continue
        problems += _range_problems(lost.affected, f"{where}[{index}]")
        if not lost.affected or not isinstance(lost.reason, str) or not lost.reason:
            problems.append(f"{where}[{index}] needs a range and a reason")
        if not isinstance(lost.model_types, (tuple, list)) or not all(isinstance(t, str) and t for t in lost.model_types):
            problems.append(f"{where}[{index}] model_types is {lost.model_types!r}, not a tuple of model type names")
    return problems


def _is_specifier_set(spec: Any) -> bool:
    """A string that parses as a specifier set (a list some packaging releases accept is not the declared form)."""
    if not isinstance(spec, str):
        return False
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        return False
    return True


def check_range(affected: Mapping[str, str]) -> Verdict:
    """Are the installed versions inside ``affected`` (distribution -> specifier set, every entry)?"""
    parts, unknown = [], []
    for dist, spec in affected.items():
        evidence = reader.evidence(dist)
        if not evidence.found:
            return Verdict(False, f"{dist} is not installed")
        version = evidence.version
        note = f" ({evidence.problem()})" if evidence.problem() else ""
        if version is None:
            unknown.append(f"{dist} version unknown{note}")
            continue
        inside = version_in_range(version, spec)
        if inside is None:
            return Verdict(False, f"the affected range {spec!r} of {dist} is not a valid specifier")
        if not inside:
            return Verdict(False, f"{dist} {version} is outside the affected range {spec}{note}")
        parts.append(f"{dist} {version} is in the affected range {spec}{note}")
    if unknown:
        parts.append("; ".join(unknown) + ": applied where the target's code has the affected shape (drift check)")
    return Verdict(True, "; ".join(parts) or "no version constraint")


def _installed(ranges: Mapping[str, str]) -> str:
    """The installed version of each distribution ``ranges`` names, as one phrase ("transformers 5.5.1")."""
    return ", ".join(f"{dist} {reader.evidence(dist).version}" for dist in ranges)


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
    #: first upstream release with the fix, or None when there is none
    fixed_in: Optional[str] = None

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._applied_targets: List[str] = []
        self._undo: List[Tuple[Any, str, Any]] = []
        # (id(owner), attribute) -> the object replace() put there, so that
        # applying again to the same objects (importlib.reload of a target
        # that re-imports unchanged objects) never wraps a wrapper.
        self._installed: Dict[Tuple[int, str], Any] = {}
        self._warned: set = set()
        self.last_error: Optional[str] = None
        # Said when the fix is loaded (its module creates this object), not first when its target is imported;
        # a declaration a subclass completes after this call is read again by check().
        try:
            self.declaration_error()
        except Exception:
            pass

    # -- what a concrete patch writes ------------------------------------
    def _apply(self, module: Any) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        """Undo every recorded replacement, newest first."""
        while self._undo:
            owner, attribute, original = self._undo.pop()
            if original is _ABSENT:
                try:
                    delattr(owner, attribute)
                except AttributeError:
                    pass
            else:
                setattr(owner, attribute, original)

    def drift(self, module: Any) -> Optional[str]:
        """Why ``module`` no longer looks like what this patch was written for.

        Returns None when the target matches.  Override to check the symbols
        and shapes ``_apply`` relies on.
        """
        return None

    # -- tools for ``_apply`` --------------------------------------------
    def replace(self, owner: Any, attribute: str, new: Any) -> Any:
        """Set ``owner.attribute = new``, remembering what to restore.

        If ``owner.attribute`` is already what this patch installed there, it
        is left alone (and returned): a patch is never stacked on itself.
        """
        original = owner.__dict__.get(attribute, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
        key = (id(owner), attribute)
        if original is not _ABSENT and self._installed.get(key, _ABSENT) is original:
            return original
        setattr(owner, attribute, new)
        self._undo.append((owner, attribute, original))
        self._installed[key] = new
        return new

    def wrap(self, owner: Any, attribute: str, wrapper: Callable) -> Any:
        """Wrap ``owner.attribute`` with a wrapt ``FunctionWrapper``, set on ``owner`` itself.

        The original comes from wrapt's ``resolve_path``, which looks a class
        attribute up in the ``__dict__`` along the MRO instead of binding it:
        a ``classmethod``/``staticmethod`` (even an inherited one) is wrapped
        as the descriptor it is, so it binds per call like the original.
        """
        _, _, original = wrapt.resolve_path(owner, attribute)
        return self.replace(owner, attribute, wrapt.FunctionWrapper(original, wrapper))

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

    # -- public API (owns the checks) -----------------------------------
    def declaration_error(self) -> Optional[str]:
        """Why this fix's declarations cannot be read (the fix is then never applied), or None.

        A range that does not parse would otherwise read as "outside the range": the fix silently
        never applies and ``hotfix status`` says "not needed here".  Said once, as a warning.
        """
        problems: List[str] = []
        if not isinstance(self.targets, (tuple, list)) or not all(isinstance(t, str) and t for t in self.targets):
            problems.append(f"targets {self.targets!r} is not a tuple of module names")
        if self.affected or not isinstance(self.affected, Mapping):
            problems += _range_problems(self.affected, "affected")
        if isinstance(self.mechanisms, Mechanism):  # the trailing comma of (Mechanism(...),) forgotten
            problems.append(f"mechanisms is the Mechanism {self.mechanisms.name!r} alone, not a tuple of them")
        elif not isinstance(self.mechanisms, (tuple, list)):
            problems.append(f"mechanisms is a {type(self.mechanisms).__name__}, not a tuple of hotfix.Mechanism")
        else:
            for index, mechanism in enumerate(self.mechanisms):
                if not isinstance(mechanism, Mechanism):
                    problems.append(f"mechanisms[{index}] is a {type(mechanism).__name__}, not a hotfix.Mechanism")
                    continue
                problems += _range_problems(mechanism.affected, f"mechanism {mechanism.name!r}: affected")
                problems += _range_problems(mechanism.unreached, f"mechanism {mechanism.name!r}: unreached")
                problems += _lost_problems(mechanism)
        if not problems:
            return None
        error = "invalid declaration: " + "; ".join(problems)
        self.warn_once(error, f"{error}; not applied")
        return error

    def check(self) -> Verdict:
        """Does this patch belong here?  Decided from the installed versions.

        With ``mechanisms`` declared, it belongs where any of them is in range
        (the verdict names them); otherwise ``affected`` decides.  Each version
        comes from the metadata and the imported module's ``__version__``
        (``hotfix.versions``).  Where neither gives one that parses, the version
        cannot rule the patch out: the verdict says so and :meth:`apply` lets
        the drift check, which reads the target's actual code, decide.
        A declaration that cannot be read never applies (:meth:`declaration_error`).
        """
        error = self.declaration_error()
        if error:
            return Verdict(False, error)
        if not self.mechanisms:
            return check_range(self.affected)
        verdicts = [(mechanism.name, check_range(mechanism.affected)) for mechanism in self.mechanisms]
        inside = [f"{name}: {verdict.reason}" for name, verdict in verdicts if verdict.applies]
        if inside:
            return Verdict(True, "; ".join(inside))
        return Verdict(False, "; ".join(f"{name}: {verdict.reason}" for name, verdict in verdicts))

    def mechanisms_here(self) -> Tuple[Mechanism, ...]:
        """The declared mechanisms whose affected range holds the installed versions."""
        if self.declaration_error():
            return ()
        return tuple(m for m in self.mechanisms if check_range(m.affected).applies)

    def uncovered_here(self) -> Optional[str]:
        """Why this fix does not repair here what the installed versions may have, or None.

        ``Mechanism.unreached`` holding the installed versions counts only where the fix does not apply
        at all (where it applies, the mechanisms it repairs are the news); ``Mechanism.lost``, applied
        or not: upstream drops that state before the fix sees it.
        """
        if self.declaration_error():
            return None
        applies = self.check().applies
        groups: Dict[Tuple[str, str], List[str]] = {}  # (where and why, said once; the verdict) -> mechanism names
        for mechanism in self.mechanisms:
            if not applies and mechanism.unreached and check_range(mechanism.unreached).applies:
                reached = ", ".join(f"{dist} {spec}" for dist, spec in mechanism.affected.items())
                where = f"{_installed(mechanism.unreached)} is outside what this fix reaches ({reached})"
                groups.setdefault((where, "may be broken here, unrepaired"), []).append(mechanism.name)
            for lost in mechanism.lost:
                if check_range(lost.affected).applies:
                    where = f"{_installed(lost.affected)}: {lost.reason}"
                    groups.setdefault((where, "broken here, and hotfix cannot restore it"), []).append(mechanism.name)
        return "; ".join(f"{where}: {', '.join(names)} {verdict}" for (where, verdict), names in groups.items()) or None

    @property
    def distributions(self) -> Tuple[str, ...]:
        """Every distribution a range of this patch names (none where its declarations cannot be read)."""
        if self.declaration_error():
            return ()
        names = dict.fromkeys(self.affected)
        for mechanism in self.mechanisms:
            names.update(dict.fromkeys(mechanism.affected))
        return tuple(names)

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
            undo_mark = len(self._undo)
            try:
                self._apply(module)
            except Exception as exc:
                self._rollback_to(undo_mark)
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
            if not self._applied_targets and not self._undo:
                return False
            try:
                self._revert()
            except Exception as exc:
                self.last_error = f"revert failed: {exc!r}"
                logger.warning("hotfix: patch %s failed to revert: %r", self.name, exc)
                return False
            self._applied_targets.clear()
            self._installed.clear()
            logger.info("hotfix: reverted %s", self.name)
            return True

    def _rollback_to(self, mark: int) -> None:
        """Undo what a failed ``_apply`` managed to change before it raised."""
        newer = self._undo[mark:]
        del self._undo[mark:]
        saved, self._undo = self._undo, newer
        try:
            Patch._revert(self)
        except Exception:
            pass
        finally:
            self._undo = saved

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} applied={self.applied}>"
