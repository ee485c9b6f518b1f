"""A class-level stand-in for ``module._gradient_checkpointing_func`` that wraps it on read.

transformers stores the checkpoint function on each checkpointing module and reads it back
at every checkpointed call.  A fix that stored its own wrapper there would put a hotfix
object inside the user's model (deepcopy, pickle, ``torch.save``, EMA copies, spawned
workers would carry it).  A data descriptor on the module's class wins over the instance
``__dict__``, so the model keeps exactly what transformers stored and every read, on the
original or a copy, returns it wrapped.  Slots of several fixes on one class's MRO compose
in a fixed order (by ``rank``, outermost highest), whichever classes hold them; each fix
installs and reverts only its own.  Under ``torch.compile`` the raw function is handed out:
dynamo traces the checkpoint itself, where the reentrant bugs do not exist.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterator, Optional, Tuple

import wrapt

ATTRIBUTE = "_gradient_checkpointing_func"


def code_objects(function: Any) -> Iterator[types.CodeType]:
    """The code of ``function`` and every code object nested in it (for drift checks)."""
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def slots_on(cls: type) -> Tuple["CheckpointFunctionSlot", ...]:
    """Every slot along ``cls``'s MRO, innermost (lowest rank) first."""
    found = [klass.__dict__.get(ATTRIBUTE) for klass in cls.__mro__]
    return tuple(sorted((slot for slot in found if isinstance(slot, CheckpointFunctionSlot)), key=lambda s: s.rank))


class CheckpointFunctionSlot:
    """Data descriptor for ``ATTRIBUTE`` on ``owner``: reads return the stored function wrapped."""

    def __init__(self, owner: type, wrapper: Callable, is_compiling: Callable[[], bool], rank: int) -> None:
        self.owner = owner
        self.wrapper = wrapper  # a wrapt wrapper function (wrapped, instance, args, kwargs)
        self.rank = rank
        self._is_compiling = is_compiling
        # Every module of a model holds the same function object, so one cached
        # (function, slots, wrapper) triple serves them all.
        self._cache: tuple = (None, None, None)

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        raw = instance.__dict__.get(ATTRIBUTE)
        if raw is None or self._is_compiling():
            # Unset reads as None, not AttributeError: a class attribute shows in dir(), and code that
            # getattr()s everything dir() lists (dynamo's graph assembly does) must not fail on it.
            return raw
        slots = slots_on(type(instance))
        cached_raw, cached_slots, cached_wrapper = self._cache
        if cached_raw is raw and cached_slots == slots:
            return cached_wrapper
        wrapper = raw
        for slot in slots:
            wrapper = wrapt.FunctionWrapper(wrapper, slot.wrapper)
        self._cache = (raw, slots, wrapper)
        return wrapper

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[ATTRIBUTE] = value

    def __delete__(self, instance: Any) -> None:
        try:
            del instance.__dict__[ATTRIBUTE]
        except KeyError:
            raise AttributeError(ATTRIBUTE) from None
