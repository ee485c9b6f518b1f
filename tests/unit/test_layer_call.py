"""hotfix/checkpointing/layer_call.py in-process: which layer a checkpointed call runs, and hotfix's wrappers showing it.

The lookup (``modules_called`` / ``layer_of``), one case per shape a checkpoint function is handed: transformers'
bound and partial calls of every release, 5.x's ``partial(forward, layer)``, partials of wrappers, wrappers
naming what they wrap (hotfix's, ``functools.wraps``), a model's own closure; and what is not a layer call.

hotfix's wrappers of the call (FlatOutputs, SharedStateWrites, the lifting, anchor and DDP closures): a
stand-in for LlamaFactory's checkpoint wrapper (written from its behaviour: it reads the layer from
``function.__self__``, or ``function.func.__self__`` for a partial, and checkpoints only a layer that
trains) stored where transformers stores the checkpoint function, behind the three transformers fixes'
wrappers composed as their slots compose them.  Before: "AttributeError: 'FlatOutputs' object has no
attribute '__self__'" on every shape.  Now it reads the layer called, and every gradient equals the run
without checkpointing.  The wrappers show no ``func``: a checkpoint function re-making the call from it
would bypass them.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
import wrapt
from torch import nn
from torch.utils.checkpoint import checkpoint

from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.patches import transformers_checkpoint_layer_io as layer_io
from hotfix.patches import transformers_ddp_find_unused as ddp_fix
from hotfix.patches import transformers_frozen_inputs as frozen_inputs
from hotfix.checkpointing.ddp import with_parameters_as_inputs
from hotfix.checkpointing.inputs import anchored, lift_closure_tensors
from hotfix.checkpointing.outputs import FlatOutputs
from hotfix.checkpointing.shared_state import SharedStateWrites
from hotfix.checkpointing.layer_call import layer_of, modules_called


class Layer(nn.Module):
    def __init__(self, index=0):
        super().__init__()
        self.index = index
        self.proj, self.mix = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, hidden, context=None, shared=None, scale=1.0):
        if context is not None:
            hidden = hidden + self.mix(context)
        if shared is not None:  # Gemma-style KV sharing: the even layer stores, the odd one reads
            if self.index % 2 == 0:
                shared["keys"] = self.mix(hidden)
            else:
                hidden = hidden + shared["keys"]
        return torch.tanh(self.proj(hidden)) * scale


class SuperCall(Layer):
    """A GradientCheckpointingLayer-like class: its call is ``super().__call__`` (4.52 - 5.16)."""

    def layer_call(self, **kwargs):
        return functools.partial(super().__call__, **kwargs)


# --------------------------------------------------------------------------------------------
# The lookup, one call shape each

def _closure(function):
    return lambda *inputs: function(*inputs)


LAYER = SuperCall()
SHAPES = {
    "4.52-5.16 partial(super().__call__, **kw)": LAYER.layer_call(scale=2.0),
    "partial(layer.__call__, **kw)": functools.partial(LAYER.__call__, scale=2.0),
    "5.x partial(forward, self, **kw)": functools.partial(Layer.forward, LAYER, scale=2.0),
    "bound layer.__call__ (a model's own loop)": LAYER.__call__,
    "the module itself": LAYER,
    "hotfix wrapper (__wrapped__)": FlatOutputs(functools.partial(LAYER.__call__)),
    "partial of a wrapper of a partial": functools.partial(FlatOutputs(functools.partial(LAYER.__call__)), scale=1.0),
    "functools.wraps wrapper": functools.wraps(LAYER.__call__)(lambda *inputs: None),
    "a model's custom_forward(module) closure": _closure(LAYER),
    "closure of a closure of a partial": _closure(_closure(functools.partial(LAYER.__call__))),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_layer_is_found_in_every_call_shape(shape):
    assert layer_of(SHAPES[shape]) is LAYER
    assert modules_called(SHAPES[shape]) == [LAYER]


def test_what_is_no_layer_call_has_none():
    def through_a_default(*inputs, function=functools.partial(LAYER.__call__)):  # not a closure: not looked into
        return function(*inputs)

    tensor = torch.ones(1)
    for function in (through_a_default, torch.tanh, _closure(tensor), functools.partial(torch.add, tensor)):
        assert layer_of(function) is None and modules_called(function) == []


def test_nearest_first_and_never_into_a_module():
    outer, inner = Layer(), Layer()
    outer.inner = inner

    def calls_two(x):
        return inner(outer(x))

    assert layer_of(functools.partial(Layer.forward, outer)) is outer  # not its submodule
    assert set(map(id, modules_called(calls_two))) == {id(outer), id(inner)}


# --------------------------------------------------------------------------------------------
# hotfix's wrappers, behind a checkpoint function that reads the layer from the call

class RecordingFix:
    """What the fixes' wrappers report through."""

    def __init__(self):
        self.repairs = []

    def repaired(self, what, call=None):
        self.repairs.append(what)

    def warn_once(self, key, message):
        pass


