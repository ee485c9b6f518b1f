"""Let a reentrant checkpoint hand on the tensors a layer stores into a shared mapping.

Why this exists
---------------
Some models pass tensors from layer to layer through a mapping that every
layer is handed, not through arguments and return values.  transformers 5.x
Gemma-4 shares keys/values across layers this way (``num_kv_shared_layers``,
as in E2B/E4B; also gemma3n, gemma4_unified, mistral_large4 in 5.23): the last
layer of each attention type before the sharing point stores ``(keys, values)``
into ``shared_kv_states`` (a ``KVSharingDict``), and every later layer of that
type reads them instead of computing its own.

Reentrant checkpointing runs a layer's forward without grad and connects only
what the layer *returns*.  The stored keys/values are therefore constants: the
later layers' gradients never reach the storing layer's ``k_proj``/``v_proj``,
its norms or its input.  Nothing fails; the gradients are wrong (tiny Gemma-4,
``num_kv_shared_layers=2``, 5.23.0: 24 of 63 parameter gradients, up to 46 %
off; 6 of 12 LoRA adapters).  Non-reentrant checkpointing runs the forward
with grad and is exact.

How this fixes it
-----------------
:class:`SharedStateWrites` wraps the layer call of a checkpointed call that is
handed a mutable mapping (positionally or by keyword).  The layer gets a
shallow copy of each such mapping, taken just before the call, and what it
stores into the copy is handed on: every key whose value is new or replaced.
Values without tensors go into the caller's mapping at once; tensors become
extra checkpoint outputs (``FlatOutputs``, after the layer's own) and their
connected versions are stored into the caller's mapping once the checkpoint
returns.  Later layers then read tensors connected to the storing layer's
checkpoint, and ``_checkpoint_inputs`` lifts them into those layers' inputs
like any other tensor they are handed.  A key the layer deletes is deleted.

After the forward the copy is put back as it was before the call, and only it
is kept for the recomputation (which gets a fresh copy of it each time): the
recomputation sees the state the forward saw, a layer recomputed during
backward never changes what the model stored, and nothing the checkpoint keeps
refers to the caller's mapping.  That last point matters: the caller's mapping
holds the checkpoint's outputs, so a reference back would be a cycle through
the autograd graph that Python's collector cannot see (the mapping, and every
activation it holds, would never be freed).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hotfix.patches._checkpoint_outputs import holds_tensor

__all__ = ["SharedStateWrites"]


def _is_mapping(value: Any) -> bool:
    return isinstance(value, MutableMapping)


class SharedStateWrites:
    """A layer call that hands on what it stores into the mappings it is handed."""

    def __init__(self, function: Callable, live: Dict[int, MutableMapping]) -> None:
        self.__wrapped__ = function  # what the layer call is (other wrappers look through us)
        self._live = live  # id(copy handed to the layer) -> the caller's mapping; forward only
        self.calls = 0
        # Of the latest call: (caller's mapping or None in a recomputation, key, value) for every
        # stored value holding a tensor, until FlatOutputs takes it.
        self._written: List[Tuple[Optional[MutableMapping], Any, Any]] = []

    def take(self) -> List[Tuple[Optional[MutableMapping], Any, Any]]:
        """What the latest call stored, handed over once (so nothing here keeps a mapping alive)."""
        written, self._written = self._written, []
        return written

    @classmethod
    def around(cls, function: Callable, inputs: Sequence[Any]) -> Optional[Tuple["SharedStateWrites", Callable, tuple]]:
        """``(watcher, function, inputs)`` to checkpoint instead, or None when no mutable mapping is handed over.

        Every mutable mapping in ``inputs`` or bound in a ``functools.partial``
        is replaced by its copy.  A partial keeps its shape (its ``func`` is
        watched), so that its bound tensors can still be lifted into inputs.
        """
        if isinstance(function, functools.partial):
            bound_args, bound_keywords, target = function.args, function.keywords, function.func
        else:
            bound_args, bound_keywords, target = (), {}, function
        values = list(bound_args) + list(bound_keywords.values()) + list(inputs)
        if not any(_is_mapping(value) for value in values):
            return None
        live: Dict[int, MutableMapping] = {}
        copies: Dict[int, MutableMapping] = {}
        try:
            for value in values:
                if _is_mapping(value) and id(value) not in copies:
                    twin = copy.copy(value)
                    copies[id(value)] = twin
                    live[id(twin)] = value
        except Exception:  # a mapping that cannot be copied: the call is made as it was
            return None

        def swap(value: Any) -> Any:
            return copies[id(value)] if _is_mapping(value) else value

        watcher = cls(target, live)
        new_inputs = tuple(swap(value) for value in inputs)
        if target is function:
            return watcher, watcher, new_inputs
        new_function = functools.partial(watcher, *[swap(v) for v in bound_args],
                                         **{k: swap(v) for k, v in bound_keywords.items()})
        return watcher, new_function, new_inputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls > 1:  # a recomputation: what the forward kept stays as it is
            args = tuple(copy.copy(a) if _is_mapping(a) else a for a in args)
            kwargs = {k: copy.copy(v) if _is_mapping(v) else v for k, v in kwargs.items()}
        mappings = [v for v in list(args) + list(kwargs.values()) if _is_mapping(v)]
        before = [dict(mapping) for mapping in mappings]
        output = self.__wrapped__(*args, **kwargs)
        written = []
        for mapping, old in zip(mappings, before):
            caller = self._live.get(id(mapping))
            for key, value in list(mapping.items()):
                if key in old and old[key] is value:
                    continue
                if holds_tensor(value):
                    written.append((caller, key, value))
                elif caller is not None:
                    caller[key] = value
            if caller is not None:
                for key in old.keys() - mapping.keys():
                    caller.pop(key, None)
                mapping.clear()  # back to what the forward saw, for the recomputation
                mapping.update(old)
        self._live = {}  # nothing kept refers to the caller's mappings
        self._written = written
        return output
