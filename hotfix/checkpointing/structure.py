"""What a checkpointed call's arguments and outputs hold: the one traversal every fix uses.

Lifting (``checkpointing.inputs``), the frozen-inputs anchor, the shared-state watcher
(``checkpointing.shared_state``) and the output flattening (``checkpointing.outputs``) each ask what a
value holds; where their answers differed (one looked into a Mapping another did not rebuild, one
saw a Cache another copied without its entries), lifting, watching and skipping disagreed.  Here
the containers are defined once, for all of them:

* tuple (a named tuple too), list;
* Mapping: dict, dict subclasses (``ModelOutput``), ``UserDict`` and other mappings;
* a transformers ``Cache`` that keeps its per-layer entries in a ``layers`` list (4.56+): looked
  into through each entry's attributes (``keys``, ``values``, 5.x's dicts of conv/recurrent states).

Anything else (a tensor, None, a scalar, a string, any other object, a Cache without ``layers``)
is a leaf; only tensors are looked for.  :func:`rebuild` copies what it walks through, so a layer
handed a rebuilt value can never write into the caller's containers: mutable containers (lists,
mutable mappings, caches and their entries) are always new objects, immutable ones (tuples,
read-only mappings) only where something below them changed.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from hotfix.checkpointing.private_copy import private_mapping

__all__ = ["NoPrivateCopy", "cache_entries", "entry_items", "find_grad_tensors", "hides_nothing", "holds_tensor",
           "is_plain", "is_tensor", "is_shared_state", "rebuild", "same", "tensors"]

_Tensor = torch.Tensor
_SCALARS = (bool, int, float, str, bytes, complex)


class NoPrivateCopy(Exception):
    """A mutable mapping of which no copy can be shown private (``checkpointing.private_copy``); its type's name."""


def cache_entries(value: Any) -> Optional[list]:
    """The per-layer entries of a transformers ``Cache`` (``cache.layers``), else None.

    Looked up in ``sys.modules``, never imported: a cache exists only where transformers is loaded.
    """
    cache_class = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    if cache_class is None or not isinstance(value, cache_class):
        return None
    entries = getattr(value, "layers", None)
    return entries if isinstance(entries, list) else None


def entry_items(entry: Any) -> list:
    """A cache entry's attributes, as (name, value) pairs (what :func:`tensors` looks into)."""
    return list(getattr(entry, "__dict__", {}).items())


def is_tensor(value: Any) -> bool:
    """The leaf test of a rebuild that swaps tensors (``rebuild(value, is_tensor, ...)``)."""
    return isinstance(value, _Tensor)


def is_plain(value: Any) -> bool:
    """A value nothing can hide in: a tensor that needs no grad, None, or a scalar."""
    if isinstance(value, _Tensor):
        return not value.requires_grad
    return value is None or isinstance(value, _SCALARS)


def tensors(value: Any) -> List[_Tensor]:
    """Every tensor in ``value``, depth first, in order (a tensor held twice comes twice)."""
    found: List[_Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: List[_Tensor]) -> None:
    # recursion by plain calls (no nested generators): this runs for every value a watched call is handed
    if isinstance(value, _Tensor):
        found.append(value)
    elif value is None or isinstance(value, _SCALARS):
        return
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, found)
    elif type(value) is dict or isinstance(value, Mapping):
        for item in value.values():
            _collect(item, found)
    else:
        for entry in cache_entries(value) or ():
            for _name, item in entry_items(entry):
                _collect(item, found)


def find_grad_tensors(value: Any, found: List[_Tensor], seen: set) -> None:
    """Append to ``found`` each tensor in ``value`` that requires grad, once (by identity, tracked in ``seen``)."""
    for tensor in tensors(value):
        if tensor.requires_grad and id(tensor) not in seen:
            seen.add(id(tensor))
            found.append(tensor)


def holds_tensor(value: Any) -> bool:
    """Is there a tensor anywhere in ``value``?"""
    return bool(tensors(value))


def is_shared_state(value: Any) -> bool:
    """A container a layer may write into that outlives the call: a mutable mapping or a Cache with entries.

    (A list is mutable too, but handed to a layer it is an argument list, never state shared across layers.)
    """
    if isinstance(value, _Tensor):  # most values handed to a layer: answered before the ABC check
        return False
    return isinstance(value, MutableMapping) or cache_entries(value) is not None


