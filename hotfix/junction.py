"""One wrapper where several fixes wrap the same attribute, their hooks run in a declared order.

Three fixes wrap torch's ``CheckpointFunction.apply``, two its non-reentrant generator, three unsloth-zoo's
``UnslothCheckpointFunction.apply``.  Stacked as one wrapt ``FunctionWrapper`` each, every call bound every
layer again (three on a classmethod: 7.07 µs a call against 1.26 µs for one junction running the same three hooks,
docs/performance.md) and the order was the order the fixes happened to apply in.
A :class:`Junction` is one ``FunctionWrapper`` around the original: bound once per call, it runs the joined
hooks (wrapt wrappers, ``(wrapped, instance, args, kwargs)``) outermost first, each handing the next its call.
The order is data (``hotfix.relations.JOIN_ORDER``; a fix it does not name goes innermost, by name).

Each fix joins through its own ledger (``Patch.join``): the junction standing there is replaced by one that
also holds the new hook, so a fix's revert puts back exactly the junction (or original) it found, ``is``-identical,
newest first as fixes revert.  Joining twice (a re-applied fix) changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import wrapt

Hook = Callable[[Any, Any, tuple, dict], Any]


def _chained(outer: Hook, inner: Hook) -> Hook:
    def chained(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return outer(lambda *a, **k: inner(wrapped, instance, a, k), instance, args, kwargs)

    return chained


class Junction(wrapt.FunctionWrapper):
    """``original`` wrapped once; calls run ``hooks`` (``((fix name, hook), ...)``, outermost first)."""

    def __init__(self, original: Any, hooks: Tuple[Tuple[str, Hook], ...]) -> None:
        chain = hooks[-1][1]
        for _, hook in reversed(hooks[:-1]):
            chain = _chained(hook, chain)
        super().__init__(original, chain)
        self._self_hooks = hooks  # wrapt keeps ``_self_`` attributes on the proxy, not on what it wraps

    @property
    def hooks(self) -> Tuple[Tuple[str, Hook], ...]:
        return self._self_hooks

    @property
    def original(self) -> Any:
        return self.__wrapped__


def joined(owner: Any, attribute: str, name: str, hook: Hook, rank: Callable[[str], Tuple[int, str]]) -> Any:
    """The object to put on ``owner.attribute`` so that ``hook`` (of fix ``name``) runs there at ``rank(name)``
    (sorted ascending: outermost first), or what stands there already where it holds this fix's hook."""
    present = owner.__dict__.get(attribute) if hasattr(owner, "__dict__") else None
    if isinstance(present, Junction):
        if any(joined_name == name for joined_name, _ in present.hooks):
            return present
        original, hooks = present.original, present.hooks
    else:
        _, _, original = wrapt.resolve_path(owner, attribute)  # a classmethod as the descriptor it is
        hooks = ()
    return Junction(original, tuple(sorted(hooks + ((name, hook),), key=lambda item: rank(item[0]))))


def hooks_on(value: Any) -> Tuple[str, ...]:
    """The fixes whose hooks run in ``value`` (a junction), outermost first; () for anything else."""
    return tuple(name for name, _ in value.hooks) if isinstance(value, Junction) else ()
