"""hotfix/checkpointing/torch_wrapper.py: a layer under torch's checkpoint_wrapper handed to transformers' checkpointing.

In-process, transformers 4.56.2: the Cache rule (a Cache handed to a layer is what its recomputation writes again; a
5.x layer that only reads it says so), the layer's state during and after the call (restored, also when the call
raises), the keyword tensors the wrapper itself makes checkpoint inputs, and the fix's wrapper on a real
``CheckpointWrapper`` (the Cache dropped, ``use_cache`` left as the caller set it, an eval-mode call unchanged).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from hotfix.checkpointing.slot import ATTRIBUTE
from hotfix.checkpointing.torch_wrapper import (PackedKeywords, CheckpointedByTransformers, hands_a_cache,
                                                packed_upstream, transformers_layer, without_cache)


class Layer(GradientCheckpointingLayer):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.seen = []

    def forward(self, hidden, past_key_values=None, use_cache=False, scale=None):
        self.seen.append((past_key_values, use_cache, self.gradient_checkpointing))
        out = self.linear(hidden)
        return out * scale if scale is not None else out


def test_a_cache_handed_to_a_layer_is_what_the_recomputation_would_write_again():
    layer, cache = Layer(), object()
    assert transformers_layer(layer) and not transformers_layer(torch.nn.Linear(1, 1))
    assert hands_a_cache(layer, (), {"past_key_values": cache})
    assert hands_a_cache(layer, (), {"past_key_value": cache}) and hands_a_cache(layer, (), {"layer_past": cache})
    assert not hands_a_cache(layer, (), {"use_cache": True, "past_key_values": None})
    assert not hands_a_cache(layer, (cache,), {})  # positional, and not a transformers Cache: not recognised
    layer._can_checkpoint_with_cache = True  # 5.x: a layer that only reads the Cache keeps it
    assert not hands_a_cache(layer, (), {"past_key_values": cache})
    assert without_cache((), {"past_key_values": cache, "use_cache": True, "scale": 2}) == ((), {
        "past_key_values": None, "use_cache": False, "scale": 2})
    assert without_cache((1,), {"hidden": 1}) == ((1,), {"hidden": 1})  # nothing added where the caller passed nothing


def test_a_transformers_cache_is_found_by_what_it_is_not_by_its_keyword():
    """GPT-2's block takes its Cache positionally (accelerate's FSDP2 NO_REENTRANT: "different metadata" with
    hotfix), 5.24's layers by ``cache=`` (REENTRANT: repaired without its line): a Cache instance is a Cache."""
    from transformers.cache_utils import DynamicCache

    layer, cache, hidden = Layer(), DynamicCache(), torch.zeros(1)
    assert hands_a_cache(layer, (hidden, cache), {}) and hands_a_cache(layer, (hidden,), {"cache": cache})
    assert without_cache((hidden, cache, 3), {"cache": cache, "use_cache": True}) == (
        (hidden, None, 3), {"cache": None, "use_cache": False})


@pytest.mark.parametrize("raises", [False, True])
def test_the_layer_is_CheckpointedByTransformers_only_inside(raises):
    layer = Layer()
    function = functools.partial(checkpoint, use_reentrant=True)
    try:
        with CheckpointedByTransformers(layer, function):
            assert layer.gradient_checkpointing is True and layer.__dict__[ATTRIBUTE] is function
            if raises:
                raise KeyError("inside")
    except KeyError:
        assert raises
    assert "gradient_checkpointing" not in layer.__dict__ and ATTRIBUTE not in layer.__dict__
    assert layer.gradient_checkpointing is False  # the class's value again


def test_keyword_tensors_the_wrapper_packs_itself_are_named():
    context = torch.ones(2, 4, requires_grad=True) * 2
    call = functools.partial(Layer().__call__, encoder_hidden_states=context, scale=3)
    packed = PackedKeywords(checkpoint, use_reentrant=True)
    assert packed_upstream(packed, call) == frozenset({id(context)})
    assert packed_upstream(functools.partial(checkpoint, use_reentrant=True), call) == frozenset()


