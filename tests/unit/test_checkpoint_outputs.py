"""hotfix/checkpointing/outputs.py in-process: nested and unused outputs of a reentrant checkpoint.

Failing without (the nested tensor leaves the checkpoint detached: its producer's parameters get no
gradient), passing with (every gradient equals the run without checkpointing), and the structure the
layer returned comes back: tuples, named tuples, lists, dicts and non-tensor leaves (a list returned at
the top is cut off whole: only a tuple's tensors are a Function's outputs).  An output the loss
never uses: upstream its producer gets a zero gradient, with FlatOutputs none, as without checkpointing.
"""

from __future__ import annotations

import collections

import torch
from torch.utils.checkpoint import checkpoint

from hotfix.diagnostics.compare import compare_grads
from hotfix.checkpointing.layer_call import layer_call
from hotfix.checkpointing.outputs import FlatOutputs

Stage = collections.namedtuple("Stage", "hidden extra")


class Nested(torch.nn.Module):
    """Returns ((hidden,), height, width) like PvtV2EncoderLayer, or another nesting."""

    def __init__(self, shape="pvt"):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.shape = shape

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if self.shape == "pvt":
            return (h,), 3, 5
        if self.shape == "named":
            return Stage(hidden=[h], extra={"scaled": h * 2, "note": "x"})
        if self.shape == "list":  # a list is one object to an autograd.Function: every tensor in it is cut off
            return [h, h * 2]
        return {"hidden": h}


class Model(torch.nn.Module):
    def __init__(self, shape="pvt", fix=False, reentrant=True):
        super().__init__()
        self.layers = torch.nn.ModuleList([Nested(shape) for _ in range(2)])
        self.head = torch.nn.Linear(4, 1)
        self.fix, self.reentrant, self.checkpointing = fix, reentrant, False

    def _unpack(self, out):
        if isinstance(out, dict):
            return out["hidden"]
        if isinstance(out, list):
            return out[0] + out[1]
        if len(out) == 2:  # Stage (upstream's autograd.Function hands back a plain tuple)
            assert isinstance(out, Stage) or not self.fix
            hidden, extra = out
            assert extra["note"] == "x"
            return hidden[0] + extra["scaled"]
        (hidden,), height, width = out
        assert (height, width) == (3, 5)
        return hidden

    def forward(self, x):
        for layer in self.layers:
            if self.checkpointing:
                call = FlatOutputs(layer) if self.fix else layer
                out = checkpoint(call, x, use_reentrant=self.reentrant)
                out = call.rebuild(out) if self.fix else out
            else:
                out = layer(x)
            x = self._unpack(out)
        return self.head(x).pow(2).sum()


def _compare(grads_of, shape, fix, reentrant=True):
    torch.manual_seed(0)
    model = Model(shape, fix, reentrant).train()
    x = torch.randn(2, 4)
    return compare_grads(grads_of(model, x, False), grads_of(model, x, True))


def test_nested_output_loses_gradients_without_and_keeps_them_with_flat_outputs(grads_of):
    for shape in ("pvt", "named", "dict", "list"):
        broken = _compare(grads_of, shape, fix=False)
        assert broken.missing, (shape, broken.summary())  # upstream: silent, no error
        fixed = _compare(grads_of, shape, fix=True)
        assert fixed.ok and fixed.total == 6, (shape, fixed.summary())


def test_non_reentrant_needs_nothing_and_flat_outputs_changes_nothing_there(grads_of):
    assert _compare(grads_of, "pvt", fix=False, reentrant=False).ok
    assert _compare(grads_of, "pvt", fix=True, reentrant=False).ok


def test_flat_outputs_pass_through_what_the_checkpoint_already_sees():
    hidden = torch.ones(2)
    for output in (hidden, (hidden, None), (hidden, hidden * 2), (hidden, [1, "x"])):
        flat = FlatOutputs(lambda: output)
        assert flat() is output and flat.nested is False
        assert flat.rebuild(output) is output


def test_the_remembered_structure_holds_no_tensor_and_others_see_the_layer_through_it():
    layer = Nested("pvt")
    flat = FlatOutputs(layer)
    result = flat(torch.randn(2, 4))
    assert flat.nested and isinstance(result, tuple) and len(result) == 1
    (inner,), height, width = flat._skeleton
    assert not isinstance(inner, torch.Tensor) and (height, width) == (3, 5)  # no activation kept alive
    assert layer_call(flat) is layer


class TwoStreams(torch.nn.Module):
    """Returns (text, layout) like LiltLayer; the model discards the last layer's layout output."""

    def __init__(self):
        super().__init__()
        self.text, self.mix, self.layout = (torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, y):
        return torch.tanh(self.text(x) + self.mix(y)), torch.tanh(self.layout(y))


