"""hotfix/checkpointing/inputs.py ``is_reentrant``: the mode of a call read through other fixes' slot layers.

The slots compose wrapt ``FunctionWrapper`` layers around the stored ``partial(checkpoint, use_reentrant=...)``; a
fix further out reads the mode through the layers inside it.  It steps through them by ``__wrapped__`` (a proxy
answering isinstance and ``.keywords`` cost ~1 µs a checkpointed call, docs/performance.md): the answer must be the
stored function's, whatever wraps it, and a keyword given at the call wins.
"""

from __future__ import annotations

import functools

import pytest
import wrapt
from torch.utils.checkpoint import checkpoint

from hotfix.checkpointing.inputs import is_reentrant


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