@pytest.mark.parametrize("impl", [CheckpointImpl.REENTRANT, CheckpointImpl.NO_REENTRANT])
def test_the_fix_hands_no_cache_to_the_wrapped_layer_in_training_only(impl):
    """With the fix applied (this process's hotfix): in training the layer runs under transformers' checkpointing
    without the Cache, ``use_cache`` as the caller passed it dropped to False for the layer only; in eval mode the
    wrapper's own call, Cache and all."""
    layer = Layer()
    wrapped = checkpoint_wrapper(layer, checkpoint_impl=impl)
    cache, hidden = object(), torch.ones(2, 4, requires_grad=True)
    kwargs = {"past_key_values": cache, "use_cache": True}
    wrapped(hidden, **kwargs).sum().backward()
    assert kwargs == {"past_key_values": cache, "use_cache": True}  # the caller's dict untouched
    assert layer.seen[0] == (None, False, True), layer.seen  # the forward: no Cache, transformers' checkpointing
    assert all(seen[0] is None for seen in layer.seen)  # the recomputation too
    assert "gradient_checkpointing" not in layer.__dict__ and ATTRIBUTE not in layer.__dict__
    layer.seen.clear()
    wrapped.eval()
    with torch.no_grad():
        wrapped(hidden, **kwargs)
    assert layer.seen == [(cache, True, False)]


def test_wrappers_of_one_setting_store_one_function_and_each_layer_class_is_covered_once():
    """Every ``CheckpointWrapper`` makes its own ``partial`` of torch's checkpoint: stored as they are, each layer of a
    model would hold another object and the slots would compose the call again at every layer.  Equal settings share
    one stored function (REENTRANT: one ``PackedKeywords``, not one per call); another setting, or one that cannot be
    hashed, its own.  The routed fixes' slots go on a layer's class at its first call; later calls install nothing."""
    from hotfix.checkpointing.slot import SlotCoverage
    from hotfix.checkpointing.torch_wrapper import StoredFunctions

    stored = StoredFunctions()
    one, two = (checkpoint_wrapper(Layer(), checkpoint_impl=CheckpointImpl.REENTRANT) for _ in range(2))
    assert one.checkpoint_fn is not two.checkpoint_fn
    packed = stored.of(one.checkpoint_fn, True)
    assert isinstance(packed, PackedKeywords) and stored.of(two.checkpoint_fn, True) is packed
    assert stored.of(one.checkpoint_fn, True) is packed  # the next call: the same object again
    other = checkpoint_wrapper(Layer(), checkpoint_impl=CheckpointImpl.NO_REENTRANT).checkpoint_fn
    assert stored.of(other, False) is other and stored.of(other, True) is not packed
    unhashable = functools.partial(checkpoint, use_reentrant=True, options={"a": 1})
    assert stored.of(unhashable, False) is unhashable

    class Fresh(GradientCheckpointingLayer):  # a layer class no slot stands on yet, nor on a base short of transformers'
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, hidden):
            return self.linear(hidden)

    installed = []
    original = SlotCoverage._install
    SlotCoverage._install = lambda self, classes: (installed.append(set(classes)), original(self, classes))[1]
    try:
        wrappers = [checkpoint_wrapper(Fresh(), checkpoint_impl=CheckpointImpl.REENTRANT) for _ in range(3)]
        hidden = torch.ones(2, 4, requires_grad=True)
        wrappers[0](hidden).sum().backward()
        first = list(installed)
        for _ in range(2):
            for wrapped in wrappers:
                wrapped(hidden).sum().backward()
    finally:
        SlotCoverage._install = original
    # the routed fixes whose slots do not stand on GradientCheckpointingLayer itself, each once, at the first call
    assert first and all(classes == {Fresh} for classes in first), first
    assert installed == first, installed


@pytest.mark.parametrize("impl", [CheckpointImpl.REENTRANT, CheckpointImpl.NO_REENTRANT])
def test_a_routed_class_is_decided_again_where_a_fix_it_relies_on_is_reverted_and_applied(impl):
    """torch-checkpoint-wrapper decides once per layer class what its routed calls need (``RoutePlans``): with
    transformers-checkpoint-layer-io reverted the wrapper's call is upstream's (the Cache reaches the layer); applied
    again, the class's calls are routed again (no Cache)."""
    import hotfix
    from conftest import reverted

    layer = Layer()
    wrapped = checkpoint_wrapper(layer, checkpoint_impl=impl)
    cache, hidden = object(), torch.ones(2, 4, requires_grad=True)

    def first_seen():
        layer.seen.clear()
        wrapped(hidden, past_key_values=cache, use_cache=True).sum().backward()
        return layer.seen[0][0]

    assert first_seen() is None  # routed: no Cache, as under transformers' checkpointing
    with reverted(hotfix.known_patches()["transformers-checkpoint-layer-io"]):
        assert first_seen() is cache  # the fix it relies on for every call is not applied: upstream's call
    assert first_seen() is None
