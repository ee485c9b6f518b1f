"""hotfix/checkpointing/shared_state.py in-process: tensors a layer stores into a mapping shared across layers.

The model mimics 5.x Gemma-4 KV sharing: every layer is handed one ``UserDict`` by keyword (as
``GradientCheckpointingLayer`` does, through ``partial``); two "producer" layers store their keys
into it, two "consumer" layers read them instead of computing their own.  Failing without (reentrant
checkpointing: the stored keys are constants, the producers' key weights get WRONG gradients, no
error), passing with (every gradient equals the run without checkpointing), through the keyword fix's
own checkpoint wrapper; the caller's mapping is left as the forward left it, and nothing keeps it alive.
"""

from __future__ import annotations

import collections
import gc
import weakref

import torch
from layer_calls import CheckpointedLayers

from hotfix.diagnostics.compare import compare_grads


class SharedKeys(collections.UserDict):
    """Stands in for transformers' KVSharingDict (a UserDict, so not a dict)."""


class Layer(torch.nn.Module):
    def __init__(self, kind, role):
        super().__init__()
        self.kind, self.role = kind, role  # role: "store" | "reuse" | "own"
        self.query = torch.nn.Linear(4, 4)
        self.key = torch.nn.Linear(4, 4)

    def forward(self, hidden, shared=None):
        if self.role == "reuse":
            keys = shared[self.kind]
        else:
            keys = torch.tanh(self.key(hidden))
            if self.role == "store":
                shared[self.kind] = (keys, keys * 2)
        if isinstance(keys, tuple):
            keys = keys[0] + keys[1]
        return hidden + torch.sigmoid(self.query(hidden)) * keys


class Model(CheckpointedLayers):
    ROLES = [("sliding", "own"), ("sliding", "store"), ("full", "store"), ("sliding", "reuse"), ("full", "reuse")]

    def __init__(self, fix, reentrant=True):
        super().__init__(fix, reentrant)
        self.layers = torch.nn.ModuleList([Layer(kind, role) for kind, role in self.ROLES])
        self.head = torch.nn.Linear(4, 1)
        self.last_shared = None

    def forward(self, x):
        shared = self.last_shared = SharedKeys()
        for layer in self.layers:
            x = self.call_layer(layer, x, shared=shared)
        return self.head(x).pow(2).sum()


def _compare(grads_of, fix, reentrant=True):
    torch.manual_seed(0)
    model = Model(fix, reentrant).train()
    x = torch.randn(3, 4)
    return compare_grads(grads_of(model, x, False), grads_of(model, x, True))


def test_stored_tensors_get_wrong_gradients_without_and_exact_ones_with_the_fix(grads_of):
    broken = _compare(grads_of, fix=False)
    assert broken.wrong and not broken.missing, broken.summary()  # upstream: silent, no error
    fixed = _compare(grads_of, fix=True)
    assert fixed.ok and fixed.total == len(list(Model(True).parameters())), fixed.summary()


def test_non_reentrant_needs_nothing_and_the_fix_changes_nothing_there(grads_of):
    assert _compare(grads_of, fix=False, reentrant=False).ok
    assert _compare(grads_of, fix=True, reentrant=False).ok


def test_the_callers_mapping_holds_connected_tensors_and_backward_leaves_it_alone():
    torch.manual_seed(0)
    model = Model(fix=True).train()
    model.checkpointing = True
    loss = model(torch.randn(3, 4, requires_grad=True))
    shared = model.last_shared
    stored = {kind: shared[kind] for kind in ("sliding", "full")}
    assert all(t.grad_fn is not None for pair in stored.values() for t in pair)  # connected, not constants
    loss.backward()  # recomputes the producers: they store into copies
    assert all(shared[kind] is stored[kind] for kind in stored)


def test_nothing_keeps_the_shared_mapping_alive_after_backward():
    torch.manual_seed(0)
    model = Model(fix=True).train()
    model.checkpointing = True
    model(torch.randn(3, 4, requires_grad=True)).backward()
    alive = weakref.ref(model.last_shared)
    model.last_shared = None
    gc.collect()
    assert alive() is None


# ---------------------------------------------------------------------------------------------------------
# Issue 27: the caller's mapping sees exactly what it would without checkpointing, whatever MutableMapping
# it is (tests/support/shared_state_cases.py: store a tensor needing grad, bump a counter, append to a list,
# write into a nested dict, delete a key; the next layer reads the tensors).
import logging  # noqa: E402

