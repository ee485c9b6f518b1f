"""patches/transformers_ddp_find_unused.py in-process: DDP(find_unused_parameters=True), one gloo rank.

DDP's unused-parameter search and its "ready" marks are local to a rank, so one rank (world size 1,
loopback) shows the defect: a model whose layers call ``torch.utils.checkpoint.checkpoint`` (reentrant)
through a stand-in for transformers' stored checkpoint function fails upstream with "Expected to mark
a variable ready only once", and trains with the fix's wrapper around that function, every gradient
equal to DDP without checkpointing (a parameter the forward never uses: no gradient in both; a layer
checkpointed twice per forward; gradient accumulation with ``no_sync``).  The
wrapper leaves the call as it is outside a searching DDP (no DDP, static_graph, no_sync).  Also the
parameter swap of the recomputation (restored after the call, also when it raises).  Finding the layer in
the shapes a checkpoint function receives: tests/unit/test_layer_call.py.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import wrapt
from torch import nn
from torch.utils.checkpoint import checkpoint

from conftest import free_port
from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.checkpointing.ddp import trainable_slots, with_parameters_as_inputs
from hotfix.patches.torch_ddp_find_unused import patch as direct_fix
from hotfix.patches.transformers_ddp_find_unused import checkpoint_with_visible_parameters, patch

FIND_UNUSED = "Expected to mark a variable ready only once"
REENTRANT = functools.partial(checkpoint, use_reentrant=True)  # what transformers stores on a layer


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.never_used = nn.Parameter(torch.ones(4))

    def forward(self, x, scale=1.0):
        return x + torch.tanh(self.lin(x)) * scale


class Model(nn.Module):
    """Two checkpointed layers called as transformers' layers call them: ``function(partial(layer, **kw), x)``."""

    def __init__(self, function=None, shared=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 4)
        self.layers = nn.ModuleList([Layer(), Layer()])
        if shared:  # ALBERT-style: one layer called twice, each call checkpointed
            self.layers[1] = self.layers[0]
        self.head = nn.Linear(4, 1)
        self.function = function

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            if self.function is None:
                x = layer(x, scale=0.5)
            else:
                x = self.function(functools.partial(layer.__call__, scale=0.5), x)
        return self.head(x).sum()


@pytest.fixture(scope="module")
def one_rank():
    # This file tests transformers-ddp-find-unused's wrapper on its own: torch's checkpoint as upstream has it,
    # without torch-ddp-find-unused (which repairs it wherever it is entered; tested last, below)
    was_applied = direct_fix.applied
    direct_fix.revert()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()
    if was_applied:
        direct_fix.apply(torch.utils.checkpoint)


def fixed_function():
    return wrapt.FunctionWrapper(REENTRANT, checkpoint_with_visible_parameters(patch))


def ddp_grads(function, steps=2, no_sync=False, shared=False, **ddp_kwargs):
    model = Model(function, shared)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True, **ddp_kwargs)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        if no_sync:
            with ddp.no_sync():
                ddp(x[:2]).backward()
            ddp(x[2:]).backward()
        else:
            ddp(x).backward()
    return collect_grads(model)


def test_upstream_fails_and_the_fix_gives_the_gradients_without_checkpointing(one_rank):
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp_grads(REENTRANT)
    reference = ddp_grads(None)
    got = ddp_grads(fixed_function())
    report = compare_grads(reference, got, rtol=1e-6)
    assert report.ok and len(report.equal) == 10, report.summary()
    assert reference["layers.0.never_used"] is None and got["layers.0.never_used"] is None


def test_gradient_accumulation_with_no_sync(one_rank):
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp_grads(REENTRANT, no_sync=True)
    report = compare_grads(ddp_grads(None, no_sync=True), ddp_grads(fixed_function(), no_sync=True), rtol=1e-6)
    assert report.ok, report.summary()


