"""The unsloth-zoo fixes on torch 2.14's ``Function.apply`` (found by the census, 2026-11-25).

torch <= 2.13 defines ``torch.autograd.Function.apply`` as a Python classmethod; torch 2.14 leaves the C
one (``torch._C._FunctionBase.apply``, a ``classmethod_descriptor``) on ``Function``.  The drift check of
both unsloth-zoo fixes accepted only a classmethod, so on torch 2.14.1 they skipped every unsloth-zoo
release ("UnslothCheckpointFunction.apply is not a classmethod") and unsloth's checkpoint stayed broken.
Here a reentrant checkpoint Function with torch 2.14's layout (the C descriptor as its ``apply``, also
present in 2.13) stands in for unsloth-zoo's: two layers share a tensor bound in a ``partial``, which
upstream re-walks ("backward through the graph a second time"), and the closure fix, applied after the
drift check passes, makes the gradients equal to a run without checkpointing; revert gives the
descriptor back.  The census (docs/versions.md) measures the real releases under torch 2.14.1.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch

from hotfix.checkpointing.unsloth import checkpoint_function_drift
from hotfix.patches.unsloth_zoo_closure_tensors import UnslothZooClosureTensors

C_APPLY = torch._C._FunctionBase.__dict__["apply"]


class UnslothCheckpointFunction(torch.autograd.Function):
    """A minimal reentrant checkpoint with unsloth-zoo's forward signature."""

    apply = C_APPLY  # torch 2.14's layout: no Python classmethod on the way

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with torch.enable_grad():
            output = ctx.run_function(*inputs)
        torch.autograd.backward(output, grad)
        return (None, None, *[t.grad for t in inputs])


def _module():
    module = types.ModuleType("unsloth_zoo.gradient_checkpointing")
    module.UnslothCheckpointFunction = UnslothCheckpointFunction
    return module


def _grads(checkpointed):
    torch.manual_seed(0)
    encoder, layers = torch.nn.Linear(4, 4), [torch.nn.Linear(4, 4) for _ in range(2)]
    x = torch.randn(2, 4)
    context = encoder(x)  # needs grad, reaches both layers only through the partial
    hidden = x.clone().requires_grad_(True)
    for layer in layers:
        call = functools.partial(lambda h, context, layer: torch.tanh(layer(h) + context), context=context, layer=layer)
        hidden = UnslothCheckpointFunction.apply(call, True, hidden) if checkpointed else call(hidden)
    hidden.sum().backward()
    return [p.grad for module in (encoder, *layers) for p in module.parameters()]


def test_the_drift_check_accepts_torch_214s_apply_and_the_closure_fix_repairs_through_it():
    assert UnslothCheckpointFunction.__dict__["apply"] is C_APPLY
    assert checkpoint_function_drift(_module()) is None  # was "UnslothCheckpointFunction.apply is not a classmethod"
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _grads(checkpointed=True)  # upstream
    fix = UnslothZooClosureTensors()
    fix._apply(_module())  # the version gate needs an installed unsloth-zoo; the shape is what is tested here
    try:
        reference, repaired = _grads(checkpointed=False), _grads(checkpointed=True)
        assert all(r is not None and g is not None for r, g in zip(reference, repaired))
        for r, g in zip(reference, repaired):
            torch.testing.assert_close(g, r, rtol=1e-6, atol=0)
    finally:
        assert fix.revert()
    assert UnslothCheckpointFunction.__dict__["apply"] is C_APPLY
