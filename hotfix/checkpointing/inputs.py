"""Make every tensor that needs a gradient a real input of a reentrant checkpoint call.

Reentrant checkpointing (torch's ``use_reentrant=True``, unsloth's ``UnslothCheckpointFunction``)
is an ``autograd.Function``: only tensors passed to it positionally are inputs of its node.
transformers calls ``checkpoint(partial(layer, **kwargs), *args)``, so a tensor needing grad that
arrives by keyword, inside a container, in a shared mapping or in a transformers ``Cache``
(``cache.layers[i].keys`` / ``.values``) hides from it, and every recomputation re-walks its
history ("Trying to backward through the graph a second time").  ``lift_closure_tensors`` rewrites
the call so that those tensors travel as extra positional inputs; the checkpoint's forward calls
the layer with the original objects, the recomputation with rebuilt copies holding the inputs'
twins (``checkpointing.structure.rebuild``: containers and caches copied, so the recomputation never writes
into the caller's).  What counts as a container is ``checkpointing.structure``'s one definition.
:func:`anchored` adds a 0-byte input needing grad, for the fixes that must make a checkpoint node
exist (or make its first input need grad).  Both show the layer as the call does (``checkpointing.layer_call``).
docs/fixes/transformers-checkpoint-layer-io.md.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from hotfix.checkpointing.layer_call import ShownCall
from hotfix.checkpointing.slot import STORED_MODE, non_reentrant
from hotfix.checkpointing.structure import find_grad_tensors, hides_nothing, is_tensor, rebuild

__all__ = ["anchored", "first_input_needs_grad", "lift_closure_tensors", "find_grad_tensors", "hides_nothing",
           "is_reentrant"]


def is_reentrant(checkpoint: Any, kwargs: dict) -> bool:
    """False only where the call is known to be non-reentrant (which has none of these problems).

    ``checkpoint`` is the function a layer holds (transformers stores
    ``partial(checkpoint, use_reentrant=...)``); torch's default (None) is reentrant.
    """
    value = kwargs.get("use_reentrant")
    if value is None:
        # A layer of a composed call holds the stored function's mode (``slot.STORED_MODE``, set where the call was
        # composed); the innermost fix is handed the stored function itself, which the rule reads directly.  Another
        # wrapper (a proxy answering for what it wraps) is asked by the same rule.
        stored = getattr(checkpoint, STORED_MODE, None)
        return not non_reentrant(checkpoint) if stored is None else stored
    return bool(value)


def _substitute(value: Any, replacement: dict) -> Any:
    """``value`` rebuilt with each lifted tensor swapped for its recomputation twin (in caches too)."""
    return rebuild(value, is_tensor, lambda tensor: replacement.get(id(tensor), tensor))


def anchored(function: Callable, inputs: Sequence[Any], first: bool = False) -> Tuple[Callable, Tuple[Any, ...]]:
    """``(function', inputs')``: ``inputs`` with a 0-byte leaf needing grad added, dropped again before ``function``.

    Last by default; ``first`` where the checkpoint's backward returns gradients for its later
    inputs only when the first one needs grad (``checkpointing.unsloth.FirstInputRule``).
    """
    device = next((item.device for item in inputs if isinstance(item, torch.Tensor)), None)
    anchor = torch.empty(0, device=device, requires_grad=True)
    if first:
        def run_after_anchor(_anchor, *all_inputs):
            return function(*all_inputs)

        return ShownCall(run_after_anchor, function, (anchor,)), (anchor, *inputs)
    count = len(inputs)

    def run_without_anchor(*all_inputs):
        return function(*all_inputs[:count])

    return ShownCall(run_without_anchor, function, (anchor,)), (*inputs, anchor)


def first_input_needs_grad(inputs: Sequence[Any]) -> bool:
    """Is a checkpoint call's first input a tensor that needs grad?"""
    first = inputs[0] if inputs else None
    return isinstance(first, torch.Tensor) and first.requires_grad


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

    return ShownCall(run_with_lifted_inputs, function, tuple(lifted)), tuple(args) + tuple(lifted)
