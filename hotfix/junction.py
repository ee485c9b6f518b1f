"""One wrapper where several fixes wrap the same attribute, their hooks run in a declared order.

Three fixes wrap torch's ``CheckpointFunction.apply``, three its non-reentrant generator, three unsloth-zoo's
``UnslothCheckpointFunction.apply``.  Stacked as one wrapt ``FunctionWrapper`` each, every call bound every
layer again (three on a classmethod: 7.07 µs a call against 1.26 µs for one junction running the same three hooks,
docs/performance.md) and the order was the order the fixes happened to apply in.
A :class:`Junction` is one ``FunctionWrapper`` around the original: bound once per call, it runs the joined
hooks (wrapt wrappers, ``(wrapped, instance, args, kwargs)``) outermost first, each handing the next its call.
A hook may carry ``idle(instance, args, kwargs)``: True where it would hand that call on unchanged (the hook
itself asks it first, so the two cannot disagree); where every hook carries one and all are idle, the junction
calls the original directly.
The order is data (``hotfix.relations.JOIN_ORDER``; a fix it does not name goes innermost, by name).

Each fix joins through its own ledger (``Patch.join``): the junction standing there is replaced by one that
also holds the new hook.  A fix's revert takes out its own hook only (:func:`leave`), in whatever order the fixes
revert: the junction that stood before it joined where that one holds exactly the hooks left (so newest first
gives back each junction ``is``-identical), and once no hook is left, what stood there before the first joined
(the original, or nothing: an inherited attribute).  Stacked wrappers could not: reverting one fix put back what
it had found and dropped every wrapper put on after it.  Joining twice (a re-applied fix) changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import wrapt

Hook = Callable[[Any, Any, tuple, dict], Any]


def _with_idle_path(chains: Tuple[Hook, ...], idles: Tuple[Callable[[Any, tuple, dict], bool], ...]) -> Hook:
    """The chain from the first hook that would not hand this call on as it is (``hook.idle(instance, args, kwargs)``),
    outermost first; where every hook would, the original, called once, with no hook's frame in between (the common
    call: no DDP, no ``preserve_rng_state=False``, no router; ~2 µs a hook otherwise, tools/hotfix_lab/bench/wrapper_cost.py).
    ``chains[i]``: the hooks from the i-th inward.  Only the outer idle hooks are left out: an inner one is asked again
    by the chain, about the call as the hooks before it changed it."""
    def run(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        for idle, chain in zip(idles, chains):
            if not idle(instance, args, kwargs):
                return chain(wrapped, instance, args, kwargs)
        return wrapped(*args, **kwargs)

    return run


def _chained(outer: Hook, inner: Hook) -> Hook:
    def chained(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return outer(lambda *a, **k: inner(wrapped, instance, a, k), instance, args, kwargs)

    return chained


_ABSENT = object()  # the owner did not define the attribute itself (an inherited classmethod)


class Junction(wrapt.FunctionWrapper):
    """``original`` wrapped once; calls run ``hooks`` (``((fix name, hook), ...)``, outermost first).  ``before``:
    what the owner's own ``__dict__`` held before the first junction; ``previous``: the junction this one replaced."""

    def __init__(self, original: Any, hooks: Tuple[Tuple[str, Hook], ...], before: Any = _ABSENT,
                 previous: Optional["Junction"] = None) -> None:
        chains = [hooks[-1][1]]  # the hooks from each one inward, innermost first
        for _, hook in reversed(hooks[:-1]):
            chains.append(_chained(hook, chains[-1]))
        chains.reverse()
        chain = chains[0]
        idles = tuple(getattr(hook, "idle", None) for _, hook in hooks)
        if all(idle is not None for idle in idles):
            chain = _with_idle_path(tuple(chains), idles)
        super().__init__(original, chain)
        # wrapt keeps ``_self_`` attributes on the proxy, not on what it wraps
        self._self_hooks, self._self_before, self._self_previous = hooks, before, previous

    @property
    def hooks(self) -> Tuple[Tuple[str, Hook], ...]:
        return self._self_hooks

    @property
    def original(self) -> Any:
        return self.__wrapped__


def joined(owner: Any, attribute: str, name: str, hook: Hook, rank: Callable[[str], Tuple[int, str]]) -> Any:
    """The object to put on ``owner.attribute`` so that ``hook`` (of fix ``name``) runs there at ``rank(name)``
    (sorted ascending: outermost first), or what stands there already where it holds this fix's hook."""
    present = owner.__dict__.get(attribute, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
    if isinstance(present, Junction):
        if any(joined_name == name for joined_name, _ in present.hooks):
            return present
        original, hooks, before = present.original, present.hooks, present._self_before
    else:
        _, _, original = wrapt.resolve_path(owner, attribute)  # a classmethod as the descriptor it is
        hooks, before = (), present
    hooks = tuple(sorted(hooks + ((name, hook),), key=lambda item: rank(item[0])))
    return Junction(original, hooks, before, present if isinstance(present, Junction) else None)


def leave(owner: Any, attribute: str, name: str) -> None:
    """Take fix ``name``'s hook out of the junction on ``owner.attribute`` (module docstring); nothing where it is
    not there (another change replaced the junction meanwhile)."""
    present = owner.__dict__.get(attribute)
    if not isinstance(present, Junction) or name not in hooks_on(present):
        return
    left = tuple(item for item in present.hooks if item[0] != name)
    if not left:
        before = present._self_before
        if before is _ABSENT:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, before)
        return
    previous = present._self_previous
    while previous is not None and previous.hooks != left:
        previous = previous._self_previous
    setattr(owner, attribute, previous if previous is not None else Junction(
        present.original, left, present._self_before, present._self_previous))


def hooks_on(value: Any) -> Tuple[str, ...]:
    """The fixes whose hooks run in ``value`` (a junction), outermost first; () for anything else."""
    return tuple(name for name, _ in value.hooks) if isinstance(value, Junction) else ()
