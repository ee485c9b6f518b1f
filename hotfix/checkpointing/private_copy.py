"""Copies of a mutable mapping whose writes can never reach the original.

``copy.copy`` of an arbitrary ``MutableMapping`` may share its storage (a class over an
internal dict without ``__copy__``: the copy's writes land in the caller's mapping).  A
copy is accepted only once a probe proves it private: a unique key set on the copy must
not appear in the original.  Where the shallow copy shares storage, a ``deepcopy`` whose
memo maps every value to itself copies the structure only; where neither is private (or
copying raises) there is no safe copy, and callers leave the call as upstream makes it.
dict and list are private by construction (``copy.copy`` makes new storage).
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from typing import Optional


class _Probe:
    """A key no mapping holds (hashable by identity)."""

    __slots__ = ()


def _is_private(twin: MutableMapping, original: MutableMapping) -> bool:
    probe = _Probe()
    try:
        twin[probe] = None
        try:
            return probe not in original
        finally:
            del twin[probe]
    except Exception:  # a mapping that refuses the probe cannot be shown private
        return False


def private_mapping(value: MutableMapping) -> Optional[MutableMapping]:
    """A copy of ``value`` (same type, same items) that shares no storage with it, or None."""
    if isinstance(value, dict):
        try:
            return copy.copy(value)  # dict subclasses too: their items live in the object itself
        except Exception:  # a dict subclass that cannot be copied: no private copy
            return None
    try:
        twin = copy.copy(value)
        if twin is not value and _is_private(twin, value):
            return twin
    except Exception:
        pass
    try:
        memo = {id(item): item for item in value.values()}  # the items themselves are not copied
        memo.update({id(key): key for key in value.keys()})
        twin = copy.deepcopy(value, memo)
        if twin is not value and _is_private(twin, value):
            return twin
    except Exception:
        pass
    return None
