"""A class-level stand-in for ``module._gradient_checkpointing_func`` that wraps it on read.

Why a descriptor on the class, not a wrapper in the instance
------------------------------------------------------------
transformers stores the checkpoint function on every checkpointing module
(``module._gradient_checkpointing_func = partial(checkpoint, ...)``) and reads
it back at each checkpointed call.  A fix that stored its own wrapper there
would put a hotfix object inside the user's model: ``copy.deepcopy``,
``pickle``, ``torch.save(model)``, EMA copies and spawn-based workers would all
carry (or choke on) it.  A data descriptor on a class wins over the instance
``__dict__`` for reads and writes alike, so with :class:`CheckpointFunctionSlot`
the model holds exactly what transformers put there, and every read, on the
original or on any copy, returns that function wrapped by the fix.

Two fixes use it on different classes (``GradientCheckpointingLayer`` and
``torch.nn.Module``).  Python would see only the one nearest in the MRO, so
each slot reads its value through the next slot further up the MRO (or the
instance ``__dict__`` when there is none): the wrappers compose, and each fix
still installs and reverts only its own class attribute.

Under ``torch.compile`` the slot hands out the raw function: dynamo traces
``torch.utils.checkpoint`` as its own higher-order op (inputs, closures and
parameters all tracked), where none of the reentrant bugs exist, and a wrapt
wrapper would only be a graph break.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterator, Optional

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


def _is_slot(value: Any) -> bool:
    kind = type(value)
    return hasattr(kind, "__get__") and hasattr(kind, "__set__")


class CheckpointFunctionSlot:
    """Data descriptor for ``ATTRIBUTE`` on ``owner``: reads return the stored function wrapped."""

    def __init__(self, owner: type, wrapper: Callable, is_compiling: Callable[[], bool]) -> None:
        self.owner = owner
        self.wrapper = wrapper  # a wrapt wrapper function (wrapped, instance, args, kwargs)
        self._is_compiling = is_compiling
        # Every module of a model holds the same function object, so one cached
        # (function, wrapper) pair serves them all.
        self._cache: tuple = (None, None)

    def _stored(self, instance: Any) -> Any:
        """The value below this slot: the next slot up the MRO, else the instance's own (None if unset)."""
        mro = type(instance).__mro__
        start = mro.index(self.owner) + 1 if self.owner in mro else len(mro)
        for klass in mro[start:]:
            value = klass.__dict__.get(ATTRIBUTE)
            if value is not None and _is_slot(value):
                return value.__get__(instance, type(instance))
        return instance.__dict__.get(ATTRIBUTE)

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        if self._is_compiling():
            # Checked first, so dynamo traces one dict lookup and nothing of hotfix.
            return instance.__dict__.get(ATTRIBUTE)
        # An unset attribute reads as None, not AttributeError: a class attribute
        # shows in dir(), and code that getattr()s everything dir() lists
        # (dynamo's own graph assembly does) must not fail on it.
        raw = self._stored(instance)
        if raw is None:
            return None
        cached_raw, cached_wrapper = self._cache
        if cached_raw is raw:
            return cached_wrapper
        wrapper = wrapt.FunctionWrapper(raw, self.wrapper)
        self._cache = (raw, wrapper)
        return wrapper

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[ATTRIBUTE] = value

    def __delete__(self, instance: Any) -> None:
        try:
            del instance.__dict__[ATTRIBUTE]
        except KeyError:
            raise AttributeError(ATTRIBUTE) from None