def test_a_layer_checkpointed_twice_per_forward(one_rank):
    """torch's DDP documentation: with reentrant checkpointing a layer checkpointed more than once is not
    supported.  With the fix and find_unused_parameters=True its gradients sum once, as without checkpointing."""
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp_grads(REENTRANT, shared=True)
    report = compare_grads(ddp_grads(None, shared=True), ddp_grads(fixed_function(), shared=True), rtol=1e-6)
    assert report.ok and len(report.equal) == 7, report.summary()


def test_outside_a_searching_ddp_the_call_is_unchanged(one_rank):
    """No DDP forward running, static_graph=True (no search: upstream trains), no_sync (no search this step):
    the checkpoint function gets exactly the call it was given."""
    seen = []

    def spy(function, *inputs, **kwargs):
        seen.append(len(inputs))
        return REENTRANT(function, *inputs, **kwargs)

    wrapper = wrapt.FunctionWrapper(spy, checkpoint_with_visible_parameters(patch))
    Model(wrapper)(torch.randn(2, 4)).backward()
    ddp = nn.parallel.DistributedDataParallel(Model(wrapper), find_unused_parameters=True, static_graph=True)
    ddp(torch.randn(2, 4)).backward()
    ddp = nn.parallel.DistributedDataParallel(Model(wrapper), find_unused_parameters=True)
    with ddp.no_sync():
        ddp(torch.randn(2, 4)).backward()
    assert seen == [1] * 6
    ddp(torch.randn(2, 4)).backward()  # searching: each layer's 3 trainable parameters become inputs
    assert seen[6:] == [4, 4]


UNSEEN = Layer()  # a module the checkpointed function reaches through a global: out of the fix's sight


def _through_a_global(x):
    return UNSEEN(x)


def test_a_call_whose_layer_is_not_found_is_left_as_it_is_with_one_line(one_rank, caplog):
    """The one case the fix leaves to upstream's error: said once, the call unchanged (DDP's error follows)."""
    caplog.set_level(logging.WARNING, logger="hotfix")
    fix = type(patch)()
    wrapper = wrapt.FunctionWrapper(REENTRANT, checkpoint_with_visible_parameters(fix))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.layer = nn.Linear(4, 4), UNSEEN

        def forward(self, x):
            x = self.embed(x)
            for _ in range(2):
                x = wrapper(_through_a_global, x)
            return x.sum()

    ddp = nn.parallel.DistributedDataParallel(Model(), find_unused_parameters=True)
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp(torch.randn(2, 4)).backward()
    lines = [r.getMessage() for r in caplog.records if r.name == "hotfix"]
    assert len(lines) == 1 and "transformers-ddp-find-unused" in lines[0] and "cannot find" in lines[0], lines


def test_the_recomputation_runs_with_the_twins_and_restores_the_parameters():
    layer = Layer()
    layer.never_used.requires_grad_(False)  # frozen: never an input
    slots = trainable_slots([layer])
    parameters = tuple(p for _, _, p in slots)
    assert [name for _, name, _ in slots] == ["weight", "bias"]
    seen, recomputed = [], []

    def function(x):
        seen.append(layer.lin.weight)
        if x is None:
            raise ValueError("boom")
        return x

    run = with_parameters_as_inputs(function, 1, slots, parameters, lambda: recomputed.append(True))
    run(torch.ones(1), *parameters)  # the checkpoint's forward: the parameters themselves
    assert seen[-1] is layer.lin.weight and recomputed == []
    twins = tuple(p.detach().requires_grad_() for p in parameters)
    run(torch.ones(1), *twins)  # the recomputation: detached copies
    assert seen[-1] is twins[0] and recomputed == [True]
    assert layer.lin.weight is parameters[0] and layer.lin.bias is parameters[1]
    with pytest.raises(ValueError):
        run(None, *twins)
    assert layer.lin.weight is parameters[0] and isinstance(layer.lin.weight, nn.Parameter)


