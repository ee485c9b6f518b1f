"""Fixtures shared by the in-process unit tests."""

from __future__ import annotations

import pytest


def _grads_of(model, x, checkpointing):
    """Gradients of one backward of ``model(x)`` (``x`` a fresh leaf that needs grad), with or without checkpointing."""
    from hotfix.diagnostics.compare import collect_grads

    model.zero_grad(set_to_none=True)
    model.checkpointing = checkpointing
    model(x.clone().requires_grad_(True)).backward()
    return collect_grads(model)


@pytest.fixture
def grads_of():
    return _grads_of