def reads_the_layer(layers_seen):
    """LlamaFactory's wrapper, as it behaves: the layer from the call, checkpointed (reentrant) if it trains."""

    def checkpoint_trainable_layers(function, *inputs, **kwargs):
        owner = function.func if isinstance(function, functools.partial) else function
        layer = owner.__self__  # the AttributeError of before
        layers_seen.append(layer)
        if any(p.requires_grad for p in layer.parameters()):
            return checkpoint(function, *inputs, use_reentrant=True, **kwargs)
        return function(*inputs, **kwargs)

    return checkpoint_trainable_layers


def with_hotfix(stored):
    """``stored`` wrapped as the slots wrap it: layer-io outermost, frozen-inputs, DDP innermost."""
    function = stored
    for build in (ddp_fix.checkpoint_with_visible_parameters, frozen_inputs.checkpoint_with_anchor,
                  layer_io.checkpoint_with_lifted_inputs):
        function = wrapt.FunctionWrapper(function, build(RecordingFix()))
    return function


class Model(nn.Module):
    """Two layers called in ``shape`` through ``function`` (None: no checkpointing)."""

    def __init__(self, shape, function=None):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.context = nn.Linear(4, 4), nn.Linear(4, 4)
        self.layers = nn.ModuleList([Layer(0), Layer(1)])
        self.head = nn.Linear(4, 1)
        self.shape, self.function = shape, function
        self.embed.requires_grad_(not shape.startswith("frozen-inputs"))

    def forward(self, x):
        hidden, keywords = self.embed(x), {} if self.shape == "bound-call" else {"scale": 0.5}
        if self.shape == "keyword-tensor":
            keywords["context"] = self.context(x)  # with a history: re-walked upstream
        if self.shape in ("shared-mapping", "frozen-inputs, shared mapping"):
            keywords["shared"] = {}
        for layer in self.layers:
            if self.function is None:
                hidden = layer(hidden, **keywords)
            elif self.shape == "bound-call":  # 4.x models: function(layer.__call__, *positional)
                hidden = self.function(layer.__call__, hidden)
            elif self.shape == "5.x-forward":
                hidden = self.function(functools.partial(Layer.forward, layer, **keywords), hidden)
            else:
                hidden = self.function(functools.partial(layer.__call__, **keywords), hidden)
        return self.head(hidden).sum()


#: shape -> the hotfix wrapper it puts around the call (what the checkpoint function is handed)
WRAPPER_SHAPES = {
    "plain": "FlatOutputs",
    "bound-call": "FlatOutputs of a bound method",
    "5.x-forward": "FlatOutputs of partial(forward, layer)",
    "keyword-tensor": "FlatOutputs of the lifting closure",
    "shared-mapping": "FlatOutputs of the lifting closure of partial(SharedStateWrites)",
    "frozen-inputs": "the anchor closure of FlatOutputs",
    "ddp": "the DDP parameter closure of FlatOutputs",
}