def test_torch_ddp_find_unused_repairs_the_same_call_entered_directly(one_rank):
    """torch-ddp-find-unused: the model calling torch's reentrant checkpoint itself (no transformers function, no
    slot), failing above without it, trains with it applied, every gradient equal to DDP without checkpointing;
    where transformers' fix has passed the parameters already it adds nothing (the same gradients)."""
    import torch.utils.checkpoint as torch_checkpoint

    original = torch_checkpoint.CheckpointFunction.__dict__.get("apply")
    reference = ddp_grads(None)
    assert direct_fix.apply(torch_checkpoint)
    try:
        for function in (REENTRANT, fixed_function()):
            report = compare_grads(reference, ddp_grads(function), rtol=1e-6)
            assert report.ok and len(report.equal) == 10, report.summary()
        assert ddp_grads(REENTRANT)["layers.0.never_used"] is None
    finally:
        direct_fix.revert()
    assert torch_checkpoint.CheckpointFunction.__dict__.get("apply") is original
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp_grads(REENTRANT)


def test_torch_ddp_find_unused_repairs_the_call_after_unsloths_swap(one_rank, monkeypatch):
    """unsloth's smart gradient checkpointing swaps its ``UnslothCheckpointFunction`` in for torch's class (a stand-in
    here, of the same shape: the real release, swapped as unsloth does, is tests/e2e/test_ddp_direct_checkpoint.py):
    torch's checkpoint then reaches that class, whose ``apply`` the fix wraps too.  Failing without; with it every
    gradient equal to DDP without checkpointing; its drift check of torch's module still finds torch's own class
    and function; revert puts back exactly what was there."""
    import sys
    import types

    import torch.utils.checkpoint as torch_checkpoint

    from hotfix.checkpointing import unsloth

    release = types.ModuleType(unsloth.MODULE)

    class UnslothCheckpointFunction(torch_checkpoint.CheckpointFunction):
        pass

    release.UnslothCheckpointFunction = UnslothCheckpointFunction
    monkeypatch.setitem(sys.modules, unsloth.MODULE, release)
    monkeypatch.setattr(torch_checkpoint, "_old_CheckpointFunction", torch_checkpoint.CheckpointFunction, raising=False)
    monkeypatch.setattr(torch_checkpoint, "CheckpointFunction", UnslothCheckpointFunction)
    reference = ddp_grads(None)
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        ddp_grads(REENTRANT)
    assert direct_fix.drift(torch_checkpoint) is None and direct_fix.drift(release) is None
    assert direct_fix.apply(release)
    try:
        report = compare_grads(reference, ddp_grads(REENTRANT), rtol=1e-6)
        assert report.ok and len(report.equal) == 10, report.summary()
    finally:
        direct_fix.revert()
    assert "apply" not in UnslothCheckpointFunction.__dict__


_TORCH_2_14_SHAPE = '''
class CheckpointFunction:
    pass

def _checkpoint_impl(function, *args, use_reentrant=None):
    return CheckpointFunction.apply(function, True, *args)

def checkpoint(function, *args, use_reentrant=None):
    return _checkpoint_impl(function, *args, use_reentrant=use_reentrant)
'''


@pytest.mark.parametrize("shape", ["checkpoint() calls it", "a helper of checkpoint() calls it", "nothing calls it"])
def test_the_drift_check_follows_checkpoint_into_the_helper_torch_2_14_calls(shape):
    """torch 2.14 moved the reentrant call from ``checkpoint()`` into ``_checkpoint_impl()``: the fix applies there
    (2026-11-28: under torch 2.14.1 it was skipped as drifted before), and says drift where nothing calls the class."""
    import types

    module = types.ModuleType("torch.utils.checkpoint")
    source = _TORCH_2_14_SHAPE
    if shape == "checkpoint() calls it":
        source = source.replace("return _checkpoint_impl(function, *args, use_reentrant=use_reentrant)",
                                "return CheckpointFunction.apply(function, True, *args)")
    elif shape == "nothing calls it":
        source = source.replace("CheckpointFunction.apply(", "function(")
    exec(compile(source, "<torch.utils.checkpoint>", "exec"), module.__dict__)
    found = direct_fix.drift(module)
    assert found == (None if shape != "nothing calls it" else "checkpoint() no longer calls CheckpointFunction.apply")


