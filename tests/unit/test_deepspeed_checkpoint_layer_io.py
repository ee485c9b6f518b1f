"""patches/deepspeed_checkpoint_layer_io.py in-process: the slot wrapper around a stand-in for DeepSpeed's checkpoint.

The stand-in returns what DeepSpeed's ``checkpoint`` returns (its module's name, the list of the layer's outputs,
unwrapped where it holds one item), through a reentrant torch checkpoint so that gradients flow.  A transformers
4.x layer returning ``(hidden_states,)`` gets the bare tensor back upstream (its caller's ``[0]`` then takes the
first batch row); with the fix's wrapper, its tuple, and every gradient equal to the same model without
checkpointing.  The 2-rank runs with DeepSpeed itself: tests/e2e/test_deepspeed.py (``:deepspeed`` cases).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.checkpointing.deepspeed import DEEPSPEED_CHECKPOINTING, OPT_OUT, as_deepspeed_needs, is_deepspeed_checkpoint
from hotfix.patches.deepspeed_checkpoint_layer_io import checkpoint_as_deepspeed_needs, patch


def deepspeed_like_checkpoint(function, *args):
    """What DeepSpeed's checkpoint returns: the outputs as a list, the only item alone."""
    collected = torch_checkpoint(function, *args, use_reentrant=True)
    collected = list(collected) if isinstance(collected, tuple) else [collected]
    return collected[0] if len(collected) == 1 else tuple(collected)


deepspeed_like_checkpoint.__module__ = DEEPSPEED_CHECKPOINTING
deepspeed_like_checkpoint.__name__ = "checkpoint"


class Layer(nn.Module):
    """Returns a tuple of one, as Whisper's layers do on transformers 4.x."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return (x + torch.tanh(self.lin(x)),)


class Model(nn.Module):
    def __init__(self, function=None):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.function = function

    def forward(self, x):
        for layer in self.layers:
            x = (self.function(layer, x) if self.function else layer(x))[0]  # as the model indexes layer_outputs
        return x.square().mean()


def grads(function):
    model = Model(function)
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    model(x).backward()
    return collect_grads(model)


def with_wrapper(stored):
    """The stored function as the fix's slot hands it on: its wrapper around ``stored``."""
    wrapper = checkpoint_as_deepspeed_needs(patch)
    return lambda *args, **kwargs: wrapper(stored, None, args, kwargs)


def test_upstream_the_tuple_of_one_comes_back_bare_and_the_model_trains_on_a_batch_row():
    """Here silently (the layers accept 2-D input); Whisper's attention fails on it ("not enough values to unpack")."""
    x = torch.randn(3, 4, 6)
    assert isinstance(deepspeed_like_checkpoint(Layer(), x), torch.Tensor)
    assert not torch.allclose(Model(None)(x), Model(deepspeed_like_checkpoint)(x))
    found = compare_grads(grads(None), grads(deepspeed_like_checkpoint))
    assert not found.ok and found.wrong, found.summary()


def test_with_the_fix_the_tuple_is_back_and_every_gradient_equals_the_model_without_checkpointing(capsys):
    found = compare_grads(grads(None), grads(with_wrapper(deepspeed_like_checkpoint)))
    assert found.ok and not found.missing and len(found.equal) == 4, found.summary()
    said = capsys.readouterr().err
    assert "repaired" in said and patch.name in said, said


def test_other_functions_and_layers_returning_a_tensor_pass_unchanged():
    x = torch.randn(3, 4, 6)
    lin = nn.Linear(6, 6)
    assert isinstance(with_wrapper(deepspeed_like_checkpoint)(lin, x), torch.Tensor)  # a tensor layer: a tensor
    plain = functools.partial(torch_checkpoint, use_reentrant=True)
    assert isinstance(with_wrapper(plain)(Layer(), x), tuple)  # torch's own: not DeepSpeed's, left alone
    assert is_deepspeed_checkpoint(functools.partial(deepspeed_like_checkpoint)) and not is_deepspeed_checkpoint(plain)


def test_deepspeed_is_handed_tensors_only_and_the_callers_later_tensors_as_views_it_may_consume():
    """What ``partition_activations`` needs (the real release: tests/versions/test_deepspeed_partitioned_activations.py):
    no non-tensor input (saved as a pair, counted as one), and no caller's tensor it could empty after the forward."""
    seen = []

    def layer(*inputs):
        seen.append(inputs)
        return inputs[0] * inputs[2].sum()

    hidden = torch.randn(2, 3, requires_grad=True)
    shared = torch.randn(2, 3, requires_grad=True)  # every layer's (Whisper's encoder states)
    function, handed, shifted = as_deepspeed_needs(layer, (hidden, None, shared))
    assert shifted and len(handed) == 2 and handed[0] is hidden  # DeepSpeed would move `shared` one place on
    assert handed[1] is not shared and handed[1]._base is shared and getattr(handed[1], OPT_OUT) is True
    function(*handed)  # the forward: the caller's own objects, in their places
    assert seen[-1][0] is hidden and seen[-1][1] is None and seen[-1][2] is shared
    copies = tuple(t.detach().requires_grad_() for t in handed)
    function(*copies)  # the recomputation: its detached copies, in their places
    assert seen[-1][0] is copies[0] and seen[-1][1] is None and seen[-1][2] is copies[1]
    handed[1].sum().backward()  # the gradient of the view reaches the caller's tensor
    assert torch.equal(shared.grad, torch.ones(2, 3))
    handed[1].data = torch.empty([])  # what a release before the opt-out does to an input after the forward
    assert shared.shape == (2, 3)
    assert as_deepspeed_needs(layer, (hidden,))[1:] == ((hidden,), False)
    assert as_deepspeed_needs(layer, (hidden, None))[2] is False  # a trailing extra None: not certain to differ