import pytest  # noqa: E402
import shared_state_cases as cases  # noqa: E402

from hotfix.diagnostics.compare import collect_grads  # noqa: E402
from hotfix.patches.transformers_checkpoint_layer_io import patch as layer_io  # noqa: E402


class WriterModel(CheckpointedLayers):
    def __init__(self, fix, in_place=False):
        super().__init__(fix)
        self.layers = torch.nn.ModuleList(cases.layers(2, in_place))

    def forward(self, x, state):
        for layer in self.layers:
            x = self.call_layer(layer, x, state=state)
        return x


def _run(mapping, fix, checkpointing, in_place=False):
    model = WriterModel(fix, in_place).train()
    model.checkpointing = checkpointing
    state = cases.initial_state(cases.MAPPINGS[mapping], in_place)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = model(x, state)
    after_forward = cases.snapshot(state)
    cases.loss_of(out, state, in_place).backward()
    return {"forward": after_forward, "backward": cases.snapshot(state), "grads": collect_grads(model)}


@pytest.fixture
def hotfix_lines(caplog):
    layer_io._warned.clear()  # warn_once remembers for the patch's life: each test starts fresh
    caplog.set_level(logging.WARNING, logger="hotfix")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "hotfix"]


@pytest.mark.parametrize("mapping", ["dict", "UserDict", "OrderedDict", "defaultdict", "SharedStorage"])
def test_the_callers_mapping_and_the_gradients_equal_the_run_without_checkpointing(mapping, hotfix_lines):
    reference = _run(mapping, fix=False, checkpointing=False)
    upstream = _run(mapping, fix=False, checkpointing=True)
    # upstream: the stored tensors are constants and the recomputation writes into the caller's mapping again
    assert not compare_grads(reference["grads"], upstream["grads"]).ok
    assert not cases.same(reference["backward"], upstream["backward"])
    fixed = _run(mapping, fix=True, checkpointing=True)
    assert cases.same(reference["forward"], fixed["forward"]), (reference["forward"], fixed["forward"])
    assert cases.same(reference["backward"], fixed["backward"]), (reference["backward"], fixed["backward"])
    report = compare_grads(reference["grads"], fixed["grads"])
    assert report.ok and report.total == 4, report.summary()
    assert hotfix_lines() == []


def test_a_mapping_that_cannot_be_copied_is_left_to_upstream_and_said_once(hotfix_lines):
    upstream = _run("Uncopyable", fix=False, checkpointing=True)
    fixed = _run("Uncopyable", fix=True, checkpointing=True)
    # never worse than upstream: exactly upstream's results...
    assert cases.same(upstream["forward"], fixed["forward"]) and cases.same(upstream["backward"], fixed["backward"])
    assert compare_grads(upstream["grads"], fixed["grads"]).ok
    # ...and one line naming the layer and the mapping
    _run("Uncopyable", fix=True, checkpointing=True)
    lines = hotfix_lines()
    assert len(lines) == 1 and "Writer is handed a Uncopyable that cannot be copied privately" in lines[0], lines
    assert "use_reentrant=False" in lines[0]


def _wrong_or_crash(reference, **run):
    try:
        candidate = _run(**run)
    except RuntimeError as exc:
        return f"crash: {exc}"[:80]
    return "wrong" if not compare_grads(reference["grads"], candidate["grads"]).ok else "equal"


def test_a_tensor_changed_in_place_through_the_mapping_is_reported_once(hotfix_lines):
    reference = _run("dict", fix=False, checkpointing=False, in_place=True)
    upstream = _wrong_or_crash(reference, mapping="dict", fix=False, checkpointing=True, in_place=True)
    fixed = _wrong_or_crash(reference, mapping="dict", fix=True, checkpointing=True, in_place=True)
    # not repairable under reentrant checkpointing: as broken as upstream, never silently
    assert upstream != "equal" and fixed[:5] == upstream[:5], (upstream, fixed)
    lines = hotfix_lines()
    assert len(lines) == 1 and "Writer changes in place a tensor it received through a mapping" in lines[0], lines
    assert "not repairable under reentrant checkpointing" in lines[0] and "use_reentrant=False" in lines[0]
