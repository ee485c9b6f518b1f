"""hotfix/checkpointing/forks.py in-process, on a stand-in of the forks' Function.

``HiddenStatesOnly`` behaves as LlamaFactory's and axolotl's copies of unsloth's first offloading Function do
(written here from that behaviour, not their code): ``hidden_states`` kept aside, every other argument kept as
the original object, one gradient taken and one returned.  Each case runs without checkpointing, through the
Function as the forks call it (the defect must show), and through ``checkpoint_through``: every gradient
equal to the run without checkpointing, a parameter without gradient there without one here (never zeros).
And axolotl's wrapper (a stand-in) replaced by the fix: never handed hotfix's wrapper of the call.
The real releases: tests/versions/test_llamafactory_unsloth_gc.py, test_axolotl_offload_checkpoint.py.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
from torch import nn

from hotfix.checkpointing.forks import checkpoint_through, function_drift

BACKWARD_TWICE = "Trying to backward through the graph a second time"


class HiddenStatesOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward_function, hidden_states, *args):
        ctx.save_for_backward(hidden_states.detach())
        ctx.forward_function, ctx.args = forward_function, args
        with torch.no_grad():
            return forward_function(hidden_states, *args)

    @staticmethod
    def backward(ctx, grad):
        (hidden,) = ctx.saved_tensors
        hidden = hidden.detach().requires_grad_(True)
        with torch.enable_grad():
            output = ctx.forward_function(hidden, *ctx.args)
            if isinstance(output, tuple):
                (output,) = output
        torch.autograd.backward(output, grad)
        return (None, hidden.grad) + (None,) * len(ctx.args)


class Layer(nn.Module):
    def __init__(self, returns="tuple"):
        super().__init__()
        self.proj, self.mix, self.aux = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.returns = returns

    def forward(self, hidden, context=None):
        hidden = torch.tanh(self.proj(hidden) + (self.mix(context) if context is not None else 0))
        if self.returns == "several":
            return hidden, torch.sigmoid(self.aux(hidden))
        if self.returns == "side":  # the second output does not depend on the first
            return hidden, torch.sigmoid(self.aux(context))
        return hidden if self.returns == "tensor" else (hidden,)


def _step(how, returns="tuple", frozen_first=False, use=("first",)):
    """Parameter name -> gradient (None where none) of one step; ``how``: plain, fork, through."""
    torch.manual_seed(0)
    model = nn.ModuleDict(dict(context=nn.Linear(4, 4), embed=nn.Linear(4, 4),
                               layers=nn.ModuleList([Layer(returns) for _ in range(2)])))
    model["embed"].requires_grad_(not frozen_first)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    context, hidden = model["context"](x), model["embed"](x)
    loss = 0
    for layer in model["layers"]:
        call = functools.partial(layer.__call__, context=context)  # the keyword in a partial: transformers 4.52+
        if how == "plain":
            out = call(hidden)
        elif how == "fork":
            out = HiddenStatesOnly.apply(call, hidden)
        else:
            out = checkpoint_through(HiddenStatesOnly.apply, call, (hidden,))
        hidden = out if returns == "tensor" else out[0]
        if "aux" in use:
            loss = loss + out[1].sum()
    if "first" in use:
        loss = loss + hidden.pow(2).sum()
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _same(reference, candidate):
    assert reference.keys() == candidate.keys()
    for name, grad in reference.items():
        assert (grad is None) == (candidate[name] is None), name  # no gradient is never a zero one
        if grad is not None:
            assert torch.allclose(grad, candidate[name], rtol=1e-6, atol=1e-7), name


def test_a_keyword_tensor_gets_its_gradient_back():
    with pytest.raises(RuntimeError, match=BACKWARD_TWICE):  # the second layer walks the context's history again
        _step("fork")
    _same(_step("plain"), _step("through"))


def test_behind_a_frozen_first_input_too():
    reference = _step("plain", frozen_first=True)
    assert reference["context.weight"] is not None
    # upstream the node has no input needing grad (the keyword hides in the partial): nothing reaches the loss
    with pytest.raises(RuntimeError, match="does not require grad"):
        _step("fork", frozen_first=True)
    _same(reference, _step("through", frozen_first=True))


@pytest.mark.parametrize("returns, use", [("several", ("first",)), ("several", ("first", "aux")),
                                          ("side", ("aux",)), ("tensor", ("first",))])
def test_every_output_connected_an_unused_one_gives_no_gradient(returns, use):
    with pytest.raises((TypeError, ValueError, RuntimeError)):  # one gradient taken, or a tensor unpacked
        _step("fork", returns=returns, use=use)
    reference = _step("plain", returns=returns, use=use)
    _same(reference, _step("through", returns=returns, use=use))
    if use == ("first",) and returns == "several":
        assert reference["layers.1.aux.weight"] is None  # the case proves the None-ness rule


def test_not_training_is_the_call_as_made():
    layer = Layer()
    calls = []
    with torch.no_grad():
        out = checkpoint_through(HiddenStatesOnly.apply, layer, (torch.randn(2, 4),),
                                 unchanged=lambda: calls.append(1) or "as made")
    assert out == "as made" and calls == [1]


AXOLOTL_LIKE = """
def hf_grad_checkpoint_offload_wrapper(decoder_layer, *args, use_reentrant=None):
    seen.append(decoder_layer.func.__self__)  # is the layer a GradientCheckpointingLayer?
    return CPU_Offloaded_Gradient_Checkpointer.apply(decoder_layer, *args)
"""


def test_axolotls_wrapper_is_never_handed_hotfixs_wrapper_of_the_call():
    """axolotl's wrapper (a stand-in, written from its behaviour) reads ``.func`` and ``__self__`` from the call and
    may call that layer in the call's place: hotfix's wrappers of the call (which show the layer, ``checkpointing.layer_call``)
    must run, so the fix's replacement hands them to the Function itself, also not training; transformers' own
    call still goes to axolotl's wrapper there."""
    from hotfix.checkpointing.outputs import FlatOutputs
    from hotfix.patches.axolotl_offload_checkpoint import AxolotlOffloadCheckpoint

    module = types.ModuleType("axolotl_like")
    module.seen, module.CPU_Offloaded_Gradient_Checkpointer = [], type("CPU_Offloaded_Gradient_Checkpointer",
                                                                      (HiddenStatesOnly,), {})
    exec(AXOLOTL_LIKE, module.__dict__)
    AxolotlOffloadCheckpoint()._apply(module)
    layer, hidden = Layer(), torch.randn(2, 4)
    call = functools.partial(layer.__call__, context=None)
    with torch.no_grad():
        expected = layer(hidden)[0]
        assert torch.equal(module.hf_grad_checkpoint_offload_wrapper(FlatOutputs(call), hidden)[0], expected)
        assert module.seen == []
        assert torch.equal(module.hf_grad_checkpoint_offload_wrapper(call, hidden)[0], expected)
        assert module.seen == [layer]


def test_function_drift_knows_the_forks_shape():
    assert function_drift(HiddenStatesOnly, "HiddenStatesOnly") is None

    class Other(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return args[0]

        @staticmethod
        def backward(ctx, grad):
            return grad

    assert "no longer forward" in function_drift(Other, "Other")
    assert "not a torch.autograd.Function" in function_drift(object, "object")
