"""patches/deepspeed_checkpoint_layer_io.py in-process: the slot wrapper around a stand-in for DeepSpeed's checkpoint.

The stand-in returns what DeepSpeed's ``checkpoint`` returns (its module's name, the list of the layer's outputs,
unwrapped where it holds one item), through a reentrant torch checkpoint so that gradients flow.  A transformers
4.x layer returning ``(hidden_states,)`` gets the bare tensor back upstream (its caller's ``[0]`` then takes the
first batch row); with the fix's wrapper, its tuple, and every gradient equal to the same model without
checkpointing.  The 2-rank runs with DeepSpeed itself: tests/e2e/test_deepspeed.py (``:deepspeed`` cases).
"""

from __future__ import annotations

import functools
import sys

import pytest

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


# -- inputs every layer shares, emptied by DeepSpeed after a layer's forward (partition_activations, cpu_checkpointing)

class Recorder:
    """Stands in for the fix: the lines its wrapper would say, in order."""

    name = patch.name

    def __init__(self):
        self.lines = []

    def repaired(self, what, call=None):
        self.lines.append(what)


def emptying_checkpoint(function, *args):
    """DeepSpeed's rule where ``partition_activations`` or ``cpu_checkpointing`` is on, for a layer's later inputs: after
    the forward each floating-point one without the opt-out has its data emptied (DeepSpeed keeps a partition or a host
    copy for its own backward; the first input, the layer's hidden states, stays whole here as that copy would)."""
    output = torch_checkpoint(function, *args, use_reentrant=True)
    for item in args[1:]:
        if isinstance(item, torch.Tensor) and item.is_floating_point() and not getattr(item, OPT_OUT, False):
            item.data = torch.empty([])
    return output


emptying_checkpoint.__module__ = DEEPSPEED_CHECKPOINTING
emptying_checkpoint.__name__ = "checkpoint"


class CrossLayer(nn.Module):
    """Reads an input every layer is handed (as Whisper's decoder layers read the encoder's states on 5.x)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x, shared):
        return x + torch.tanh(self.lin(shared)) * x


def cross_grads(function):
    torch.manual_seed(0)
    layers = nn.ModuleList([CrossLayer(), CrossLayer(), CrossLayer()])
    shared = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for layer in layers:
        x = function(layer, x, shared) if function else layer(x, shared)
    x.square().mean().backward()
    return {**collect_grads(layers), "shared": shared.grad}


def deepspeed_state(monkeypatch, **flags):
    """DeepSpeed's checkpointing module as ``deepspeed.checkpointing.configure`` leaves it (only what hotfix reads)."""
    import types

    module = types.ModuleType(DEEPSPEED_CHECKPOINTING)
    module.PARTITION_ACTIVATIONS, module.CPU_CHECKPOINT, module.mp_size = False, False, 1
    for name, value in flags.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, DEEPSPEED_CHECKPOINTING, module)


def test_upstream_the_second_layer_reads_the_shared_input_emptied(monkeypatch):
    deepspeed_state(monkeypatch, CPU_CHECKPOINT=True)
    with pytest.raises(RuntimeError, match="at least 1D"):
        cross_grads(emptying_checkpoint)


@pytest.mark.parametrize("option", ["CPU_CHECKPOINT", "PARTITION_ACTIVATIONS"])
def test_with_the_fix_the_shared_input_is_kept_whole_and_said_once_the_next_layer_would_have_read_it_empty(
        monkeypatch, option):
    deepspeed_state(monkeypatch, **{option: True})
    fix = Recorder()
    wrapper = checkpoint_as_deepspeed_needs(fix)
    found = compare_grads(cross_grads(None), cross_grads(lambda *args: wrapper(emptying_checkpoint, None, args, {})))
    assert found.ok and not found.missing and len(found.equal) == 7, found.summary()
    assert fix.lines and all("kept whole" in line for line in fix.lines), fix.lines  # from the second layer on


def test_no_line_where_deepspeed_empties_nothing_or_the_shared_tensor_is_one_hotfix_lifted(monkeypatch):
    from hotfix.checkpointing.layer_call import ShownCall

    deepspeed_state(monkeypatch)  # both options off: DeepSpeed keeps every input as it is
    fix = Recorder()
    wrapper = checkpoint_as_deepspeed_needs(fix)
    found = compare_grads(cross_grads(None), cross_grads(lambda *args: wrapper(emptying_checkpoint, None, args, {})))
    assert found.ok and fix.lines == []

    deepspeed_state(monkeypatch, CPU_CHECKPOINT=True)

    def lifted(layer, x, shared):  # as transformers-checkpoint-layer-io hands on a keyword tensor it lifted
        call = ShownCall(lambda x, shared: layer(x, shared), layer, added=(shared,))
        return wrapper(emptying_checkpoint, None, (call, x, shared), {})

    cross_grads(lifted)  # without hotfix DeepSpeed never saw it (the partial hid it): nothing to claim
    assert fix.lines == []
