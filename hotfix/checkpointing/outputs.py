"""Let a reentrant checkpoint return tensors nested in containers, connected, and no gradient for unused ones.

Reentrant checkpointing connects only the *top-level* tensors a layer returns: pvt_v2's stages
return ``((hidden,), height, width)`` and every parameter before the last stage gets no gradient.
:class:`FlatOutputs` runs the layer and, when its output nests a tensor (or the layer wrote into a
shared mapping, ``checkpointing.shared_state``), returns all of them as one flat tuple, remembering
the structure without the tensors; :meth:`FlatOutputs.rebuild` puts the checkpoint's connected
outputs back into it and replays the mapping writes.  Only a tuple is the top level: a layer
returning a list or a mapping has every tensor cut off.  The engine hands a Function zeros for an
output the loss never used, so the recomputation gave its producers zero gradients where a run
without checkpointing leaves None (LiLT's last layout stream): :meth:`FlatOutputs.watch_unused`
hooks the outputs and the recomputation returns such an output detached.  That changes a result
only where a parameter is reached through nothing else (attention weights returned beside the
hidden states reach the same parameters as the hidden states do): the notice is given only when,
at the end of that backward, such a parameter has no gradient (:func:`_notice_if_left_without`).
docs/fixes/transformers-checkpoint-layer-io.md.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, List, Optional, Sequence, Set

import torch

from hotfix.checkpointing.layer_call import LayerCallWrapper
from hotfix.checkpointing.structure import holds_tensor, is_tensor, rebuild

__all__ = ["FlatOutputs"]


class _Leaf:
    """Marks where a tensor stood in a remembered output structure."""

    __slots__ = ()


_LEAF = _Leaf()


def _has_nested_tensor(value: Any) -> bool:
    """Does ``value`` hold a tensor that the checkpoint would not see (below its top level)?

    An ``autograd.Function`` connects the tensors of a returned tuple (a named tuple too); a list, a
    mapping or a Cache returned is one object to it, every tensor inside cut off.
    """
    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, tuple):
        return any(not isinstance(item, torch.Tensor) and holds_tensor(item) for item in value)
    return holds_tensor(value)


def _skeleton(value: Any, leaves: List[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a marker; the tensors appended to ``leaves`` in order."""
    return rebuild(value, is_tensor, lambda tensor: (leaves.append(tensor), _LEAF)[1])


def _fill(skeleton: Any, tensors: Iterator[torch.Tensor]) -> Any:
    return rebuild(skeleton, _is_leaf_marker, lambda _marker: next(tensors))



def _is_leaf_marker(value: Any) -> bool:
    return value is _LEAF


def _reached_only_through(dropped: Sequence[torch.Tensor], inputs: Sequence[Any]) -> List[torch.Tensor]:
    """The leaves needing grad (parameters) behind ``dropped`` that are not the call's own ``inputs``.

    Walked from the dropped outputs' graph only: these are what upstream's zeros would have reached.
    """
    own = {id(item) for item in inputs if isinstance(item, torch.Tensor)}
    stack = [tensor.grad_fn for tensor in dropped]
    seen: set = set()
    leaves: List[torch.Tensor] = []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if isinstance(variable, torch.Tensor):
            if id(variable) not in own:
                leaves.append(variable)
            continue
        stack.extend(following for following, _ in node.next_functions)
    return leaves


def _notice_if_left_without(leaves: List[torch.Tensor], notice: Callable[[], None]) -> None:
    """After this backward, ``notice()`` if one of ``leaves`` has no gradient: upstream it would have had zeros.

    A leaf that got a gradient elsewhere (the same parameter used by the outputs the loss did use, or
    by another layer) would have had it upstream too, plus zeros: the same result, nothing repaired.
    """
    def check() -> None:
        if any(leaf.grad is None for leaf in leaves):
            notice()

    try:
        torch.autograd.Variable._execution_engine.queue_callback(check)
    except RuntimeError:  # not inside a backward (a recomputation called by hand): nothing to say
        pass