def hides_nothing(function: Any, inputs: Sequence[Any]) -> bool:
    """Can nothing reach the layer except as a positional tensor?  The common call, answered cheaply.

    True when every value bound in the ``partial`` is plain (or a plain tuple/list of plain values)
    and every positional input is a tensor or plain: then :func:`tensors` finds no tensor needing
    grad outside the positional ones and there is no shared state.  False only means "look closer".
    """
    # is_plain written out for the tensors (most values): every checkpointed call asks this
    if isinstance(function, functools.partial):
        for values in (function.args, function.keywords.values()):
            for value in values:
                if isinstance(value, _Tensor):
                    if value.requires_grad:
                        return False
                elif not is_plain(value) and not (type(value) in (tuple, list) and all(map(is_plain, value))):
                    return False
    for value in inputs:
        if not isinstance(value, _Tensor) and not is_plain(value):
            return False
    return True


def rebuild(value: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any],
            copied: Optional[Dict[int, Any]] = None, strict: bool = False) -> Any:
    """``value`` rebuilt with ``fn`` applied to every leaf for which ``is_leaf`` holds.

    Containers keep their type (named tuples, dict subclasses, a cache's own class); a mutable mapping
    is a copy proven private (``checkpointing.private_copy``); where there is none, a plain dict with its items, or
    with ``strict`` :class:`NoPrivateCopy`.  ``copied``, when given, maps ``id(copy)`` to ``(copy, original)``
    for every mutable container copied (lists, mutable mappings, caches, cache entries), so that a
    caller can bring the originals up to date later (holding the copy keeps its id valid).
    """
    if is_leaf(value):
        return fn(value)
    if isinstance(value, _Tensor) or value is None or isinstance(value, _SCALARS):
        return value
    if isinstance(value, tuple):
        items = [rebuild(item, is_leaf, fn, copied, strict) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        try:
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        except Exception:  # a tuple subclass with its own constructor: a plain tuple with its items
            return tuple(items)
    if isinstance(value, list):
        twin = [rebuild(item, is_leaf, fn, copied, strict) for item in value]
        if type(value) is not list:
            try:
                twin = type(value)(twin)
            except Exception:  # a list subclass with its own constructor: a plain list with its items
                pass
        return _record(copied, twin, value)
    if isinstance(value, Mapping):
        return _rebuild_mapping(value, is_leaf, fn, copied, strict)
    entries = cache_entries(value)
    if entries is None:
        return value
    twin = copy.copy(value)
    twin.layers = _record(copied, [_rebuild_entry(entry, is_leaf, fn, copied, strict) for entry in entries], entries)
    return _record(copied, twin, value)


def _record(copied: Optional[Dict[int, Any]], twin: Any, original: Any) -> Any:
    if copied is not None:
        copied[id(twin)] = (twin, original)
    return twin


def _rebuild_mapping(value: Mapping, is_leaf: Callable, fn: Callable, copied: Optional[Dict[int, Any]],
                     strict: bool) -> Any:
    items = {key: rebuild(item, is_leaf, fn, copied, strict) for key, item in value.items()}
    if type(value) is dict:
        return _record(copied, items, value)
    if not isinstance(value, MutableMapping):  # read-only: rebuilt only where something below changed
        if all(items[key] is item for key, item in value.items()):
            return value
        try:
            return type(value)(items)
        except Exception:
            return items
    twin = private_mapping(value)  # a copy whose writes cannot reach the original's storage
    if twin is None:
        if strict:
            raise NoPrivateCopy(type(value).__qualname__)
        return items  # no private copy: a plain dict with its items, never the original changed
    try:
        for key, item in items.items():
            if twin[key] is not item:
                twin[key] = item
    except Exception:
        if strict:
            raise NoPrivateCopy(type(value).__qualname__) from None
        return items
    return _record(copied, twin, value)


def _rebuild_entry(entry: Any, is_leaf: Callable, fn: Callable, copied: Optional[Dict[int, Any]], strict: bool) -> Any:
    """A copy of a cache entry whose attributes are rebuilt (its dicts of states copied too)."""
    twin = copy.copy(entry)
    for name, item in entry_items(entry):
        new = rebuild(item, is_leaf, fn, copied, strict)
        if new is not item:
            setattr(twin, name, new)
    return _record(copied, twin, entry)


def same(a: Any, b: Any) -> bool:
    """Does ``a`` hold what ``b`` holds: the same containers' keys in the same order, the same objects at the leaves?"""
    if a is b:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a.keys()) == list(b.keys()) and all(same(a[key], b[key]) for key in a.keys())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    entries_a, entries_b = cache_entries(a), cache_entries(b)
    if entries_a is not None and entries_b is not None:
        return len(entries_a) == len(entries_b) and all(same_entry(x, y) for x, y in zip(entries_a, entries_b))
    return False


def same_entry(a: Any, b: Any) -> bool:
    """Do two cache entries hold the same attributes, the same objects below them?"""
    items_a, items_b = entry_items(a), entry_items(b)
    return [name for name, _ in items_a] == [name for name, _ in items_b] and \
        all(same(x, y) for (_, x), (_, y) in zip(items_a, items_b))
