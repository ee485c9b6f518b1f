"""What a fix changed on its targets, so that its revert puts back exactly what was there (``is``-identical).

A fix changes things only through :meth:`Ledger.replace` / :meth:`Ledger.wrap` (``Patch.replace`` /
``Patch.wrap``), which record the original object; :meth:`Ledger.undo` restores the originals newest
first, :meth:`Ledger.rollback_to` only what a failed apply changed.  Applying again to objects that
already carry this fix's replacement (``importlib.reload`` of a target that re-imports unchanged
objects) never wraps a wrapper.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import wrapt

_ABSENT = object()  # marks an attribute the owner did not define itself


class Undo:
    """In the record's place of an original: how to take back a change that others may have built on (a fix's hook
    in a junction: ``hotfix.junction.leave``), run instead of putting an object back."""

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run


class Ledger:
    """One fix's record of replaced attributes."""

    def __init__(self) -> None:
        self._undo: List[Tuple[Any, str, Any]] = []  # (owner, attribute, original), oldest first
        # (id(owner), attribute) -> the object replace() put there
        self._installed: Dict[Tuple[int, str], Any] = {}

    def __len__(self) -> int:
        return len(self._undo)

    def replace(self, owner: Any, attribute: str, new: Any, undo: Optional[Undo] = None) -> Any:
        """Set ``owner.attribute = new``, remembering what to restore (or, given ``undo``, how to take it back);
        ``new`` already there from this fix: left."""
        original = owner.__dict__.get(attribute, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
        key = (id(owner), attribute)
        if original is not _ABSENT and self._installed.get(key, _ABSENT) is original:
            return original
        setattr(owner, attribute, new)
        self._undo.append((owner, attribute, undo if undo is not None else original))
        self._installed[key] = new
        return new

    def wrap(self, owner: Any, attribute: str, wrapper: Callable) -> Any:
        """Wrap ``owner.attribute`` with a wrapt ``FunctionWrapper``, set on ``owner`` itself.

        The original comes from wrapt's ``resolve_path``, which looks a class attribute up in the
        ``__dict__`` along the MRO instead of binding it: a ``classmethod``/``staticmethod`` (even an
        inherited one) is wrapped as the descriptor it is, so it binds per call like the original.
        """
        _, _, original = wrapt.resolve_path(owner, attribute)
        return self.replace(owner, attribute, wrapt.FunctionWrapper(original, wrapper))

    def installed(self, value: Any) -> bool:
        """Is ``value`` an object this ledger put in place (and has not taken back)?"""
        return any(new is value for new in self._installed.values())

    def mark(self) -> int:
        return len(self._undo)

    def undo(self) -> None:
        """Restore every recorded original, newest first."""
        self.rollback_to(0)
        self._installed.clear()

    def rollback_to(self, mark: int) -> None:
        """Restore what was replaced after ``mark``, newest first (a failed apply's changes)."""
        while len(self._undo) > mark:
            owner, attribute, original = self._undo.pop()
            key = (id(owner), attribute)
            if any((id(o), a) == key for o, a, _ in self._undo):
                self._installed[key] = original  # an earlier replace of the same attribute put it there
            else:
                self._installed.pop(key, None)
            if isinstance(original, Undo):
                original.run()
            elif original is _ABSENT:
                try:
                    delattr(owner, attribute)
                except AttributeError:
                    pass
            else:
                setattr(owner, attribute, original)