class FlatOutputs(LayerCallWrapper):
    """``function`` returning its tensors as one flat tuple when its output nests them.

    Shows the layer as ``function`` does (``__self__``, ``__wrapped__``: ``checkpointing.layer_call``).

    ``writes``: the watcher of the same call, whose stored tensors become outputs too.
    ``notice``: called (at the end of that backward) when detaching an unused output left a parameter
    without the zero gradient upstream gives it; None: not asked.
    ``no_hidden_grad``: the maker found no tensor needing grad reaching the layer but the top-level positional inputs
    handed with it.
    """

    # slots: one is made per checkpointed call (the common call pays for its making, tools/hotfix_lab/bench/wrapper_cost.py);
    # ``__dict__`` made only where a checkpoint function sets an attribute of its own on the function it is handed
    __slots__ = ("_writes", "_notice", "_skeleton", "_replay", "_unused", "nested", "no_hidden_grad", "__weakref__",
                 "__dict__")

    def __init__(self, function: Callable, writes: Optional[Any] = None,
                 notice: Optional[Callable[[], None]] = None, no_hidden_grad: bool = False) -> None:
        self._wrap(function)  # what the layer call is (checkpoint functions look through us; fixes read ``shown``)
        self.no_hidden_grad = no_hidden_grad
        self._writes = writes
        self._notice = notice
        self._skeleton: Any = None
        self._replay: Any = None  # the forward's writes into shared mappings, replayed by rebuild()
        # checkpoint outputs that got no gradient (set by hooks in backward; made by the first such hook)
        self._unused: Optional[Set[int]] = None
        self.nested: Optional[bool] = None  # decided by the first call: the checkpoint's forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.__wrapped__(*args, **kwargs)
        written = self._writes.take() if self._writes is not None else None
        if self.nested is None:
            # a lone tensor (the usual layer output) nests nothing: answered before the call
            self.nested = (not isinstance(output, torch.Tensor) and _has_nested_tensor(output)
                           or bool(written is not None and written.changed))
            if self.nested:
                self._skeleton = _skeleton(output, [])
                self._replay = written
        if self.nested:
            leaves: List[torch.Tensor] = []
            _skeleton(output, leaves)
            output = tuple(leaves + (written.tensors if written is not None else []))
        if self._unused and isinstance(output, tuple):  # only ever set in backward: this is the recomputation
            unused, self._unused = self._unused, None
            dropped = [item for i, item in enumerate(output) if i in unused and isinstance(item, torch.Tensor)]
            if self._notice is not None:
                leaves = _reached_only_through(dropped, args)
                if leaves:
                    _notice_if_left_without(leaves, self._notice)
            output = tuple(item.detach() if i in unused and isinstance(item, torch.Tensor) else item
                           for i, item in enumerate(output))
        return output

    def watch_unused(self, result: Any) -> None:
        """Hook the checkpoint's outputs (``result``, as it returned them) to learn which get no gradient.

        Only where two or more need grad: a single one that got none means the
        checkpoint's backward never runs at all.
        """
        if not isinstance(result, tuple):
            return
        outputs = [(i, item) for i, item in enumerate(result)
                   if isinstance(item, torch.Tensor) and item.requires_grad and item.grad_fn is not None]
        if len(outputs) < 2:
            return
        for position, tensor in outputs:
            tensor.register_hook(functools.partial(self._received, position))

    def _received(self, position: int, grad: Optional[torch.Tensor]) -> None:
        # Every output's hook runs (with None where nothing arrived) before the checkpoint's backward.
        if grad is None:
            if self._unused is None:
                self._unused = set()
            self._unused.add(position)
        elif self._unused is not None:
            self._unused.discard(position)

    def rebuild(self, result: Any) -> Any:
        """What the layer returned, its tensors now the checkpoint's (connected) outputs.

        What the layer wrote into shared mappings is replayed onto them, its new tensors connected.
        """
        if not self.nested:
            return result
        tensors = iter(result if isinstance(result, tuple) else (result,))
        output = _fill(self._skeleton, tensors)
        replay, self._replay = self._replay, None  # the checkpoint keeps this object until backward
        if replay is not None:
            replay.apply(list(tensors))
        return output
