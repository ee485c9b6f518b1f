"""moe-routing-replay in-process: a recomputation routes every token to the experts its forward chose.

A plain-torch mixture of experts (tests/support/moe_block.py: the experts that were hit run, as in transformers 4.x)
with the drift device of hotfix_lab.cases.moe_cases (router rows tied in groups of ``top_k + 1``, scaled by 1 +- 1e-6
during a recomputation only): upstream, reentrant checkpointing trains with wrong gradients and non-reentrant fails
with a CheckpointError; with the fix's routing, both equal to the step without checkpointing.  Also the engine's
pieces: regions (forward / recomputation, nesting, a second recomputation), ``Replay.topk`` outside regions, the
replayed values' autograd (topk's own: one tensor saved, the same gradient, bit for bit), where ``topk`` is found in
a class's code, and dynamo compiling a routed block whole.  Every MoE type of transformers 4.56.2 / 5.24.0:
tests/versions/test_moe_routing_census.py (the census).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointError, checkpoint

from conftest import apply_again
import moe_block
from hotfix_lab.cases import moe_cases
from hotfix.checkpointing.region import FORWARD, RECOMPUTE, Region, RegionCall, regions
from hotfix.checkpointing.routing import (TENSOR_METHOD, TORCH_FUNCTION, Replay, ScoresReplay, _values_at,
                                          sampling_helpers, topk_sites)
from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.patches.moe_routing_replay import patch


@pytest.fixture
def routing():
    """The fix applied here, routing the block's module; everything put back after (the module's torch too)."""
    assert patch.applied, "moe-routing-replay is not applied in the test process"
    yield patch
    patch.revert()
    apply_again(patch)
    assert moe_block.torch is torch and not isinstance(moe_block.sample_experts, ScoresReplay)


def step(model, x, function=None):
    model.zero_grad(set_to_none=True)
    model(x, checkpoint=function).backward()
    return collect_grads(model)


def drifted_model(method=False):
    model = moe_block.Model(method=method)
    assert moe_cases.tie_and_drift(model, moe_block.EXPERTS, moe_block.TOP_K) == 2
    # the input needs grad: a reentrant checkpoint recomputes nothing otherwise (torch, not the routing)
    return model, torch.randn(3, 5, moe_block.WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()


REENTRANT = functools.partial(checkpoint, use_reentrant=True)
NON_REENTRANT = functools.partial(checkpoint, use_reentrant=False)


@pytest.mark.parametrize("method", [False, True], ids=["torch.topk", "Tensor.topk"])
def test_upstream_the_recomputation_routes_otherwise(method):
    model, x = drifted_model(method)
    reference = step(model, x)
    report = compare_grads(reference, step(model, x, REENTRANT), rtol=1e-4)
    assert report.wrong or report.missing or report.unexpected, report.summary()
    with pytest.raises(CheckpointError):
        step(model, x, NON_REENTRANT)


@pytest.mark.parametrize("method", [False, True], ids=["torch.topk", "Tensor.topk"])
@pytest.mark.parametrize("function", [REENTRANT, NON_REENTRANT], ids=["reentrant", "non-reentrant"])
def test_with_the_fix_the_forward_routing_is_replayed(routing, method, function):
    model, x = drifted_model(method)
    reference = step(model, x)
    routing.route(model)
    assert routing.routing
    report = compare_grads(reference, step(model, x, function), rtol=1e-4)
    assert report.ok, report.summary()
    # a second recomputation of the same graph (retain_graph) replays from the start again
    model.zero_grad(set_to_none=True)
    loss = model(x, checkpoint=function)
    loss.backward(retain_graph=True)
    loss.backward()
    twice = {name: None if grad is None else grad / 2 for name, grad in collect_grads(model).items()}
    assert compare_grads(reference, twice, rtol=1e-4).ok


def test_without_drift_the_gradients_are_upstream_s_bit_for_bit(routing):
    model = moe_block.Model()
    x = torch.randn(3, 5, moe_block.WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()
    upstream = {mode: step(model, x, function) for mode, function in (("r", REENTRANT), ("n", NON_REENTRANT))}
    routing.route(model)
    for mode, function in (("r", REENTRANT), ("n", NON_REENTRANT)):
        replayed = step(model, x, function)
        assert all(torch.equal(upstream[mode][name], replayed[name]) for name in replayed), mode


def test_regions_nest_and_a_recomputation_reads_from_its_forward_s_start():
    seen = []
    call = RegionCall(lambda: seen.append([phase for _, phase in regions()]))
    call(), call(), call()
    assert seen == [[FORWARD], [RECOMPUTE], [RECOMPUTE]] and regions() == ()
    calls = []
    replay = Replay(torch.topk, lambda: False, lambda: calls.append("repaired"), calls.append)
    scores = torch.tensor([[0.5, 0.5, 0.1], [0.2, 0.3, 0.9]])
    outer, inner = Region(), Region()
    token = outer.enter(FORWARD)
    first = replay.topk(scores, 1)
    Region.leave(token)
    drifted = scores + torch.tensor([[0.0, 1e-6, 0.0], [0.0, 0.0, 0.0]])  # the tie breaks the other way
    assert torch.topk(drifted, 1).indices[0, 0] != first.indices[0, 0]
    token = outer.enter(RECOMPUTE)
    token_inner = inner.enter(FORWARD)  # a checkpoint begun inside the recomputation: the outer forward decided
    replayed = replay.topk(drifted, 1)
    Region.leave(token_inner)
    Region.leave(token)
    assert torch.equal(replayed.indices, first.indices) and calls == ["repaired"]
    assert torch.equal(replayed.values, drifted.gather(1, first.indices))
    assert len(inner.records) == 1 and torch.equal(inner.records[0], first.indices)
    token = outer.enter(RECOMPUTE)  # past the record's end: decided again, one line
    replay.topk(drifted, 1)
    replay.topk(drifted, 1)
    Region.leave(token)
    assert calls[-1].startswith("the recomputation asked for more")


def test_outside_a_region_it_is_torch_s_topk():
    replay = Replay(torch.topk, lambda: False, pytest.fail, pytest.fail)
    scores = torch.randn(4, 6)
    ours, theirs = replay.topk(scores, 2, dim=-1, largest=False), torch.topk(scores, 2, dim=-1, largest=False)
    assert type(ours) is type(theirs) and torch.equal(ours.values, theirs.values)
    assert torch.equal(ours.indices, theirs.indices)


def test_replayed_values_have_topk_s_autograd():
    scores = torch.randn(5, 7, requires_grad=True)
    saved = {}
    for name in ("topk", "replay"):
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
            values, indices = torch.topk(scores, 3)
            if name == "replay":
                values = _values_at(scores, indices.clone(), -1)
        grad, = torch.autograd.grad((values * torch.arange(3.0)).sum(), scores)
        saved[name] = (packed[1:] if name == "replay" else packed, grad)
    assert saved["topk"][0] == saved["replay"][0]  # one tensor, the indices (non-reentrant compares them)
    assert torch.equal(saved["topk"][1], saved["replay"][1])


def test_topk_is_found_in_the_code_of_the_classes():
    assert {(owner.__name__, name, how) for owner, name, _, how in topk_sites(moe_block.Block)} == {
        ("Block", "forward", TORCH_FUNCTION)}
    # decorated (@torch.no_grad()) and called as a method
    assert {(owner.__name__, name, how) for owner, name, _, how in topk_sites(moe_block.GroupRouter)} == {
        ("GroupRouter", "choose", TENSOR_METHOD)}
    assert topk_sites(torch.nn.Linear) == []


def test_a_routed_block_compiles_whole(routing):
    model = moe_block.Model()
    x = torch.randn(3, 5, moe_block.WIDTH)
    routing.route(model)
    assert type(moe_block.torch).__name__ == "RoutingTorch"
    compiled = torch.compile(model.blocks[0].gate, backend="eager", fullgraph=True)
    probs = torch.softmax(compiled(x.reshape(-1, moe_block.WIDTH)), dim=-1)
    router = torch.compile(lambda p: moe_block.torch.topk(p, 2, dim=-1), backend="eager", fullgraph=True)
    assert torch.equal(router(probs).indices, torch.topk(probs, 2, dim=-1).indices)


@pytest.mark.parametrize("function", [REENTRANT, NON_REENTRANT], ids=["reentrant", "non-reentrant"])
def test_a_patched_forward_routing_in_a_helper_of_its_module_is_replayed(routing, monkeypatch, function):
    """unsloth-zoo's way (tests/support/moe_patched.py): the class's forward replaced by another module's function,
    the topk in a module-level helper it calls.  Upstream the recomputation routes otherwise; with the fix (the
    helper found through the forward, its module's torch routed) equal."""
    import moe_patched

    monkeypatch.setattr(moe_block.Block, "forward", moe_patched.forward)
    assert {(owner.__name__, name, site.__name__) for owner, name, site, _ in topk_sites(moe_block.Block)} == {
        ("Block", "forward", "route_softmax_topk")}
    model, x = drifted_model()
    reference = step(model, x)
    if function is REENTRANT:
        upstream = compare_grads(reference, step(model, x, function), rtol=1e-4)
        assert upstream.wrong or upstream.missing or upstream.unexpected, upstream.summary()
    else:
        with pytest.raises(CheckpointError):
            step(model, x, function)
    routing.route(model)
    try:
        assert moe_patched.torch is not torch and routing.routing
        report = compare_grads(reference, step(model, x, function), rtol=1e-4)
        assert report.ok, report.summary()
    finally:
        routing.revert()
        assert moe_patched.torch is torch


def _torch_helper(scores):  # stands for a function of torch's own that calls topk (made torch's below)
    return torch.topk(scores, 1)


_torch_helper.__module__ = "torch.stand_in"


def test_a_helper_of_torch_s_own_is_never_a_site():
    """torch's code is never routed (its module's torch is torch's everywhere), as torch's classes are not."""

    class Calls(torch.nn.Module):
        def forward(self, scores):
            return _torch_helper(scores)

    assert topk_sites(Calls) == []


def sampling_step(model, x, function=None):
    torch.manual_seed(7)  # the helper's Gumbel draws: alike in every step (the checkpoint restores them itself)
    return step(model, x, function)


def drifted_sampling_model():
    model = moe_block.Model(sampling=True)
    assert moe_cases.tie_and_drift(model, moe_block.EXPERTS, moe_block.TOP_K) == 2
    return model, torch.randn(3, 5, moe_block.WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()


def test_a_helper_that_samples_experts_is_found_and_topk_helpers_are_not():
    assert [(owner, name, helper) for owner, name, helper in sampling_helpers(moe_block.Block)] == [
        (moe_block.Block, "forward", moe_block.sample_experts)]
    assert sampling_helpers(moe_block.GroupRouter) == [] and sampling_helpers(moe_block.Model) == []


def test_upstream_a_sampling_router_s_recomputation_routes_otherwise():
    model, x = drifted_sampling_model()
    reference = sampling_step(model, x)
    report = compare_grads(reference, sampling_step(model, x, REENTRANT), rtol=1e-4)
    assert report.wrong or report.missing or report.unexpected, report.summary()
    with pytest.raises(CheckpointError):
        sampling_step(model, x, NON_REENTRANT)


@pytest.mark.parametrize("function", [REENTRANT, NON_REENTRANT], ids=["reentrant", "non-reentrant"])
def test_with_the_fix_a_sampling_router_is_handed_its_forward_s_scores(routing, function):
    model, x = drifted_sampling_model()
    reference = sampling_step(model, x)
    routing.route(model)
    assert isinstance(moe_block.sample_experts, ScoresReplay) and routing.routing
    report = compare_grads(reference, sampling_step(model, x, function), rtol=1e-4)
    assert report.ok, report.summary()


def test_without_drift_a_sampling_router_s_gradients_are_upstream_s_bit_for_bit(routing):
    model = moe_block.Model(sampling=True)
    x = torch.randn(3, 5, moe_block.WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()
    upstream = {mode: sampling_step(model, x, function) for mode, function in (("r", REENTRANT), ("n", NON_REENTRANT))}
    routing.route(model)
    for mode, function in (("r", REENTRANT), ("n", NON_REENTRANT)):
        replayed = sampling_step(model, x, function)
        assert all(torch.equal(upstream[mode][name], replayed[name]) for name in replayed), mode
