"""Let a reentrant checkpoint return tensors nested in containers, connected, and no gradient for unused ones.

Reentrant checkpointing connects only the *top-level* tensors a layer returns: pvt_v2's stages
return ``((hidden,), height, width)`` and every parameter before the last stage gets no gradient.
:class:`FlatOutputs` runs the layer and, when its output nests a tensor (or the layer wrote into a
shared mapping, ``_checkpoint_shared_state``), returns all of them as one flat tuple, remembering
the structure without the tensors; :meth:`FlatOutputs.rebuild` puts the checkpoint's connected
outputs back into it and replays the mapping writes.  The engine hands a Function zeros for an
output the loss never used, so the recomputation gave its producers zero gradients where a run
without checkpointing leaves None (LiLT's last layout stream): :meth:`FlatOutputs.watch_unused`
hooks the outputs and the recomputation returns such an output detached.
docs/fixes/transformers-checkpoint-layer-io.md.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, List, Optional, Set

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
    ``notice``: called when a recomputation leaves an unused output without a gradient.
    """

    def __init__(self, function: Callable, writes: Optional[Any] = None,
                 notice: Optional[Callable[[], None]] = None) -> None:
        self.__wrapped__ = function  # what the layer call is (other wrappers look through us)
        self._writes = writes
        self._notice = notice
        self._skeleton: Any = None
        self._replay: Any = None  # the forward's writes into shared mappings, replayed by rebuild()
        self._unused: Set[int] = set()  # checkpoint outputs that got no gradient (set by hooks in backward)
        self.nested = None  # decided by the first call: the checkpoint's forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self.__wrapped__(*args, **kwargs)
        written = self._writes.take() if self._writes is not None else None
        if self.nested is None:
            self.nested = _has_nested_tensor(output) or bool(written is not None and written.changed)
            if self.nested:
                self._skeleton = _skeleton(output, [])
                self._replay = written
        if self.nested:
            leaves: List[torch.Tensor] = []
            _skeleton(output, leaves)
            output = tuple(leaves + (written.tensors if written is not None else []))
        if self._unused and isinstance(output, tuple):  # only ever set in backward: this is the recomputation
            unused, self._unused = self._unused, set()
            output = tuple(item.detach() if i in unused and isinstance(item, torch.Tensor) else item
                           for i, item in enumerate(output))
            if self._notice is not None:
                self._notice()
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
            self._unused.add(position)
        else:
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
