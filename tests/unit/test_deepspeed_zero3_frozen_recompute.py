"""patches/deepspeed_zero3_frozen_recompute.py in-process, with a stand-in for what ZeRO-3 does to a parameter.

ZeRO-3 marks its parameters (``ds_id``), gathers a module's parameters into ``param.data`` before the module runs
(forward, and backward: its backward pre-hook) and partitions them after it (``param.data`` an empty tensor).  The
stand-in does the same with module hooks, without DeepSpeed: a layer whose frozen weight (a norm's scale) is
gathered and partitioned around each call, a trainable Linear after it.  Non-reentrant checkpointing of that layer fails
upstream with torch's "Recomputed values ... different metadata" (the frozen weight, saved as itself by the
recomputation, is partitioned when torch checks it), and with the fix's wrappers every gradient equals the same
model without checkpointing.  The 2-rank runs with DeepSpeed itself: tests/e2e/test_deepspeed.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from hotfix.diagnostics.compare import collect_grads, compare_grads
from hotfix.patches.deepspeed_zero3_frozen_recompute import ALIASED, RECOMPUTATION_HOOK, patch

METADATA = "Recomputed values for the following tensors have different metadata"


class PartitionedScale(nn.Module):
    """A frozen weight used as itself (a norm's scale: ``x * weight`` saves the parameter, where a Linear saves a
    view of it), gathered around each call and partitioned after it, as ZeRO-3 does."""

    def __init__(self, width: int, ds_id: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width), requires_grad=False)
        self.weight.ds_id, self.weight.ds_numel = ds_id, width
        self.full = self.weight.detach().clone()  # the partitions, gathered: a fresh storage each time
        self.partition()
        self.register_forward_pre_hook(lambda module, args: module.gather())
        self.register_forward_hook(lambda module, args, output: module.partition())
        self.register_full_backward_pre_hook(lambda module, grad_output: module.gather())

    def gather(self) -> None:
        self.weight.data = self.full.clone()

    def partition(self) -> None:
        self.weight.data = torch.empty(0)

    def forward(self, x):
        return x * self.weight


class Layer(nn.Module):
    def __init__(self, width: int, ds_id: int) -> None:
        super().__init__()
        self.norm = PartitionedScale(width, ds_id)
        self.adapter = nn.Linear(width, width, bias=False)  # trainable (LoRA's place)

    def forward(self, x):
        return x + torch.tanh(self.adapter(self.norm(x)))


class Model(nn.Module):
    def __init__(self, checkpointing: bool, determinism_check: str = "default") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(8, 8)
        self.layers = nn.ModuleList([Layer(8, 1), Layer(8, 2)])
        self.checkpointing = checkpointing
        self.determinism_check = determinism_check

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = (torch_checkpoint.checkpoint(layer, x, use_reentrant=False, determinism_check=self.determinism_check)
                 if self.checkpointing else layer(x))
        return x.square().mean()


def grads(checkpointing: bool, determinism_check: str = "default") -> dict:
    model = Model(checkpointing, determinism_check)
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).backward()
    return collect_grads(model)


@pytest.fixture
def fixed():
    hook = torch_checkpoint.__dict__[RECOMPUTATION_HOOK]
    before = dict(vars(hook))
    patch._apply(torch_checkpoint)  # the gate wants DeepSpeed installed; the wrappers are what is tested here
    try:
        yield
    finally:
        patch.revert()
    assert dict(vars(hook)) == before  # is-identical: torch's own __init__ back, no __exit__ of ours left


def test_upstream_the_recomputation_finds_the_frozen_weight_partitioned():
    with pytest.raises(torch_checkpoint.CheckpointError, match=METADATA):
        grads(checkpointing=True)


def test_with_the_fix_every_gradient_equals_the_model_without_checkpointing(fixed, capsys):
    reference = grads(checkpointing=False)
    found = compare_grads(reference, grads(checkpointing=True))
    assert found.ok and not found.missing and len(found.equal) == 4, found.summary()
    assert "layers.0.norm.weight" not in reference  # frozen: no gradient either way
    said = capsys.readouterr().err
    assert "repaired" in said and patch.name in said, said


def test_no_repair_claimed_where_torch_checks_nothing(fixed, monkeypatch):
    """``determinism_check="none"``: torch compares no metadata, so upstream trains equal (measured here) and the
    repair line would be false; it used to be said.  With the default check it is said (the test above)."""
    reference = grads(checkpointing=False)
    upstream = compare_grads(reference, _unfixed_grads())
    assert upstream.ok and not upstream.missing, upstream.summary()
    claims = []
    monkeypatch.setattr(patch, "repaired", lambda *args, **kwargs: claims.append(args))
    found = compare_grads(reference, grads(checkpointing=True, determinism_check="none"))
    assert found.ok and not found.missing and claims == [], (found.summary(), claims)
    grads(checkpointing=True)
    assert len(claims) >= 1  # the default check: said


def _unfixed_grads() -> dict:
    patch.revert()
    try:
        return grads(checkpointing=True, determinism_check="none")
    finally:
        patch._apply(torch_checkpoint)


def test_only_zero3_parameters_become_aliases_and_the_list_goes_with_exit(fixed):
    """A frozen tensor without ``ds_id`` (a plain frozen weight, a buffer) passes unchanged; a frozen ZeRO-3
    parameter as an alias of its data.  The (parameter, alias) list goes with the hook's ``__exit__``: after it the
    aliases live only in the saved tensors of the backward that reads them."""
    hook = torch_checkpoint._recomputation_hook.__new__(torch_checkpoint._recomputation_hook)
    received = []
    torch.autograd.graph.saved_tensors_hooks.__init__(hook, received.append, lambda x: x)
    plain = nn.Parameter(torch.ones(3), requires_grad=False)
    # the pack the fix installs, around a stand-in for torch's own
    wrapper = patch.wrapper[0]
    wrapper(lambda *a, **k: None, hook, (), {})
    hook.pack_hook(plain)
    zero = nn.Parameter(torch.ones(3), requires_grad=False)
    zero.ds_id = 7
    hook.pack_hook(zero)
    assert received[0] is plain and received[1] is not zero and received[1].data_ptr() == zero.data_ptr()
    assert [p for p, _ in hook.__dict__[ALIASED][1]] == [zero]
    patch.wrapper[1](lambda *a, **k: None, hook, (None, None, None), {})
    assert ALIASED not in hook.__dict__
