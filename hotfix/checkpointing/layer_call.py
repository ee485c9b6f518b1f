"""Which layer a checkpointed call runs, and hotfix's wrappers of that call showing it as the call does.

A checkpoint function is handed the layer's call: a bound ``layer.__call__`` / ``super().__call__``, a
``partial`` of one (transformers 4.52+), ``partial(forward, layer)`` (5.x), a model's own
``custom_forward(module)`` closure.  :func:`modules_called` is the one lookup of the modules behind such a
call, for every fix that needs the layer (frozen inputs, DDP, the forks' checkpoints, the wrappers below):
breadth first, nearest first and never into a module, through partials (the modules among their bound
arguments, then their function), ``__self__`` (bound methods; hotfix's wrappers: the nearest layer of the call
they were handed), ``__wrapped__`` chains and closure cells (a module, a callable, or a tuple / list of modules: a
sequence's segment runner).  :func:`layer_of` is the nearest of them.

hotfix's fixes hand the checkpoint function their own wrapper of the call instead (``FlatOutputs``,
``SharedStateWrites``; the lifting, anchor and DDP closures, each in a :class:`ShownCall`), and third-party
checkpoint functions read the layer from what they are handed (LlamaFactory's wrapper reads
``function.__self__`` to checkpoint trainable layers only).  So each wrapper (:class:`LayerCallWrapper`)
shows identity, nothing more: ``__wrapped__`` (the call it wraps) and ``__self__`` (the layer, looked up
when read; absent where none is found, as on the call).  Never ``func``/``args``/``keywords``:
a checkpoint function re-making the call from them would run the layer without the wrapper (lifted inputs,
anchor, parameter twins).  One that calls ``__self__`` in place of the function it is handed (axolotl's
offload wrappers) bypasses the wrapper just the same: axolotl-offload-checkpoint replaces those wrappers.
A wrapper is handed what the one it wraps knows when it is made (the caller's call, the inputs hotfix added to it):
a fix further in reads that, never stepping through the wrappers of the fixes outside it (issue 52).
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable, Iterator, List, Optional, Tuple

from torch import nn

__all__ = ["LayerCallWrapper", "ShownCall", "inputs_added", "layer_call", "layer_of", "modules_called",
           "modules_maybe_called"]

#: how many objects one lookup looks at (partials of partials, wrappers of wrappers, closures of closures)
SEARCH_LIMIT = 32


def _modules(function: Any, sequences: Optional[set] = None) -> Iterator[nn.Module]:
    """The modules behind ``function``; those found in a tuple / list of a closure have their ids added to
    ``sequences`` where given (a segment runner may call any of them, not each)."""
    pending, seen = deque((function,)), set()
    while pending and len(seen) < SEARCH_LIMIT:
        item = pending.popleft()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, nn.Module):
            yield item
            continue
        if isinstance(item, functools.partial):
            pending.extend(arg for arg in item.args if isinstance(arg, nn.Module))  # 5.x: partial(forward, layer)
            pending.append(item.func)
            continue
        owner = getattr(item, "__self__", None)  # bound layer.__call__ / super().__call__, a hotfix wrapper
        if isinstance(owner, nn.Module):
            pending.append(owner)
            continue
        inner = getattr(item, "__wrapped__", None)  # a wrapper naming what it wraps (functools.wraps, wrapt)
        if inner is not None:
            pending.append(inner)
        for cell in getattr(item, "__closure__", None) or ():  # a model's custom_forward(module)
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, nn.Module) or (callable(value) and not isinstance(value, type)):
                pending.append(value)
            elif isinstance(value, (tuple, list)):
                # a segment runner over a sequence of blocks (timm's checkpoint_seq closes over them as a tuple):
                # each block is a module it may call, counted apart from the search limit (a model has many)
                for block in value:
                    if isinstance(block, nn.Module) and id(block) not in seen:
                        seen.add(id(block))
                        if sequences is not None:
                            sequences.add(id(block))
                        yield block


def modules_called(function: Any) -> List[nn.Module]:
    """The ``nn.Module`` objects the checkpointed ``function`` calls, nearest first, found without calling it."""
    return list(_modules(function))


def modules_maybe_called(function: Any) -> Tuple[List[nn.Module], List[nn.Module]]:
    """``(modules_called(function), those of them a segment runner holds in a sequence)``: the call may run any
    of the latter, not necessarily each (timm's ``checkpoint_seq`` closes over every block, runs a few)."""
    sequences: set = set()
    found = list(_modules(function, sequences))
    return found, [module for module in found if id(module) in sequences]


def layer_of(function: Any) -> Optional[nn.Module]:
    """The layer whose call ``function`` is (the nearest module :func:`modules_called` finds), or None; a hotfix
    wrapper's, looked up once per call (:attr:`LayerCallWrapper.shown_layer`)."""
    if isinstance(function, LayerCallWrapper):
        return function.shown_layer
    return next(_modules(function), None)


#: what a wrapper of a call that added no input holds as ``added_inputs``
NOTHING_ADDED: frozenset = frozenset()
#: a wrapper's layer not looked up yet
_NOT_LOOKED_UP = object()


def layer_call(function: Any) -> Any:
    """The caller's layer call (a partial, where it is one) behind ``function``: what the outermost hotfix wrapper
    was handed (:attr:`LayerCallWrapper.shown`), inside the ``__wrapped__`` of other wrappers (a ``functools.wraps``
    or wrapt wrapper of the call; at most :data:`SEARCH_LIMIT`)."""
    for _ in range(SEARCH_LIMIT):
        if isinstance(function, LayerCallWrapper):
            function = function.shown
        inner = getattr(function, "__wrapped__", None) if not isinstance(function, functools.partial) else None
        if inner is None or inner is function:
            return function
        function = inner
    return function


class LayerCallWrapper:
    """Base of hotfix's wrappers of a layer call: ``__wrapped__`` (the call it wraps), ``__self__`` (the layer).

    Each wrapper is handed the facts of the call it wraps when it is made (:meth:`_wrap`), so that no fix steps
    through another's wrappers to read them: ``shown``, the call the outermost of them was handed (the caller's:
    :func:`layer_call`, ``__self__``), and ``added_inputs``, the ids of the inputs hotfix's rewrites of it put beside
    the caller's (:func:`inputs_added`).
    The layer (:attr:`shown_layer`, ``__self__``) is looked up when first read, not when a wrapper is made (most
    checkpointed calls are never asked), and handed on with the rest to a wrapper made of this one after that: one
    lookup per call where two fixes ask (frozen-inputs' anchor, then the DDP fix).
    """

    __slots__ = ("__wrapped__", "shown", "added_inputs", "_found_layer")
    #: True where the fix that made the wrapper found no tensor needing grad reaching the layer but the top-level
    #: positional inputs handed with it (``structure.hides_nothing``, or its search of the partial found none): a fix
    #: further in need not search the call for tensors needing grad
    no_hidden_grad = False

    def _wrap(self, function: Callable, added: Tuple[Any, ...] = ()) -> None:
        self.__wrapped__ = function
        if isinstance(function, LayerCallWrapper):
            self.shown, inner, self._found_layer = function.shown, function.added_inputs, function._found_layer
        else:
            self.shown, inner, self._found_layer = function, NOTHING_ADDED, _NOT_LOOKED_UP
        self.added_inputs = inner.union(map(id, added)) if added else inner

    @property
    def shown_layer(self) -> Optional[nn.Module]:
        """The nearest layer of the caller's call (:func:`layer_of` of ``shown``), or None."""
        layer = self._found_layer
        if layer is _NOT_LOOKED_UP:
            layer = self._found_layer = layer_of(self.shown)
        return layer

    @property
    def __self__(self) -> nn.Module:
        layer = self.shown_layer
        if layer is None:
            raise AttributeError("__self__")  # as on a call that shows no layer
        return layer


class ShownCall(LayerCallWrapper):
    """``run``, a function that calls ``function`` in some other way (a call rewrite), showing its layer.

    ``added``: the inputs this rewrite put beside the caller's (lifted keyword tensors, an anchor, parameters): their
    ids join ``added_inputs``, so that a fix further in can tell the caller's inputs from hotfix's
    (:func:`inputs_added`).
    """

    __slots__ = ("_run",)

    def __init__(self, run: Callable, function: Any, added: Tuple[Any, ...] = ()) -> None:
        self._run = run
        self._wrap(function, added)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<hotfix {getattr(self._run, '__name__', 'call')} of {self.__wrapped__!r}>"


def inputs_added(function: Any) -> frozenset:
    """The ids of the inputs hotfix's rewrites of ``function`` put beside the caller's (``added_inputs``, handed down
    from wrapper to wrapper as each was made); none for a call hotfix did not wrap."""
    return function.added_inputs if isinstance(function, LayerCallWrapper) else NOTHING_ADDED
