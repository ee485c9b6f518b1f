"""torch-checkpoint-rng-state in-process: ``preserve_rng_state=False`` around dropout.

Two blocks with dropout (p=0.5), each checkpointed with torch's ``checkpoint(..., preserve_rng_state=False)``,
reentrant and non-reentrant, against the same step without checkpointing (same seed): upstream (the fix reverted)
the recomputation draws other masks and the gradients differ, silently; with the fix every gradient equals the
reference and one "repaired" line is asked for.  Without dropout the fix changes nothing, bit for bit, and says
nothing.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conftest import reverted
from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.patches.torch_checkpoint_rng_state import patch


class Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(8, 16), nn.Linear(16, 8), nn.Dropout(p)

    def forward(self, x):
        return x + self.b(self.drop(torch.relu(self.a(x))))


class Model(nn.Module):
    def __init__(self, p):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(p), Block(p)])

    def forward(self, x, function=None):
        for block in self.blocks:
            x = function(block, x) if function is not None else block(x)
        return x.pow(2).sum()


MODES = {"reentrant": functools.partial(checkpoint, use_reentrant=True, preserve_rng_state=False),
         "non-reentrant": functools.partial(checkpoint, use_reentrant=False, preserve_rng_state=False)}


def step(model, function=None):
    torch.manual_seed(123)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).requires_grad_()
    model.zero_grad(set_to_none=True)
    model(x, function).backward()
    return collect_grads(model)


@pytest.fixture
def said(monkeypatch):
    assert patch.applied, "torch-checkpoint-rng-state is not applied in the test process"
    lines = []
    monkeypatch.setattr(patch, "_drew", lambda: lines.append("repaired"))
    return lines


@pytest.fixture
def upstream():
    with reverted(patch):
        yield


@pytest.mark.parametrize("mode", MODES)
def test_upstream_the_recomputation_draws_other_masks(upstream, mode):
    model = Model(p=0.5).train()
    report = compare_grads(step(model), step(model, MODES[mode]), rtol=1e-6)
    assert report.wrong, report.summary()


@pytest.mark.parametrize("mode", MODES)
def test_with_the_fix_the_forward_s_masks_are_drawn_again(said, mode):
    model = Model(p=0.5).train()
    report = compare_grads(step(model), step(model, MODES[mode]), rtol=1e-6)
    assert report.ok, report.summary()
    assert said == ["repaired", "repaired"]  # each checkpointed forward drew (the notice itself says it once)


@pytest.mark.parametrize("mode", MODES)
def test_without_random_numbers_nothing_changes_and_nothing_is_said(said, mode):
    model = Model(p=0.0).train()
    with_fix = step(model, MODES[mode])
    with reverted(patch):
        without = step(model, MODES[mode])
    assert all(torch.equal(with_fix[name], without[name]) for name in with_fix)
    assert said == []
