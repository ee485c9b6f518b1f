"""Let a reentrant checkpoint hand on what a layer writes into a mapping or Cache it is handed, and nothing more.

Some models pass tensors between layers through a mapping every layer is handed (5.x Gemma-3n/4
KV sharing: ``shared_kv_states``), or a layer appends to a transformers ``Cache`` that already
holds keys/values needing grad (prefix or prompt tuning, a previous segment: ``cache.update``).
Reentrant checkpointing runs the forward without grad and connects only what the layer returns:
stored tensors are constants (wrong gradients, no error), and the recomputation writes into the
caller's mapping or cache a second time (it then reads the appended cache: 13 positions instead of
8, the prefix's gradient missing).  Here the layer gets a private copy of each such state
(``checkpointing.structure.rebuild``: nested dicts, lists and mappings copied too, privacy proven by
``checkpointing.private_copy``; a Cache with copies of its entries); once the checkpoint returns, what it left
there (values, deletions, key order, nested writes, a cache entry's new keys/values, new entries)
is replayed onto the caller's, new tensors as extra checkpoint outputs (``FlatOutputs``) so they are
stored connected.  Each recomputation gets a fresh private copy of the state the forward saw.  A
mapping with no private copy leaves the whole call to upstream, with one warning; a tensor received
through the state and changed in place is reported once.  Nothing the checkpoint keeps refers to the
caller's state: it holds the checkpoint's outputs, and a reference back would be a cycle through
autograd that Python's collector cannot see.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from hotfix.checkpointing.layer_call import LayerCallWrapper, layer_of
from hotfix.checkpointing.structure import (NoPrivateCopy, cache_entries, entry_items, is_shared_state, is_tensor,
                                            rebuild, same, tensors)

__all__ = ["SharedStateWrites", "UNSAFE"]

#: what ``SharedStateWrites.around`` returns when a mapping has no private copy: make the call as upstream does
UNSAFE = object()

Warn = Callable[[Any, str], None]  # Patch.warn_once(key, message)



def _keep(value: Any) -> Any:
    return value


class _Copier:
    """Private copies of shared state and the containers inside it, each remembering its original."""

    def __init__(self) -> None:
        self.copied: Dict[int, Tuple[Any, Any]] = {}  # id(copy) -> (the copy, the container it copies)

    def copy(self, value: Any) -> Any:
        """A private copy of ``value`` (raises ``NoPrivateCopy`` where a mapping has none)."""
        return rebuild(value, is_tensor, _keep, copied=self.copied, strict=True)


class _Writes:
    """What one call of a layer left in its private copies: its new tensors, and (forward) how to replay the rest."""

    def __init__(self, tensors: List[torch.Tensor], changed: bool,
                 pairs: Sequence[Tuple[Any, Any]] = (), origin: Optional[Dict[int, Any]] = None):
        self.tensors = tensors  # the checkpoint's extra outputs, in the order the copies hold them
        self.changed = changed
        self._pairs = list(pairs)  # (caller's state, the layer's private copy after the call); forward only
        self._origin = origin or {}  # id(copy) -> the caller's container it copies

    def apply(self, connected: Sequence[torch.Tensor]) -> None:
        """Make each caller's state hold what the layer left in its copy, new tensors as ``connected``."""
        swap = {id(tensor): twin for tensor, twin in zip(self.tensors, connected)}
        for caller, final in self._pairs:
            self._sync(caller, final, swap)
        self._pairs, self._origin, self.tensors = [], {}, []  # nothing kept refers to the caller's state

    def _resolve(self, value: Any, swap: Dict[int, torch.Tensor]) -> Any:
        original = self._origin.get(id(value))
        if original is not None:  # a copy of one of the caller's containers: that container, brought up to date
            self._sync(original, value, swap)
            return original
        return rebuild(value, is_tensor, lambda tensor: swap.get(id(tensor), tensor))

    def _sync(self, caller: Any, final: Any, swap: Dict[int, torch.Tensor]) -> None:
        if isinstance(caller, list):
            caller[:] = [self._resolve(item, swap) for item in final]
            return
        entries = cache_entries(caller)
        if entries is not None:  # a Cache: its entries brought up to date in place, new ones appended
            resolved = [self._entry(entry, swap) for entry in cache_entries(final) or ()]
            if len(resolved) != len(entries) or any(a is not b for a, b in zip(resolved, entries)):
                entries[:] = resolved
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

    def _entry(self, final: Any, swap: Dict[int, torch.Tensor]) -> Any:
        """The caller's cache entry that ``final`` copies (``final`` itself where the layer added it), up to date."""
        target = self._origin.get(id(final), final)
        names = set()
        for name, item in entry_items(final):
            names.add(name)
            resolved = self._resolve(item, swap)
            if getattr(target, name, _MISSING) is not resolved:
                setattr(target, name, resolved)
        for name in [name for name, _ in entry_items(target) if name not in names]:
            delattr(target, name)
        return target


_MISSING = object()


