"""Which checkpointed region a call runs in, and whether it is that region's forward or a recomputation.

A checkpoint runs its function twice: once in the forward (no activations kept) and again in the backward, to
remake them.  Whatever the recomputation decides differently from the forward (an MoE router choosing another
expert on a GPU's last-bit drift) is a silent error or a CheckpointError.  One object per checkpointed call, a
:class:`Region`, holds what its forward decided; the call sites enter it, and code inside asks :func:`regions`
whether it runs in a forward (record) or a recomputation (replay).

Every call site enters it the same two ways: where an implementation calls one function object for both runs
(torch's reentrant ``CheckpointFunction``, DeepSpeed's, unsloth-zoo's), that object becomes a :class:`RegionCall`
(its first call is the forward, every later one a recomputation); torch's non-reentrant checkpoint runs the
forward and the recomputation apart, under the two context managers its ``context_fn`` returns:
:func:`with_phases` puts a region's around the user's.  ``hotfix.patches.moe_routing_replay`` installs both.

Regions nest (a checkpoint inside a checkpointed call): :func:`regions` is the stack, outermost first, per thread
and task (a ``ContextVar``: the autograd engine's own threads set theirs when they enter).
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, List, Tuple

from hotfix.checkpointing.layer_call import LayerCallWrapper

FORWARD = "forward"
RECOMPUTE = "recompute"

#: the regions a call runs in, outermost first: ``(region, phase)`` pairs
_STACK: "contextvars.ContextVar[Tuple[Tuple[Region, str], ...]]" = contextvars.ContextVar(
    "hotfix_checkpoint_regions", default=())


def regions() -> Tuple[Tuple["Region", str], ...]:
    """The checkpointed regions this code runs in, outermost first, each with its phase (``FORWARD``/``RECOMPUTE``)."""
    return _STACK.get()


class Region:
    """One checkpointed call: what its forward decided (``records``, in order) and how far a recomputation has read."""

    __slots__ = ("records", "cursor", "__weakref__")

    def __init__(self) -> None:
        self.records: List[Any] = []
        self.cursor = 0

    def enter(self, phase: str) -> contextvars.Token:
        if phase == RECOMPUTE:
            self.cursor = 0  # every recomputation reads the forward's record from its start
        return _STACK.set(_STACK.get() + ((self, phase),))

    @staticmethod
    def leave(token: contextvars.Token) -> None:
        try:
            _STACK.reset(token)
        except (ValueError, RuntimeError):  # left from another context (a generator closed by the collector)
            pass

    def next_record(self) -> Any:
        """The forward's next record, in the order the recomputation asks; None past the end."""
        cursor = self.cursor
        self.cursor = cursor + 1
        return self.records[cursor] if cursor < len(self.records) else None


class RegionCall(LayerCallWrapper):
    """``function`` in its own region: the first call is the forward, every later call a recomputation.

    For checkpoint implementations that keep the function they ran in the forward and call it again in the
    backward.  A :class:`~hotfix.checkpointing.layer_call.LayerCallWrapper`: it shows the layer it runs.
    """

    __slots__ = ("region", "_calls")

    def __init__(self, function: Callable) -> None:
        self._wrap(function)
        self.region = Region()
        self._calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        phase = FORWARD if self._calls == 0 else RECOMPUTE
        self._calls += 1
        token = self.region.enter(phase)
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            Region.leave(token)

    def __repr__(self) -> str:
        return f"<hotfix checkpointed region of {self.__wrapped__!r}>"


class _Phase:
    """A region's phase as a context manager, around another one (the user's ``context_fn``'s); re-enterable: a
    recomputation may run more than once (``retain_graph``)."""

    __slots__ = ("region", "phase", "inner", "_tokens")

    def __init__(self, region: Region, phase: str, inner: Any) -> None:
        self.region, self.phase, self.inner = region, phase, inner
        self._tokens: List[contextvars.Token] = []

    def __enter__(self) -> Any:
        self._tokens.append(self.region.enter(self.phase))
        try:
            return self.inner.__enter__()
        except BaseException:
            Region.leave(self._tokens.pop())
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            Region.leave(self._tokens.pop())


def with_phases(context_fn: Callable[[], Tuple[Any, Any]]) -> Callable[[], Tuple[Any, Any]]:
    """torch's non-reentrant ``context_fn``, each call making a region whose phases enclose the user's contexts."""

    def region_contexts() -> Tuple[Any, Any]:
        forward_context, recompute_context = context_fn()
        region = Region()
        return _Phase(region, FORWARD, forward_context), _Phase(region, RECOMPUTE, recompute_context)

    return region_contexts
