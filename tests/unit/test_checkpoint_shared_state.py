"""patches/_checkpoint_shared_state.py in-process: tensors a layer stores into a mapping shared across layers.

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
