"""hotfix/checkpointing/structure.py: the one traversal every fix uses, one case per container kind.

Before issue 31 five walkers decided what a call's arguments hold, each with its own rules (a Mapping
looked into but not rebuilt, a list at the top of an output taken for a tuple, a Cache copied without
its entries' later state).  Here each kind is checked for the invariant that keeps lifting, watching and
skipping in agreement: every tensor :func:`tensors` finds, :func:`rebuild` replaces (and nothing else),
keeping the container's type and never writing into the original; :func:`hides_nothing` says True only
where nothing needing grad is found; :func:`same` sees a copy as holding what the original holds.
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Mapping

import pytest
import torch

from hotfix.checkpointing.inputs import lift_closure_tensors
from hotfix.checkpointing.shared_state import SharedStateWrites
from hotfix.checkpointing.structure import (cache_entries, find_grad_tensors, hides_nothing, holds_tensor, is_plain,
                                       is_shared_state, rebuild, same, tensors)

cache_utils = pytest.importorskip("transformers.cache_utils")
Pair = collections.namedtuple("Pair", "first second")


class ReadOnly(Mapping):
    """A Mapping that is not a MutableMapping."""

    def __init__(self, items):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def _grad(*shape):
    return torch.randn(*shape or (2,), requires_grad=True) * 1  # a tensor with a history, as a layer gets it


def _cache_456():
    """4.56's shape: DynamicCache.layers of DynamicLayer with .keys / .values."""
    cache = cache_utils.DynamicCache()
    cache.update(_grad(1, 1, 2, 2), _grad(1, 1, 2, 2), 0)
    cache.update(_grad(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 1)
    return cache


def _cache_5x():
    """5.x's extra shapes on an entry: a flag, and dicts of states (linear-attention layers' conv/recurrent states)."""
    cache = _cache_456()
    entry = cache.layers[0]
    entry.is_initialized = True
    entry.conv_states = {0: _grad(2), 1: None}
    entry.recurrent_states = {0: torch.zeros(2)}
    return cache


def _samples():
    t, frozen = _grad(), torch.zeros(2)
    return {
        "tensor": t,
        "tuple": (t, frozen, 1),
        "namedtuple": Pair(t, "x"),
        "list": [frozen, t],
        "dict": {"a": t, "b": None},
        "dict subclass": collections.OrderedDict(a=t),
        "defaultdict": collections.defaultdict(list, a=[t]),
        "ModelOutput": pytest.importorskip("transformers.modeling_outputs").BaseModelOutput(last_hidden_state=t),
        "UserDict": collections.UserDict(a=t),
        "read-only Mapping": ReadOnly({"a": t}),
        "MappingProxyType": types.MappingProxyType({"a": t}),
        "Cache (4.56)": _cache_456(),
        "Cache (5.x entries)": _cache_5x(),
        "nested": {"a": [Pair(t, {"b": (frozen, [t])})], "c": collections.UserDict(d=_cache_456())},
    }


@pytest.mark.parametrize("kind", list(_samples()))
def test_every_tensor_found_is_rebuilt_and_nothing_else(kind):
    value = _samples()[kind]
    found = list(tensors(value))
    assert found and holds_tensor(value)
    before = [id(t) for t in found]
    rebuilt = rebuild(value, lambda leaf: isinstance(leaf, torch.Tensor), lambda tensor: tensor.detach().clone())
    after = list(tensors(rebuilt))
    assert len(after) == len(found) and not {id(t) for t in after} & set(before)  # each one replaced
    assert [id(t) for t in tensors(value)] == before  # the original holds what it held
    assert type(rebuilt) is type(value) or (kind == "read-only Mapping" and isinstance(rebuilt, Mapping))
    if kind.startswith("Cache"):
        assert rebuilt.layers is not value.layers and all(a is not b for a, b in zip(rebuilt.layers, value.layers))
        assert type(rebuilt.layers[0]) is type(value.layers[0])
    identity = rebuild(value, lambda leaf: isinstance(leaf, torch.Tensor), lambda tensor: tensor)
    assert same(identity, value)


@pytest.mark.parametrize("kind", list(_samples()))
def test_finding_lifting_and_skipping_agree(kind):
    """What needs grad is found once; the fast path never skips it; lifting swaps it for its twin in a recomputation."""
    value = _samples()[kind]
    needing = [t for t in tensors(value) if t.requires_grad]
    found, seen = [], set()
    find_grad_tensors(value, found, seen)
    assert [id(t) for t in found] == list(dict.fromkeys(id(t) for t in needing))

    def layer(hidden, context=None):
        return hidden * sum(t.sum() for t in tensors(context))

    hidden = torch.ones(2, requires_grad=True)
    function = functools.partial(layer, context=value)
    assert not hides_nothing(function, (hidden,))
    lifted_function, inputs = lift_closure_tensors(function, (hidden,))
    assert [id(t) for t in inputs[1:]] == [id(t) for t in found]
    twins = [hidden.detach()] + [t.detach() for t in inputs[1:]]
    seen_by_layer = []
    layer_spy = functools.partial(lambda hidden, context=None: seen_by_layer.extend(tensors(context)), context=value)
    spy_function, _ = lift_closure_tensors(layer_spy, (hidden,))
    spy_function(*twins)  # a recomputation: the layer reads the twins, never an original needing grad
    assert not {id(t) for t in seen_by_layer} & {id(t) for t in found}
    assert lifted_function(*inputs) is not None  # the forward: the original objects


def test_plain_values_hide_nothing_and_hold_no_tensor():
    for value in (None, 1, 2.5, True, "text", torch.zeros(2)):
        assert is_plain(value) and not is_shared_state(value)
    assert not holds_tensor((1, "x", None, [2.0], {"a": None}))
    function = functools.partial(lambda h, **kw: h, flag=True, scale=2.0, sizes=(1, 2), mask=torch.zeros(2))
    assert hides_nothing(function, (torch.ones(2, requires_grad=True), None, 3))
    assert lift_closure_tensors(function, (torch.ones(2),)) is None
    for opaque in (object(), types.SimpleNamespace(t=_grad())):  # other objects: not looked into
        assert not holds_tensor(opaque) and rebuild(opaque, lambda leaf: False, lambda leaf: leaf) is opaque


def test_shared_state_is_a_mutable_mapping_or_a_cache_with_entries():
    assert is_shared_state({}) and is_shared_state(collections.UserDict()) and is_shared_state(_cache_456())
    assert not is_shared_state([]) and not is_shared_state(ReadOnly({})) and not is_shared_state(())
    assert cache_entries(_cache_456()) is not None and cache_entries(types.SimpleNamespace(layers=[])) is None


def test_a_cache_copy_is_private_and_its_writes_are_handed_back():
    """The watcher's copy of a Cache: the layer's append reaches only the copy; the replay brings the caller's
    entries (the same entry objects) up to date, new keys/values connected as checkpoint outputs would be."""
    cache = _cache_456()
    caller_entries, caller_keys = list(cache.layers), [entry.keys for entry in cache.layers]

    def layer(hidden, kv_cache=None):
        kv_cache.update(hidden.view(1, 1, 1, 2), hidden.view(1, 1, 1, 2), 0)
        return hidden

    watcher, function, inputs = SharedStateWrites.around(functools.partial(layer, kv_cache=cache), (torch.ones(2),))
    function(*inputs)
    assert [entry.keys for entry in cache.layers] == caller_keys  # the forward wrote into its private copy
    written = watcher.take()
    assert written.changed and len(written.tensors) == 2  # the appended keys and values
    connected = [t.clone() for t in written.tensors]
    written.apply(connected)
    assert cache.layers == caller_entries and cache.layers[0].keys is connected[0]
    assert cache.layers[0].keys.shape[-2] == 3 and cache.layers[1].keys is caller_keys[1]