class Sequence(nn.Module):
    """Blocks run in segments, each segment a closure over the whole tuple of blocks and its bounds, checkpointed
    reentrantly: the shape of timm's ``checkpoint_seq`` (its models under ``set_grad_checkpointing(True)`` with
    reentrant checkpointing opted in), a parameter never used."""

    def __init__(self, checkpointing):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*(Layer() for _ in range(3)))
        self.checkpointing = checkpointing

    def forward(self, x):
        blocks = tuple(self.blocks.children())

        def segment(start, end):
            def run(hidden):
                for index in range(start, end + 1):
                    hidden = blocks[index](hidden)
                return hidden
            return run

        if not self.checkpointing:
            return self.blocks(x).sum()
        for start in range(0, len(blocks), 2):  # segments of two blocks, the last of one
            x = checkpoint(segment(start, min(start + 1, len(blocks) - 1)), x, use_reentrant=True)
        return x.sum()


def test_blocks_in_a_tuple_inside_the_checkpointed_closure(one_rank):
    """torch-ddp-find-unused found no layer in a closure holding its blocks as a tuple (timm's checkpoint_seq): "ready
    only once" with the fix applied.  Each block of the tuple is now a module the call may run: equal."""
    import torch.utils.checkpoint as torch_checkpoint

    def grads(checkpointing):
        model = Sequence(checkpointing)
        ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        ddp(torch.randn(4, 4, generator=torch.Generator().manual_seed(1)).requires_grad_(True)).backward()
        return collect_grads(model)

    reference = grads(False)
    with pytest.raises(RuntimeError, match=FIND_UNUSED):
        grads(True)
    warned = []
    assert direct_fix.apply(torch_checkpoint)
    try:
        with pytest.MonkeyPatch.context() as patching:
            patching.setattr(direct_fix, "warn_once", lambda *args, **kwargs: warned.append(args))
            report = compare_grads(reference, grads(True), rtol=1e-6)
    finally:
        direct_fix.revert()
    assert report.ok and not report.missing and len(report.equal) == 9, report.summary()  # never_used: none in both
    # each segment holds every block and runs some: a block another segment runs is no "unused parameter"
    assert warned == [], warned


def test_the_slot_stands_in_the_composed_call_only_inside_a_ddp_forward(monkeypatch):
    """Outside one (no DDP, eval) the slot stays out of the composed call: its check would find no DDP at every call
    (issue 52: hotfix_lab.bench.wrapper_cost).  The state is asked at every read (a C call, no Python frame) and the
    composition follows it; inside a DDP forward that does not search (static_graph, no_sync) the wrapper itself
    hands the call on unchanged (test_outside_a_searching_ddp_the_call_is_unchanged)."""
    import types

    from torch.nn.parallel import DistributedDataParallel

    from hotfix.checkpointing.slot import ATTRIBUTE, CheckpointFunctionSlot

    class Layer(nn.Module):
        pass

    def tagged(wrapped, instance, args, kwargs):
        return ("ddp slot", wrapped(*args, **kwargs))

    raw = functools.partial(max, 0)
    assert patch.serves(raw) is True and patch.settled(raw) is True  # nothing about the function changes its answer
    Layer._gradient_checkpointing_func = CheckpointFunctionSlot(Layer, tagged, lambda: False, rank=1,
                                                                active=patch.acting_while())
    layer = Layer()
    layer._gradient_checkpointing_func = raw
    monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", None, raising=False)
    assert getattr(layer, ATTRIBUTE) is raw  # outside a DDP forward: the stored function itself
    searching = types.SimpleNamespace(find_unused_parameters=True, static_graph=False, require_backward_grad_sync=True)
    monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", searching)
    assert getattr(layer, ATTRIBUTE)(5) == ("ddp slot", 5)
    monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", None)
    assert getattr(layer, ATTRIBUTE) is raw