def _grads(shape, function=None):
    model = Model(shape, function)
    model(torch.randn(3, 4, generator=torch.Generator().manual_seed(1))).backward()
    return model, collect_grads(model)


@pytest.mark.parametrize("shape", sorted(WRAPPER_SHAPES))
def test_a_checkpoint_function_reading_the_layer_works_through_every_hotfix_wrapper(shape, monkeypatch):
    if shape == "ddp":  # a DDP forward searching for unused parameters is running: the DDP fix acts
        from torch.nn.parallel import DistributedDataParallel

        searching = types.SimpleNamespace(find_unused_parameters=True, static_graph=False,
                                          require_backward_grad_sync=True)
        monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", searching, raising=False)
    _, reference = _grads(shape)
    seen = []
    model, got = _grads(shape, with_hotfix(reads_the_layer(seen)))
    assert seen == list(model.layers), shape  # the layer each call runs, read from hotfix's wrapper
    report = compare_grads(reference, got, rtol=1e-6)
    assert report.ok and not report.missing and len(report.equal) == len(reference), report.summary()


def test_each_wrapper_shows_the_layer_and_what_it_wraps_never_a_call_to_remake():
    layer = Layer()
    call = functools.partial(layer.__call__, context=torch.ones(4, requires_grad=True) * 2)
    hidden = torch.ones(2, 4)
    lifted, _ = lift_closure_tensors(call, (hidden,))
    last, _ = anchored(call, (hidden,))
    first, _ = anchored(FlatOutputs(call), (hidden,), first=True)
    watcher, watched, _ = SharedStateWrites.around(functools.partial(layer.__call__, shared={}), (hidden,))
    parameters = tuple(layer.parameters())
    swap = with_parameters_as_inputs(call, 1, [], parameters, lambda: None)
    wrappers = {"FlatOutputs": (FlatOutputs(call), call), "lifting": (lifted, call), "anchor last": (last, call),
                "anchor first": (first, None), "SharedStateWrites": (watcher, None),
                "partial(SharedStateWrites)": (watched, None), "DDP swap": (swap, call),
                "FlatOutputs of a chain": (FlatOutputs(swap), swap)}
    for name, (wrapper, wraps) in wrappers.items():
        shown = wrapper.func if isinstance(wrapper, functools.partial) else wrapper
        assert shown.__self__ is layer, name
        if wraps is not None:
            assert wrapper.__wrapped__ is wraps, name
        assert not hasattr(shown, "func") and not hasattr(shown, "keywords"), name
    assert not hasattr(FlatOutputs(torch.tanh), "__self__")  # no layer found: none shown, as on the call


