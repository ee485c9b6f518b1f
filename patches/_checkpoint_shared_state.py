"""Let a reentrant checkpoint hand on what a layer writes into a mapping it is handed, and nothing more.

Some models pass tensors between layers through a mapping every layer is handed (5.x Gemma-3n/4
KV sharing: ``shared_kv_states``).  Reentrant checkpointing runs the forward without grad and
connects only what the layer returns: stored tensors are constants (wrong gradients, no error),
and the recomputation writes into the caller's mapping a second time.  Here the layer gets a
private copy of each mutable mapping (nested dicts, lists and mappings copied too, privacy proven
by ``_private_copy``); once the checkpoint returns, what it left there (values, deletions, key
order, nested writes) is replayed onto the caller's mapping, new tensors as extra checkpoint
outputs (``FlatOutputs``) so they are stored connected.  Each recomputation gets a fresh private
copy of the state the forward saw.  A mapping with no private copy leaves the whole call to
upstream, with one warning; a tensor received through a mapping and changed in place is reported
once.  Nothing the checkpoint keeps refers to the caller's mapping: it holds the checkpoint's
outputs, and a reference back would be a cycle through autograd that Python's collector cannot see.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from hotfix.patches._checkpoint_inputs import map_structure
from hotfix.patches._private_copy import private_mapping

__all__ = ["SharedStateWrites", "UNSAFE"]

#: what ``SharedStateWrites.around`` returns when a mapping has no private copy: make the call as upstream does
UNSAFE = object()

Warn = Callable[[Any, str], None]  # Patch.warn_once(key, message)


class _NoPrivateCopy(Exception):
    pass


def _is_mapping(value: Any) -> bool:
    # tensors first: most values handed to a layer are, and the ABC check costs more
    return not isinstance(value, torch.Tensor) and isinstance(value, MutableMapping)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value``, through mappings, lists and tuples, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)


def _same(a: Any, b: Any) -> bool:
    """Does ``a`` hold what ``b`` holds: the same keys in the same order, the same objects at the leaves?"""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a.keys()) == list(b.keys()) and all(_same(a[key], b[key]) for key in a.keys())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b


class _Copier:
    """Private copies of mutable mappings and the dicts and lists inside them, each remembering its original."""

    def __init__(self) -> None:
        self.origin: Dict[int, Any] = {}  # id(copy) -> the container it copies
        self._alive: List[Any] = []  # keeps every copy alive while its id is a key above

    def copy(self, value: Any) -> Any:
        if _is_mapping(value):
            twin = private_mapping(value)
            if twin is None:
                raise _NoPrivateCopy(type(value).__qualname__)
            for key, item in list(twin.items()):
                inner = self.copy(item)
                if inner is not item:
                    twin[key] = inner
        elif isinstance(value, list):
            twin = [self.copy(item) for item in value]
        else:
            return value
        self.origin[id(twin)] = value
        self._alive.append(twin)
        return twin


class _Writes:
    """What one call of a layer left in its private copies: its new tensors, and (forward) how to replay the rest."""

    def __init__(self, tensors: List[torch.Tensor], changed: bool,
                 pairs: Sequence[Tuple[MutableMapping, MutableMapping]] = (), origin: Optional[Dict[int, Any]] = None):
        self.tensors = tensors  # the checkpoint's extra outputs, in the order the copies hold them
        self.changed = changed
        self._pairs = list(pairs)  # (caller's mapping, the layer's private copy after the call); forward only
        self._origin = origin or {}

    def apply(self, connected: Sequence[torch.Tensor]) -> None:
        """Make each caller's mapping hold what the layer left in its copy, new tensors as ``connected``."""
        swap = {id(tensor): twin for tensor, twin in zip(self.tensors, connected)}
        for caller, final in self._pairs:
            self._sync(caller, final, swap)
        self._pairs, self._origin, self.tensors = [], {}, []  # nothing kept refers to the caller's mappings

    def _resolve(self, value: Any, swap: Dict[int, torch.Tensor]) -> Any:
        original = self._origin.get(id(value))
        if original is not None:  # a copy of one of the caller's containers: that container, brought up to date
            self._sync(original, value, swap)
            return original
        return map_structure(value, lambda leaf: isinstance(leaf, torch.Tensor), lambda t: swap.get(id(t), t))

    def _sync(self, caller: Any, final: Any, swap: Dict[int, torch.Tensor]) -> None:
        if isinstance(caller, list):
            caller[:] = [self._resolve(item, swap) for item in final]
            return
        for key in [key for key in caller.keys() if key not in final]:
            del caller[key]
        for key, item in final.items():
            resolved = self._resolve(item, swap)
            if key not in caller or caller[key] is not resolved:
                caller[key] = resolved
        if list(caller.keys()) != list(final.keys()):  # a key deleted and written again moves to the end
            for key in list(final.keys()):
                caller[key] = caller.pop(key)


