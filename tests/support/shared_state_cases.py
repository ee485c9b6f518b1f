"""Layers that write into the mapping they are handed, as issue 27's user tried (shared by the unit and release tests).

Each ``Writer`` layer reads the tensor the previous layer stored, stores one of its own (needing
grad), bumps a counter, appends to a list and writes a tensor into a nested dict inside the
mapping, and deletes a key.  ``InPlace`` instead updates in place a tensor already in the mapping.
The mapping types cover a plain dict and the MutableMappings a model may use, including one whose
``copy.copy`` shares its storage and one that cannot be copied at all.

``run(layers, make_mapping, checkpoint)`` calls the layers as transformers' GradientCheckpointingLayer
does under reentrant checkpointing (keywords bound in a ``partial``) and returns the loss and the
caller's mapping; ``snapshot(mapping)`` is a comparable picture of it (keys in order, values, nested).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, List

import torch


class SharedStorage(MutableMapping):
    """A mapping over an internal dict, without ``__copy__``: ``copy.copy`` shares the storage."""

    def __init__(self, *args, **kwargs):
        self._data = dict(*args, **kwargs)

    def __getitem__(self, key):
        return self._data[key]

    def __setitem__(self, key, value):
        self._data[key] = value

    def __delitem__(self, key):
        del self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Uncopyable(SharedStorage):
    """A mapping that refuses every copy."""

    def __copy__(self):
        raise TypeError("Uncopyable cannot be copied")

    def __deepcopy__(self, memo):
        raise TypeError("Uncopyable cannot be copied")


MAPPINGS: Dict[str, Callable[[Dict], MutableMapping]] = {
    "dict": dict,
    "UserDict": collections.UserDict,
    "OrderedDict": collections.OrderedDict,
    "defaultdict": lambda items: collections.defaultdict(list, items),
    "SharedStorage": SharedStorage,
    "Uncopyable": Uncopyable,
}

INITIAL = {"gone0": 0, "gone1": 1, "keep": "x", "sub": {}, "log": []}


def writer_forward(layer, hidden: torch.Tensor, state: MutableMapping) -> torch.Tensor:
    """What each Writer does (a function, so the release tests' GradientCheckpointingLayer reuses it)."""
    index = layer.index
    if index > 0:
        hidden = hidden + state[f"t{index - 1}"] + state["sub"][f"n{index - 1}"]
    out = torch.tanh(layer.linear(hidden))
    state[f"t{index}"] = out * 2  # a tensor needing grad, read by the next layer
    state["count"] = state.get("count", 0) + 1
    state["log"].append(index)  # in place, in a list inside the mapping
    state["sub"][f"n{index}"] = out * 3  # a tensor in a nested dict
    state.pop(f"gone{index}", None)
    return out


def in_place_forward(layer, hidden: torch.Tensor, state: MutableMapping) -> torch.Tensor:
    out = torch.tanh(layer.linear(hidden))
    state["acc"].add_(out.sum(0))  # a tensor the layer received through the mapping, changed in place
    return out + state["acc"]


class Writer(torch.nn.Module):
    def __init__(self, index: int, forward: Callable = writer_forward):
        super().__init__()
        self.index = index
        self.linear = torch.nn.Linear(4, 4)
        self._forward = forward

    def forward(self, hidden, state=None):
        return self._forward(self, hidden, state)


def initial_state(make: Callable[[Dict], MutableMapping], in_place: bool = False) -> MutableMapping:
    if in_place:
        return make({"acc": torch.zeros(4)})
    return make(copy.deepcopy(INITIAL))


def snapshot(value: Any) -> Any:
    """Keys in order, tensors as values, nested containers followed."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone())
    if isinstance(value, MutableMapping):
        return ("mapping", [(key, snapshot(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [snapshot(item) for item in value])
    return ("value", value)


def same(a: Any, b: Any) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "tensor":
        return a[1].shape == b[1].shape and torch.allclose(a[1], b[1], rtol=1e-6, atol=1e-7)
    if a[0] == "mapping":
        return [k for k, _ in a[1]] == [k for k, _ in b[1]] and all(same(x, y) for (_, x), (_, y) in zip(a[1], b[1]))
    if a[0] == "list":
        return len(a[1]) == len(b[1]) and all(same(x, y) for x, y in zip(a[1], b[1]))
    return a[1] == b[1]


def loss_of(output: torch.Tensor, state: MutableMapping, in_place: bool) -> torch.Tensor:
    if in_place:
        return output.pow(2).sum()
    return output.pow(2).sum() + state["t1"].sum() + state["sub"]["n1"].sum()


def layers(count: int = 2, in_place: bool = False) -> List[Writer]:
    torch.manual_seed(0)
    return [Writer(i, in_place_forward if in_place else writer_forward) for i in range(count)]