def test_each_wrapper_is_handed_the_callers_call_and_the_added_inputs_however_deep():
    """A fix further in reads the caller's call and the inputs hotfix added from the wrapper it is handed (each
    wrapper was handed them by the one it wraps when it was made): no stepping through the outer fixes' wrappers,
    so no depth at which it stops.  Before, ``layer_call`` stepped through at most 8 ``__wrapped__`` and returned a
    wrapper beyond that (the frozen-inputs fix then searched a wrapper for the partial's keyword tensors)."""
    from hotfix.checkpointing.layer_call import inputs_added, layer_call

    layer = Layer()
    call = functools.partial(layer.__call__, context=torch.ones(4, requires_grad=True) * 2)
    hidden = torch.ones(2, 4)
    function, inputs, anchors = call, (hidden,), []
    for depth in range(12):  # anchors and output flattening, alternating, as fixes stacked on each other add them
        if depth % 2:
            function = FlatOutputs(function)
        else:
            function, inputs = anchored(function, inputs)
            anchors.append(inputs[-1])
    assert layer_call(function) is call
    assert inputs_added(function) == {id(anchor) for anchor in anchors}
    assert function.__self__ is layer and layer_of(function) is layer
    assert inputs_added(call) == set() and layer_call(call) is call  # a call no hotfix wrapper made
    wrapped = wrapt.FunctionWrapper(FlatOutputs(call), lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    assert layer_call(wrapped) is call  # another library's wrapper around hotfix's: through its __wrapped__


@pytest.mark.parametrize("shape", ["frozen-inputs", "frozen-inputs, shared mapping"])
def test_the_frozen_inputs_fix_reads_what_the_lifting_fix_found_and_searches_the_call_no_more(shape, monkeypatch):
    """A frozen tower's call (no input needs grad): transformers-checkpoint-layer-io, outside, found no tensor needing
    grad reaching the layer but the positional inputs and says so on the wrapper it hands on (``no_hidden_grad``):
    nothing but plain values bound (``hides_nothing``), or a mapping bound (Gemma-3n's shared keys; the first layer's
    is empty) in which its own search of the partial found nothing needing grad.  transformers-frozen-inputs reads it
    there instead of searching the inputs and the partial again.  Alone (nobody told it), it searches.  Behind the
    lifting fix every gradient equals the run without checkpointing, and alone too where no mapping is bound (alone,
    the write into the mapping is the lifting fix's repair, left undone).  Before, it searched behind the lifting fix
    too (the mapping case until 2026-11-30)."""
    from hotfix.checkpointing import structure

    searched = []
    search = structure.find_grad_tensors

    def counted(value, found, seen):
        searched.append(value)
        return search(value, found, seen)

    monkeypatch.setattr(structure, "find_grad_tensors", counted)  # what frozen-inputs binds when its wrapper is made
    reentrant = functools.partial(checkpoint, use_reentrant=True)
    _, reference = _grads(shape)
    counts = {}
    for composed in ("lifting outside", "alone"):
        function = wrapt.FunctionWrapper(reentrant, frozen_inputs.checkpoint_with_anchor(RecordingFix()))
        if composed == "lifting outside":
            function = wrapt.FunctionWrapper(function, layer_io.checkpoint_with_lifted_inputs(RecordingFix()))
        searched.clear()
        _, got = _grads(shape, function)
        counts[composed] = len(searched)
        if composed == "alone" and shape != "frozen-inputs":
            continue
        report = compare_grads(reference, got, rtol=1e-6)
        assert report.ok and not report.missing and len(report.equal) == len(reference), (composed, report.summary())
    assert counts["lifting outside"] == 0 and counts["alone"] > 0, counts


def test_the_layer_is_looked_up_once_per_call_and_handed_on(monkeypatch):
    """A frozen tower under a DDP forward that searches for unused parameters: transformers-frozen-inputs looks the
    layer up to anchor it, then transformers-ddp-find-unused needs it to hand DDP its parameters.  The anchor's
    wrapper is handed the layer with the rest of the call's facts: one search from the caller's call per checkpointed
    call, not one per fix and per report (before: seven for the two calls).  Gradients equal the run without
    checkpointing."""
    from torch.nn.parallel import DistributedDataParallel

    from hotfix.checkpointing import layer_call as module

    searching = types.SimpleNamespace(find_unused_parameters=True, static_graph=False, require_backward_grad_sync=True)
    monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", searching, raising=False)
    searched = []
    search = module._modules

    def counted(function, sequences=None):
        if isinstance(function, functools.partial):  # a search from the caller's call (the layer's partial)
            searched.append(function)
        return search(function, sequences)

    _, reference = _grads("frozen-inputs")
    monkeypatch.setattr(module, "_modules", counted)
    model, got = _grads("frozen-inputs", with_hotfix(functools.partial(checkpoint, use_reentrant=True)))
    monkeypatch.undo()
    report = compare_grads(reference, got, rtol=1e-6)
    assert report.ok and not report.missing and len(report.equal) == len(reference), report.summary()
    assert [call.func.__self__ for call in searched] == list(model.layers), searched