def _layer_name(call: Any, target: Any) -> str:
    """The name of the layer ``call`` runs, for what is said about it (else ``target``'s, the function called)."""
    layer = layer_of(call)
    return type(layer).__qualname__ if layer is not None else getattr(target, "__qualname__", repr(target))


class SharedStateWrites(LayerCallWrapper):
    """A layer call that writes only into private copies of the state it is handed, and hands on the writes.

    Shows the layer as the call does (``__self__``, ``__wrapped__``: ``checkpointing.layer_call``).
    """

    def __init__(self, function: Callable, callers: Dict[int, Any], origin: Dict[int, Tuple[Any, Any]],
                 warn: Optional[Warn]) -> None:
        self._wrap(function)  # what the layer call is (fixes further in read ``shown``)
        self._callers = callers  # id(snapshot handed to the call) -> the caller's state; forward only
        self._origin = origin  # id(container of a snapshot) -> (that container, the caller's); forward only
        self._warn = warn
        self.calls = 0
        self._latest: Optional[_Writes] = None

    @property
    def _layer(self) -> str:  # looked up when something is said, not per call
        return _layer_name(self.__wrapped__, self.__wrapped__)

    def take(self) -> Optional[_Writes]:
        """What the latest call wrote, handed over once (so nothing here keeps the caller's state alive)."""
        latest, self._latest = self._latest, None
        return latest

    @classmethod
    def around(cls, function: Callable, inputs: Sequence[Any], warn: Optional[Warn] = None) -> Any:
        """``(watcher, function, inputs)`` to checkpoint instead; None when no shared state is handed over;
        ``UNSAFE`` when a mapping has no private copy (the caller then makes the call as upstream does).

        Every mutable mapping and Cache in ``inputs`` or bound in a ``functools.partial`` is replaced by a
        private snapshot of itself: what the forward and every recomputation start from.  A partial keeps
        its shape (its ``func`` is watched), so that its bound tensors can still be lifted into inputs.
        """
        if isinstance(function, functools.partial):
            bound_args, bound_keywords, target = function.args, function.keywords, function.func
        else:
            bound_args, bound_keywords, target = (), {}, function
        values = list(bound_args) + list(bound_keywords.values()) + list(inputs)
        if not any(is_shared_state(value) for value in values):
            return None
        copier = _Copier()
        snapshots: Dict[int, Any] = {}  # id(caller's state) -> its private snapshot
        callers: Dict[int, Any] = {}  # id(snapshot) -> the caller's state
        try:
            for value in values:
                if is_shared_state(value) and id(value) not in snapshots:
                    snapshots[id(value)] = copier.copy(value)
                    callers[id(snapshots[id(value)])] = value
        except NoPrivateCopy as exc:
            if warn is not None:
                layer = _layer_name(function, target)
                warn(("no private copy", layer, str(exc)),
                     f"{layer} is handed a {exc} that cannot be copied privately; its writes to it are left as "
                     "upstream makes them (repeated by reentrant recomputation); use use_reentrant=False for this "
                     "model")
            return UNSAFE

        def swap(value: Any) -> Any:
            return snapshots[id(value)] if is_shared_state(value) else value

        watcher = cls(target, callers, copier.copied, warn)
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
        received: List[Any] = []
        finals: List[Any] = []

        def private(value: Any) -> Any:  # each shared state handed over: a fresh private copy of it
            if not is_shared_state(value):
                return value
            received.append(value)
            finals.append(copier.copy(value))
            return finals[-1]

        args = tuple(private(a) for a in args)
        kwargs = {k: private(v) for k, v in kwargs.items()}
        before = tensors(received)
        versions = [(tensor, tensor._version) for tensor in before] if forward else []
        output = self.__wrapped__(*args, **kwargs)

        known = {id(tensor) for tensor in before}
        new: List[torch.Tensor] = []
        for tensor in tensors(finals):
            if id(tensor) not in known:
                known.add(id(tensor))
                new.append(tensor)
        changed = not all(same(final, start) for final, start in zip(finals, received))
        if not forward:  # a recomputation: the same new tensors, in the same order; the caller is left alone
            self._latest = _Writes(new, changed)
            return output
        if any(tensor._version != version for tensor, version in versions) and self._warn is not None:
            self._warn(("in place", self._layer),
                       f"{self._layer} changes in place a tensor it received through a mapping or cache: not "
                       "repairable under reentrant checkpointing (the recomputation changes it again and its gradient "
                       "is wrong); use use_reentrant=False for this model")
        # copy of a snapshot -> snapshot -> the caller's container
        origin = {copy_id: self._origin[id(snapshot)][1] for copy_id, (_, snapshot) in copier.copied.items()
                  if id(snapshot) in self._origin}
        pairs = [(self._callers[id(start)], final) for final, start in zip(finals, received) if id(start) in self._callers]
        self._latest = _Writes(new, changed, pairs, origin)
        self._callers, self._origin = {}, {}  # nothing kept refers to the caller's state
        return output
