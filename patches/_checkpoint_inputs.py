"""Make every tensor that needs a gradient a real input of a reentrant checkpoint call.

Reentrant checkpointing (torch's ``use_reentrant=True``, unsloth's ``UnslothCheckpointFunction``)
is an ``autograd.Function``: only tensors passed to it positionally are inputs of its node.
transformers calls ``checkpoint(partial(layer, **kwargs), *args)``, so a tensor needing grad that
arrives by keyword, inside a container, in a shared mapping or in a transformers ``Cache``
(``cache.layers[i].keys`` / ``.values``) hides from it, and every recomputation re-walks its
history ("Trying to backward through the graph a second time").  ``lift_closure_tensors`` rewrites
the call so that those tensors travel as extra positional inputs; the checkpoint's forward calls
the layer with the original objects, the recomputation with rebuilt copies holding the inputs'
twins (a Cache as a shallow copy whose entries hold them, so it is never appended to twice).  A
cache without a ``layers`` list is left as it is.  docs/fixes/transformers-checkpoint-layer-io.md.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from hotfix.patches._private_copy import private_mapping

__all__ = ["lift_closure_tensors", "find_grad_tensors", "hides_nothing", "is_reentrant", "layer_call", "map_structure"]


def is_reentrant(checkpoint: Any, kwargs: dict) -> bool:
    """False only where the call is known to be non-reentrant (which has none of these problems).

    ``checkpoint`` is the function a layer holds (transformers stores
    ``partial(checkpoint, use_reentrant=...)``); torch's default (None) is reentrant.
    """
    value = kwargs.get("use_reentrant")
    if value is None and isinstance(checkpoint, functools.partial):
        value = checkpoint.keywords.get("use_reentrant")
    return value is None or bool(value)


def layer_call(function: Any) -> Any:
    """The layer call inside wrappers that mark themselves with ``__wrapped__`` (FlatOutputs)."""
    for _ in range(8):
        inner = getattr(function, "__wrapped__", None) if not isinstance(function, functools.partial) else None
        if inner is None or inner is function:
            return function
        function = inner
    return function


def find_grad_tensors(value: Any, found: List[torch.Tensor], seen: set) -> None:
    """Collect tensors that require grad in ``value`` (tensors, tuples, lists, mappings, caches).

    Each tensor is collected once (by identity) even when it occurs several times.
    """
    if isinstance(value, torch.Tensor):  # most values: answered without the container checks below
        if value.requires_grad and id(value) not in seen:
            seen.add(id(value))
            found.append(value)
    elif value is None or isinstance(value, (bool, int, float, str)):
        return
    elif isinstance(value, (tuple, list)):
        for item in value:
            find_grad_tensors(item, found, seen)
    elif isinstance(value, Mapping):
        for item in value.values():
            find_grad_tensors(item, found, seen)
    else:
        for entry in _cache_entries(value):
            find_grad_tensors(list(_tensors_of(entry).values()), found, seen)


def _cache_entries(value: Any) -> list:
    """The per-layer entries of a transformers ``Cache`` (``cache.layers``), else ``[]``.

    Looked up in ``sys.modules``, never imported: a cache exists only where
    transformers is loaded already.
    """
    cache_class = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    if cache_class is None or not isinstance(value, cache_class):
        return []
    entries = getattr(value, "layers", None)
    return entries if isinstance(entries, list) else []


def _tensors_of(entry: Any) -> dict:
    """The tensors a cache entry holds as attributes (``keys``, ``values``, ...), by attribute name."""
    return {name: item for name, item in getattr(entry, "__dict__", {}).items() if isinstance(item, torch.Tensor)}


def _cache_with(cache: Any, replacement: dict) -> Any:
    """``cache`` itself, or where it holds a lifted tensor a shallow copy whose entries hold their twins."""
    entries = _cache_entries(cache)
    if not any(id(item) in replacement for entry in entries for item in _tensors_of(entry).values()):
        return cache
    twins = []
    for entry in entries:
        twin = copy.copy(entry)
        for name, item in _tensors_of(entry).items():
            if id(item) in replacement:
                setattr(twin, name, replacement[id(item)])
        twins.append(twin)
    rebuilt = copy.copy(cache)
    rebuilt.layers = twins
    return rebuilt


def map_structure(value: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt with ``fn`` applied to every leaf, through tuples, lists and mappings.

    Containers are rebuilt with their own type, so named tuples and dict
    subclasses (``ModelOutput``-like) keep their class; another mutable mapping
    (``UserDict``: ``KVSharingDict``) becomes a shallow copy of itself with its
    values rebuilt, never the original changed.
    """
    if is_leaf(value):
        return fn(value)
    if isinstance(value, tuple):
        items = [map_structure(item, is_leaf, fn) for item in value]
        if hasattr(value, "_fields"):  # named tuple: positional constructor
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, list):
        return type(value)(map_structure(item, is_leaf, fn) for item in value)
    if isinstance(value, dict):
        rebuilt = {key: map_structure(item, is_leaf, fn) for key, item in value.items()}
        if type(value) is dict:
            return rebuilt
        try:
            return type(value)(rebuilt)
        except Exception:  # a dict subclass with its own constructor: keep a plain dict
            return rebuilt
    if isinstance(value, MutableMapping):
        rebuilt = {key: map_structure(item, is_leaf, fn) for key, item in value.items()}
        twin = private_mapping(value)  # a copy whose writes cannot reach the original's storage
        if twin is None:
            return rebuilt  # no private copy: a plain dict with its items, never the original changed
        try:
            twin.update(rebuilt)
        except Exception:
            return rebuilt
        return twin
    return value