def _layer_name(target: Any, bound_args: Sequence[Any]) -> str:
    owner = getattr(target, "__self__", None)  # 4.x: partial(layer.__call__ / super().__call__, ...)
    if owner is None and bound_args:
        owner = bound_args[0]  # 5.x: partial(forward, layer, ...)
    return type(owner).__qualname__ if owner is not None else getattr(target, "__qualname__", repr(target))


class SharedStateWrites:
    """A layer call that writes only into private copies of the mappings it is handed, and hands on the writes."""

    def __init__(self, function: Callable, callers: Dict[int, MutableMapping], origin: Dict[int, Any],
                 layer: str, warn: Optional[Warn]) -> None:
        self.__wrapped__ = function  # what the layer call is (other wrappers look through us)
        self._callers = callers  # id(snapshot handed to the call) -> the caller's mapping; forward only
        self._origin = origin  # id(container of a snapshot) -> the caller's container; forward only
        self._layer = layer
        self._warn = warn
        self.calls = 0
        self._latest: Optional[_Writes] = None

    def take(self) -> Optional[_Writes]:
        """What the latest call wrote, handed over once (so nothing here keeps a mapping alive)."""
        latest, self._latest = self._latest, None
        return latest

    @classmethod
    def around(cls, function: Callable, inputs: Sequence[Any], warn: Optional[Warn] = None) -> Any:
        """``(watcher, function, inputs)`` to checkpoint instead; None when no mutable mapping is handed over;
        ``UNSAFE`` when one has no private copy (the caller then makes the call as upstream does).

        Every mutable mapping in ``inputs`` or bound in a ``functools.partial`` is replaced by a private
        snapshot of itself: what the forward and every recomputation start from.  A partial keeps its
        shape (its ``func`` is watched), so that its bound tensors can still be lifted into inputs.
        """
        if isinstance(function, functools.partial):
            bound_args, bound_keywords, target = function.args, function.keywords, function.func
        else:
            bound_args, bound_keywords, target = (), {}, function
        values = list(bound_args) + list(bound_keywords.values()) + list(inputs)
        if not any(_is_mapping(value) for value in values):
            return None
        layer = _layer_name(target, bound_args)
        copier = _Copier()
        snapshots: Dict[int, MutableMapping] = {}  # id(caller's mapping) -> its private snapshot
        callers: Dict[int, MutableMapping] = {}  # id(snapshot) -> the caller's mapping
        try:
            for value in values:
                if _is_mapping(value) and id(value) not in snapshots:
                    snapshots[id(value)] = copier.copy(value)
                    callers[id(snapshots[id(value)])] = value
        except _NoPrivateCopy as exc:
            if warn is not None:
                warn(("no private copy", layer, str(exc)),
                     f"{layer} is handed a {exc} that cannot be copied privately; its writes to it are left as "
                     "upstream makes them (repeated by reentrant recomputation); use use_reentrant=False for this "
                     "model")
            return UNSAFE

        def swap(value: Any) -> Any:
            return snapshots[id(value)] if _is_mapping(value) else value

        watcher = cls(target, callers, copier.origin, layer, warn)
        new_inputs = tuple(swap(value) for value in inputs)
        if target is function:
            return watcher, watcher, new_inputs
        new_function = functools.partial(watcher, *[swap(v) for v in bound_args],
                                         **{k: swap(v) for k, v in bound_keywords.items()})
        return watcher, new_function, new_inputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        forward = self.calls == 1
        copier = _Copier()
        received = [v for v in list(args) + list(kwargs.values()) if _is_mapping(v)]
        args = tuple(copier.copy(a) if _is_mapping(a) else a for a in args)
        kwargs = {k: copier.copy(v) if _is_mapping(v) else v for k, v in kwargs.items()}
        finals = [v for v in list(args) + list(kwargs.values()) if _is_mapping(v)]
        before = list(_tensors(received))
        versions = [(tensor, tensor._version) for tensor in before] if forward else []
        output = self.__wrapped__(*args, **kwargs)

        known = {id(tensor) for tensor in before}
        new: List[torch.Tensor] = []
        for tensor in _tensors(finals):
            if id(tensor) not in known:
                known.add(id(tensor))
                new.append(tensor)
        changed = not all(_same(final, start) for final, start in zip(finals, received))
        if not forward:  # a recomputation: the same new tensors, in the same order; the caller is left alone
            self._latest = _Writes(new, changed)
            return output
        if any(tensor._version != version for tensor, version in versions) and self._warn is not None:
            self._warn(("in place", self._layer),
                       f"{self._layer} changes in place a tensor it received through a mapping: not repairable under "
                       "reentrant checkpointing (the recomputation changes it again and its gradient is wrong); use "
                       "use_reentrant=False for this model")
        # copy of a snapshot -> snapshot -> the caller's container
        origin = {copy_id: self._origin[id(snapshot)] for copy_id, snapshot in copier.origin.items()
                  if id(snapshot) in self._origin}
        pairs = [(self._callers[id(start)], final) for final, start in zip(finals, received) if id(start) in self._callers]
        self._latest = _Writes(new, changed, pairs, origin)
        self._callers, self._origin = {}, {}  # nothing kept refers to the caller's mappings
        return output
