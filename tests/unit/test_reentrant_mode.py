"""hotfix/checkpointing/inputs.py ``is_reentrant``: the mode of a call, handed down by the composed call.

The slots compose wrapt ``FunctionWrapper`` layers around the stored ``partial(checkpoint, use_reentrant=...)``; a
fix further out is handed the layers inside it.  The composition decides the stored function's mode once and sets
it on each layer (``slot.STORED_MODE``): no fix steps through another's layers to read it.  The answer must be the
stored function's, whatever wraps it (a wrapper hotfix did not compose is asked by the same rule), and a keyword
given at the call wins.
"""

from __future__ import annotations

import functools

import pytest
import wrapt
from torch import nn
from torch.utils.checkpoint import checkpoint

from hotfix.checkpointing.inputs import is_reentrant
from hotfix.checkpointing.slot import STORED_MODE, CheckpointFunctionSlot


def _layers(function, count):
    for _ in range(count):
        function = wrapt.FunctionWrapper(function, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    return function


@pytest.mark.parametrize("count", [0, 1, 3])
@pytest.mark.parametrize("stored, expected", [(False, False), (True, True), (None, True)])
def test_the_stored_functions_mode_through_any_number_of_slot_layers(count, stored, expected):
    function = _layers(functools.partial(checkpoint, use_reentrant=stored), count)
    assert is_reentrant(function, {}) is expected
    assert is_reentrant(function, {"use_reentrant": not expected}) is (not expected)  # the call's keyword wins


def test_a_function_that_is_no_partial_is_torchs_default_reentrant():
    assert is_reentrant(_layers(checkpoint, 2), {}) is True
    assert is_reentrant(_layers(checkpoint, 2), {"use_reentrant": False}) is False


class _Layer(nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize("stored, expected", [(False, False), (True, True), (None, True)])
def test_the_composed_call_hands_the_stored_mode_to_every_layer(stored, expected):
    seen = []

    def fix():
        def wrapper(wrapped, instance, args, kwargs):
            seen.append((is_reentrant(wrapped, kwargs), getattr(wrapped, STORED_MODE, "the stored function")))
            return wrapped(*args, **kwargs)
        return wrapper

    class Composed(_Layer):
        pass

    slots = None
    for rank in (1, 2, 3):  # three fixes' slots, innermost first
        slots = CheckpointFunctionSlot(Composed, fix(), lambda: False, rank=rank, displaced=slots, fix=f"fix-{rank}")
    Composed._gradient_checkpointing_func = slots
    layer = Composed()
    layer._gradient_checkpointing_func = functools.partial(lambda function, *args, **kwargs: function(*args),
                                                           use_reentrant=stored)
    layer._gradient_checkpointing_func(lambda x: x, 1)
    # outermost first: the two outer fixes read the mode their layer was handed, the innermost the stored function
    assert seen == [(expected, expected), (expected, expected), (expected, "the stored function")]