def _is_tensor_or_cache(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or bool(_cache_entries(value))


def _substitute(value: Any, replacement: dict) -> Any:
    """Rebuild ``value`` with each lifted tensor swapped for its recomputation twin (in caches too)."""

    def swap(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return replacement.get(id(leaf), leaf)
        return _cache_with(leaf, replacement)

    return map_structure(value, _is_tensor_or_cache, swap)


def _plain(value: Any) -> bool:
    """A value nothing can hide in: a tensor that needs no grad, None, or a scalar."""
    if isinstance(value, torch.Tensor):
        return not value.requires_grad
    return value is None or isinstance(value, (bool, int, float, str))


def hides_nothing(function: Any, inputs: Sequence[Any]) -> bool:
    """Can nothing reach the layer except as a positional tensor?  The common call, answered cheaply.

    True when every value bound in the ``partial`` is plain (or a plain tuple/list of plain values)
    and every positional input is a tensor or plain: then there is no tensor needing grad for
    ``lift_closure_tensors`` and no mapping for the shared-state watcher.  False only means
    "look closer".
    """
    if isinstance(function, functools.partial):
        for value in (*function.args, *function.keywords.values()):
            if not _plain(value) and not (type(value) in (tuple, list) and all(_plain(item) for item in value)):
                return False
    for value in inputs:
        if not isinstance(value, torch.Tensor) and not _plain(value):
            return False
    return True


def lift_closure_tensors(
    function: Callable, args: Sequence[Any]
) -> Optional[Tuple[Callable, Tuple[Any, ...]]]:
    """Return ``(new_function, new_args)`` with closure tensors lifted, or ``None``.

    ``function`` is what the checkpoint function receives as its first argument.
    Only ``functools.partial`` objects are rewritten, since that is how
    transformers binds keywords; their bound positional arguments and keywords
    are both searched.  ``None`` means there is nothing to lift and the caller
    should make the original call unchanged.
    """
    if not isinstance(function, functools.partial):
        return None
    found: List[torch.Tensor] = []
    seen: set = set()
    find_grad_tensors(function.args, found, seen)
    find_grad_tensors(function.keywords, found, seen)
    # Positional containers (lists/tuples/dicts) holding tensors that need grad:
    # not checkpoint inputs either, since only top-level tensors are.
    nested_positions = []
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            continue
        inner: List[torch.Tensor] = []
        find_grad_tensors(arg, inner, set())
        if inner:
            nested_positions.append(i)
            for tensor in inner:
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    found.append(tensor)
    if not found:
        return None

    # A closure tensor that is also passed positionally is already an input:
    # it is swapped for that input's recomputation twin instead of lifted again.
    positional_slot = {id(arg): i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)}
    n_args = len(args)
    lifted: List[torch.Tensor] = []
    slots = {}  # id(closure tensor) -> index of its twin among the checkpoint inputs
    for tensor in found:
        if id(tensor) in positional_slot:
            slots[id(tensor)] = positional_slot[id(tensor)]
        else:
            slots[id(tensor)] = n_args + len(lifted)
            lifted.append(tensor)

    target = function.func
    bound_args = function.args
    bound_keywords = function.keywords

    def run_with_lifted_inputs(*all_args):
        if all(all_args[slots[id(tensor)]] is tensor for tensor in found):
            # The checkpoint's forward: the layer gets its original objects
            # (a mapping it stores into must be the caller's, not a copy).
            return function(*all_args[:n_args])
        # The recomputation hands back detached versions of every input;
        # map the originals' identities onto them.
        replacement = {key: all_args[slot] for key, slot in slots.items()}
        positional = list(all_args[:n_args])
        for i in nested_positions:
            positional[i] = _substitute(positional[i], replacement)
        call_args = _substitute(bound_args, replacement) + tuple(positional)
        call_keywords = _substitute(bound_keywords, replacement)
        return target(*call_args, **call_keywords)

    return run_with_lifted_inputs, tuple(args) + tuple(lifted)
