"""Let a reentrant checkpoint return tensors nested in containers, connected to the graph.

Why this exists
---------------
Reentrant checkpointing is an ``autograd.Function``: only the tensors at the
*top level* of what its forward returns become outputs of its graph node.  A
tensor nested one level deeper is handed back as the no-grad forward computed
it: detached.  ``PvtV2EncoderLayer`` (a whole stage, checkpointed as one
``GradientCheckpointingLayer``) returns ``((hidden_states,), height, width)``,
so every stage's output leaves the graph and no parameter before the last stage
gets a gradient (measured on 4.56.2 and 5.23.0; non-reentrant checkpointing,
which does not use an ``autograd.Function``, is right).

It is the mirror of lifting closure tensors into inputs
(``_checkpoint_inputs``): :class:`FlatOutputs` runs the layer, and when its
first call (the checkpoint's forward) returns a tensor below the top level it
returns every tensor as one flat tuple instead, remembering the structure with
the tensors left out (so no activation is kept alive by it).  The
recomputation in backward flattens the same way; after the checkpoint returns,
:meth:`FlatOutputs.rebuild` puts its (now connected) tensors back into the
structure.  A call whose output is a tensor or a flat tuple is returned
exactly as the layer returned it.

Given a ``SharedStateWrites`` watcher (``_checkpoint_shared_state``), the
tensors the layer stored into a shared mapping follow the layer's own as
further outputs, and :meth:`FlatOutputs.rebuild` stores their connected
versions back into the caller's mapping.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import torch

from hotfix.patches._checkpoint_inputs import map_structure

__all__ = ["FlatOutputs", "holds_tensor"]


class _Leaf:
    """Marks where a tensor stood in a remembered output structure."""

    __slots__ = ()


_LEAF = _Leaf()


def _has_nested_tensor(value: Any) -> bool:
    """Does ``value`` hold a tensor that the checkpoint would not see (below its top level)?"""
    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, (tuple, list)):
        return any(not isinstance(item, torch.Tensor) and holds_tensor(item) for item in value)
    return holds_tensor(value)  # a dict (ModelOutput) at the top: none of its tensors is an output


def holds_tensor(value: Any) -> bool:
    """Is there a tensor in ``value`` (through tuples, lists and dicts)?"""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(holds_tensor(item) for item in value)
    if isinstance(value, dict):
        return any(holds_tensor(item) for item in value.values())
    return False


def _skeleton(value: Any, leaves: List[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a marker; the tensors appended to ``leaves`` in order."""
    return map_structure(value, _is_tensor, lambda tensor: (leaves.append(tensor), _LEAF)[1])


def _fill(skeleton: Any, tensors: Iterator[torch.Tensor]) -> Any:
    return map_structure(skeleton, _is_leaf_marker, lambda _marker: next(tensors))


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_leaf_marker(value: Any) -> bool:
    return value is _LEAF


class FlatOutputs:
    """``function`` returning its tensors as one flat tuple when its output nests them.

    ``writes``: the watcher of the same call, whose stored tensors become outputs too.
    """

    def __init__(self, function: Callable, writes: Optional[Any] = None) -> None:
        self.__wrapped__ = function  # what the layer call is (other wrappers look through us)
        self._writes = writes
        self._skeleton: Any = None
        self._stored: List[tuple] = []  # the forward's (mapping, key, skeleton of the stored value)
        self.nested = None  # decided by the first call: the checkpoint's forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.__wrapped__(*args, **kwargs)
        written = self._writes.take() if self._writes is not None else []
        if self.nested is None:
            self.nested = _has_nested_tensor(output) or bool(written)
            if self.nested:
                self._skeleton = _skeleton(output, [])
                self._stored = [(mapping, key, _skeleton(value, [])) for mapping, key, value in written]
        if not self.nested:
            return output
        leaves: List[torch.Tensor] = []
        _skeleton(output, leaves)
        for _mapping, _key, value in written:
            _skeleton(value, leaves)
        return tuple(leaves)

    def rebuild(self, result: Any) -> Any:
        """What the layer returned, its tensors now the checkpoint's (connected) outputs.

        Tensors the layer stored into a shared mapping are stored there again, connected.
        """
        if not self.nested:
            return result
        tensors = iter(result if isinstance(result, tuple) else (result,))
        output = _fill(self._skeleton, tensors)
        for mapping, key, skeleton in self._stored:
            mapping[key] = _fill(skeleton, tensors)
        self._stored = []  # the checkpoint keeps this object until backward: no mapping kept alive by it
        return output
