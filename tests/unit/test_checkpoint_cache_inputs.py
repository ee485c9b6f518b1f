"""hotfix/checkpointing/inputs.py in-process: tensors that reach a checkpointed layer inside a transformers ``Cache``.

The model mimics 5.x DiffusionGemma: an encoder (not checkpointed) fills a ``DynamicCache`` with keys and
values, layer after layer, and every decoder layer, handed that cache by keyword (as
``GradientCheckpointingLayer`` does, through ``partial``), reads its entry and appends its own keys
without changing the cache.  Failing without (reentrant checkpointing: each layer's recomputation reaches
the encoder's graph through the cache, "Trying to backward through the graph a second time"), passing
with (every gradient equals the run without checkpointing), through the keyword fix's own checkpoint
wrapper; the caller's cache still holds its own tensors afterwards.
"""

from __future__ import annotations

import pytest
import torch
from layer_calls import CheckpointedLayers

from hotfix.diagnostics.compare import compare_grads

cache_utils = pytest.importorskip("transformers.cache_utils")


class DecoderLayer(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        self.query = torch.nn.Linear(4, 4)
        self.key = torch.nn.Linear(4, 4)

    def forward(self, hidden, past_key_values=None):
        entry = past_key_values.layers[self.index]
        keys = torch.cat([entry.keys, self.key(hidden)], dim=-2)  # appended, the cache left unchanged
        values = torch.cat([entry.values, hidden], dim=-2)
        weights = torch.softmax(self.query(hidden) @ keys.transpose(-1, -2), dim=-1)
        return hidden + weights @ values


class Model(CheckpointedLayers):
    def __init__(self, fix):
        super().__init__(fix)
        self.encoder = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.layers = torch.nn.ModuleList([DecoderLayer(i) for i in range(2)])
        self.head = torch.nn.Linear(4, 1)
        self.last_cache = None

    def forward(self, x):
        cache = self.last_cache = cache_utils.DynamicCache()
        encoded = x
        for i, encode in enumerate(self.encoder):  # chained: both entries depend on the first encoder layer
            encoded = torch.tanh(encode(encoded))
            cache.update(encoded, encoded * 2, i)
        hidden = x
        for layer in self.layers:
            hidden = self.call_layer(layer, hidden, past_key_values=cache)
        return self.head(hidden).pow(2).sum()


def _model(fix):
    torch.manual_seed(0)
    return Model(fix).train()


def test_cache_tensors_break_backward_without_and_are_exact_with_the_fix(grads_of):
    x = torch.randn(1, 3, 4)
    broken = _model(fix=False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        grads_of(broken, x, True)

    fixed = _model(fix=True)
    report = compare_grads(grads_of(fixed, x, False), grads_of(fixed, x, True))
    assert report.ok and not report.missing, report.summary()
    assert any(name.startswith("encoder.") for name in report.equal), report.summary()


def test_the_callers_cache_keeps_its_own_tensors(grads_of):
    model = _model(fix=True)
    grads_of(model, torch.randn(1, 3, 4), True)
    entries = model.last_cache.layers
    assert len(entries) == 2 and all(entry.keys.shape[-2] == 3 for entry in entries)  # nothing appended twice
    assert all(entry.keys.grad_fn is not None for entry in entries)  # the encoder's own tensors, not twins


# -- a layer that appends to a cache already holding keys/values that need grad (issue 31, item 3) -------------
class AppendingLayer(torch.nn.Module):
    """Appends its keys/values to its cache entry (``cache.update``), as attention layers do, and attends over them."""

    def __init__(self, index):
        super().__init__()
        self.index = index
        self.query, self.key, self.value = (torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, hidden, kv_cache=None):
        keys, values = kv_cache.update(self.key(hidden), self.value(hidden), self.index)
        weights = torch.softmax(self.query(hidden) @ keys.transpose(-1, -2), dim=-1)
        return hidden + weights @ values


class PrefixModel(CheckpointedLayers):
    """Prefix tuning: a trainable projection fills the cache with 3 positions per layer before 5 tokens run."""

    def __init__(self, fix):
        super().__init__(fix)
        self.prefix = torch.nn.Linear(4, 16)
        self.layers = torch.nn.ModuleList([AppendingLayer(i) for i in range(2)])
        self.head = torch.nn.Linear(4, 1)
        self.last_cache = None

    def forward(self, x, prefix_tokens):
        cache = self.last_cache = cache_utils.DynamicCache()
        for i, states in enumerate(self.prefix(prefix_tokens).split(8, dim=-1)):
            cache.update(states[..., :4], states[..., 4:], i)
        hidden = x
        for layer in self.layers:
            hidden = self.call_layer(layer, hidden, kv_cache=cache)
        return self.head(hidden).pow(2).sum()


def _prefix_step(model, x, prefix_tokens, checkpointing):
    from hotfix.diagnostics.compare import collect_grads

    model.zero_grad(set_to_none=True)
    model.checkpointing = checkpointing
    model(x, prefix_tokens).backward()
    return collect_grads(model)


@pytest.mark.parametrize("hidden_needs_grad", [False, True], ids=["frozen-hidden", "hidden-needs-grad"])
def test_a_layer_appending_to_a_cache_with_prefix_tensors_gets_the_prefix_gradient_once(hidden_needs_grad):
    """Upstream the checkpoint sees no input needing grad where the hidden states need none (the layers and the
    prefix silently get no gradient); where they do, the layer's forward appends to the caller's cache, the
    recomputation appends again (13 positions instead of 8) and reads keys cut off from the prefix, which
    silently gets no gradient.  With the fix the layer writes into a private copy, its new keys/values are
    stored connected, each recomputation starts from the cache the forward saw: every gradient and the
    cache equal the run without checkpointing."""
    torch.manual_seed(0)
    x = torch.randn(1, 5, 4, requires_grad=hidden_needs_grad)
    prefix_tokens = torch.randn(1, 3, 4)
    broken = PrefixModel(fix=False).train()
    reference = _prefix_step(broken, x, prefix_tokens, False)
    assert all(entry.keys.shape[-2] == 8 for entry in broken.last_cache.layers)
    upstream = compare_grads(reference, _prefix_step(broken, x, prefix_tokens, True))
    assert "prefix.weight" in upstream.missing, upstream.summary()
    if hidden_needs_grad:
        assert all(entry.keys.shape[-2] == 13 for entry in broken.last_cache.layers)  # appended twice

    fixed = PrefixModel(fix=True).train()
    fixed.load_state_dict(broken.state_dict())
    report = compare_grads(reference, _prefix_step(fixed, x, prefix_tokens, True))
    assert report.ok and "prefix.weight" in report.equal, report.summary()
    entries = fixed.last_cache.layers
    assert all(entry.keys.shape[-2] == 8 and entry.values.shape[-2] == 8 for entry in entries)  # once, as without
    assert all(entry.keys.grad_fn is not None for entry in entries)  # stored connected, as without checkpointing