class TwoStreamModel(torch.nn.Module):
    def __init__(self, fix=False, reentrant=True):
        super().__init__()
        self.layers = torch.nn.ModuleList([TwoStreams() for _ in range(2)])
        self.fix, self.reentrant, self.checkpointing = fix, reentrant, False

    def forward(self, x):
        y = x * 2
        for layer in self.layers:
            if self.checkpointing:
                call = FlatOutputs(layer) if self.fix else layer
                out = checkpoint(call, x, y, use_reentrant=self.reentrant)
                if self.fix:
                    call.watch_unused(out)
            else:
                out = layer(x, y)
            x, y = out
        return x.pow(2).sum()  # the last layout output is never used


def test_an_unused_output_gives_zeros_upstream_and_no_gradient_with_flat_outputs(grads_of):
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    model = TwoStreamModel().train()
    reference = grads_of(model, x, False)
    assert reference["layers.1.layout.weight"] is None  # feeds only the discarded output

    upstream = compare_grads(reference, grads_of(model, x, True))
    assert not upstream.ok and set(upstream.unexpected) == {"layers.1.layout.weight", "layers.1.layout.bias"}
    assert float(model.layers[1].layout.weight.grad.abs().sum()) == 0.0  # zeros, where the reference has none

    model.fix = True
    for _ in range(2):  # every backward decides afresh
        fixed = compare_grads(reference, grads_of(model, x, True))
        assert fixed.ok and fixed.total == 12, fixed.summary()
        assert model.layers[1].layout.weight.grad is None

    model.reentrant = False  # non-reentrant needs nothing and FlatOutputs is not in its path
    assert compare_grads(reference, grads_of(model, x, True)).ok


def test_each_backward_decides_afresh_which_outputs_were_used():
    torch.manual_seed(0)
    layer = TwoStreams()
    x = torch.randn(2, 4, requires_grad=True)
    flat = FlatOutputs(layer)
    text, layout = out = checkpoint(flat, x, x * 2, use_reentrant=True)
    flat.watch_unused(out)
    for use_layout in (False, True, False):
        layer.zero_grad(set_to_none=True)
        (text.sum() + (layout.sum() if use_layout else 0)).backward(retain_graph=True)
        assert (layer.layout.weight.grad is not None) == use_layout


class WithWeights(torch.nn.Module):
    """Returns (hidden, attention weights) like a layer with output_attentions=True: the weights' producers
    (query and key) also produce the hidden states."""

    def __init__(self):
        super().__init__()
        self.query, self.key = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        weights = torch.softmax(self.query(x) @ self.key(x).transpose(-1, -2), dim=-1)
        return x + weights @ x, weights


def _notices_after_backward(layer, *inputs, use=lambda out: out[0].sum()):
    """How often FlatOutputs' notice fires in one reentrant backward of ``layer`` whose second output is unused."""
    notices = []
    flat = FlatOutputs(layer, notice=lambda: notices.append(1))
    out = checkpoint(flat, *inputs, use_reentrant=True)
    flat.watch_unused(out)
    use(out).backward()
    return len(notices)


def test_the_unused_output_notice_only_where_a_parameter_would_have_had_zeros():
    """LiLT-style (the layout weights feed only the discarded output): upstream zeros, now none: said.  Attention
    weights returned beside the hidden states: their producers get a gradient through the hidden states either
    way, upstream is equal: nothing said (issue 31 item 5)."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, requires_grad=True)
    assert _notices_after_backward(TwoStreams(), x, x * 2) == 1
    assert _notices_after_backward(WithWeights(), x.unsqueeze(0)) == 0
    # a parameter of the discarded output that gets a gradient from elsewhere in the same backward: equal upstream
    shared = TwoStreams()
    elsewhere = lambda out: out[0].sum() + sum(p.sum() for p in shared.layout.parameters())  # noqa: E731
    assert _notices_after_backward(shared, x, x * 2, use=elsewhere) == 0


def test_a_nested_output_comes_back_whole_from_a_checkpoint_that_unwraps_a_tuple_of_one():
    """The lifting wrapper leaves a lone tensor as the checkpoint returned it, except where the layer's output was
    nested: DeepSpeed's checkpoint returns the flat tuple of one bare (deepspeed-checkpoint-layer-io opted out), and
    the layer's own structure must still come back around it, connected."""
    import functools

    import wrapt

    from hotfix.patches.transformers_checkpoint_layer_io import checkpoint_with_lifted_inputs, patch

    def unwrapping_checkpoint(function, *args, use_reentrant=True):
        out = checkpoint(function, *args, use_reentrant=use_reentrant)
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out

    torch.manual_seed(0)
    layer = Nested("dict")  # {"hidden": h}: one tensor, nested
    x = torch.randn(2, 4, requires_grad=True)
    wrapped = wrapt.FunctionWrapper(functools.partial(unwrapping_checkpoint, use_reentrant=True),
                                    checkpoint_with_lifted_inputs(patch))
    result = wrapped(layer, x)
    assert isinstance(result, dict) and result["hidden"].grad_fn is not None
    result["hidden"].sum().backward()
    reference = Nested("dict")
    reference.load_state_dict(layer.state_dict())
    x2 = x.detach().clone().requires_grad_(True)
    reference(x2)["hidden"].sum().backward()
    assert torch.allclose(layer.lin.weight.grad, reference.lin.weight.grad) and torch.allclose(x.grad, x2.grad)
