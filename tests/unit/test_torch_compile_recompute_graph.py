"""torch-compile-recompute-graph in-process: a compiled function in two non-reentrant checkpointed calls.

Which graph each run runs (hotfix_lab.cases.compile_graph_order: a backend numbering its graphs): upstream the first
call's recomputation runs the second call's graph, with the fix its forward's.  And what that does: a function
compiled with inductor (CPU) is called with 37 and then 100 rows, a static graph then a dynamic one.  The two
compute its per-column variance apart in the last bits for some columns (measured first, in the test); the function
chooses between two weights by one such column's variance against a threshold placed between the two graphs'
values.  Upstream (the fix reverted) the first call's recomputation runs the dynamic graph and chooses the other
weight: the gradients go to a weight the forward never used, silently.  With the fix every gradient equals the step
without checkpointing, bit for bit.  The fix turns nothing off before the first non-reentrant checkpointed call,
leaves a program's own setting, and turns the LRU on again at revert where it turned it off.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch._dynamo
from torch.utils.checkpoint import checkpoint

from conftest import apply_again, reverted
from hotfix_lab.cases import compile_graph_order  # tools/hotfix_lab
from hotfix.diagnostics.compare import compare_grads
from hotfix.patches.torch_compile_recompute_graph import SWITCH, SWITCH_MODULE, patch

COLUMNS, FIRST_ROWS, SECOND_ROWS = 64, 37, 100


def gate(x, threshold, column, w1, w2):
    variance = x.var(0)
    return torch.where(variance[column] > threshold, x @ w1, x @ w2), variance


def _weights():
    generator = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(COLUMNS, COLUMNS, generator=generator).requires_grad_() for _ in range(2))
    first = torch.randn(FIRST_ROWS, COLUMNS, generator=generator)
    second = torch.randn(SECOND_ROWS, COLUMNS, generator=generator)
    return w1, w2, first, second


@pytest.fixture(scope="module")
def split():
    """A column whose variance the static and the dynamic graph compute apart, and a threshold between the two.
    Measured with Dynamo's LRU on (the fix reverted: an earlier non-reentrant checkpoint in this process turned it
    off), so that the third call runs the dynamic graph."""
    w1, w2, first, second = _weights()
    with reverted(patch):
        torch._dynamo.reset()
        compiled = torch.compile(gate)
        zero = torch.tensor(0.0)
        static = compiled(first, zero, 0, w1, w2)[1].detach()
        compiled(second, zero, 0, w1, w2)
        dynamic = compiled(first, zero, 0, w1, w2)[1].detach()
        torch._dynamo.reset()
    apart = (static != dynamic).nonzero().flatten().tolist()
    assert apart, "inductor's static and dynamic graphs computed every column's variance alike on this machine"
    low, high = sorted((static[apart[0]].item(), dynamic[apart[0]].item()))
    threshold = torch.tensor((low + high) / 2)
    assert low < threshold.item() < high
    return apart[0], threshold  # the column a constant of the graphs (a tensor index would break the graph)


def step(split, checkpointed):
    """One step, compiled afresh: the grads of both weights (None where one got none)."""
    column, threshold = split
    w1, w2, first, second = _weights()
    torch._dynamo.reset()
    compiled = torch.compile(gate)

    def layer(x):
        return compiled(x, threshold, column, w1, w2)[0]

    run = (lambda x: checkpoint(layer, x, use_reentrant=False)) if checkpointed else layer
    (run(first).square().sum() + run(second).square().sum()).backward()
    torch._dynamo.reset()
    return {"w1": w1.grad, "w2": w2.grad}


@pytest.fixture
def upstream():
    with reverted(patch):
        yield


@pytest.fixture
def switch_calls(monkeypatch):
    """The fix applied afresh (nothing settled), its calls of torch's switch recorded instead of made."""
    patch.revert()
    apply_again(patch)
    calls = []
    monkeypatch.setattr(patch, "_switch", calls.append)
    yield calls
    monkeypatch.undo()
    patch.revert()
    apply_again(patch)


def test_upstream_the_recomputation_runs_another_graph_than_its_forward(upstream):
    """Which graph runs, told by a backend that numbers them (no numerics): forward 1, forward 2, then the
    recomputations, the second call's first."""
    assert compile_graph_order.graphs_run() == [0, 1, 1, 1]


def test_with_the_fix_the_recomputation_runs_its_forwards_graph():
    assert patch.applied
    assert compile_graph_order.graphs_run() == [0, 1, 1, 0]


def test_upstream_the_recomputation_runs_the_graph_compiled_last(split, upstream):
    report = compare_grads(step(split, False), step(split, True), rtol=1e-4)
    assert report.wrong, report.summary()


def test_with_the_fix_the_gradients_equal_the_step_without_checkpointing(split):
    assert patch.applied
    reference, checkpointed = step(split, False), step(split, True)
    report = compare_grads(reference, checkpointed, rtol=1e-4)
    assert report.ok, report.summary()
    assert all(torch.equal(reference[name], checkpointed[name]) for name in reference)


def test_nothing_is_turned_off_before_a_non_reentrant_checkpointed_call(switch_calls):
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    layer(x).sum().backward()
    checkpoint(layer, x, use_reentrant=True).sum().backward()  # reentrant: not reached (its forward has no grad)
    assert switch_calls == []
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert switch_calls == [False]
    patch.revert()
    assert switch_calls == [False, True]


def test_the_programs_own_setting_stands(switch_calls, caplog):
    module = sys.modules[SWITCH_MODULE]
    assert patch.installed(getattr(module, SWITCH))
    getattr(module, SWITCH)(True)  # torch's own switch behind the fix's wrapper: sets torch's default
    layer = torch.nn.Linear(4, 4)
    with caplog.at_level(logging.WARNING, logger="hotfix"):
        checkpoint(layer, torch.randn(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
    assert switch_calls == []
    assert [r.getMessage() for r in caplog.records if "LRU cache on" in r.getMessage()]
    patch.revert()
    assert switch_calls == []  # the program set it: revert leaves it
    assert not hasattr(getattr(module, SWITCH), "__wrapped__")  # torch's own switch again
