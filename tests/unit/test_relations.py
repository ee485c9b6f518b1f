"""What the fixes need of each other (hotfix.relations): one table, bound once, and every pair's behaviour.

Each reliance of ``hotfix.relations.RELIANCES`` is exercised here with the fix relied on applied and not
applied (opted out, skipped or drifted all leave it unapplied): where it is not, the relying fix leaves the
call as upstream makes it or takes the path that works without it, never a crash upstream does not have.
The real releases: tests/versions/test_axolotl_offload_checkpoint.py (axolotl's wrapper with the fix opted
out, and imported first in a process), test_unsloth_zoo_nonreentrant_offload.py, test_unsloth_zoo_fixes.py.
docs/design.md's tables are this data.
"""

from __future__ import annotations

import functools
import re
import sys
import types

import pytest
import torch

from conftest import REPO
from hotfix import relations
from hotfix.checkpointing import unsloth
from hotfix.patches import (axolotl_offload_checkpoint, torch_ddp_find_unused, transformers_checkpoint_layer_io,
                            transformers_ddp_find_unused,
                            transformers_frozen_inputs, unsloth_zoo_closure_tensors, unsloth_zoo_nonreentrant_offload,
                            unsloth_zoo_offload_backward)

SLOT_FIXES = (transformers_checkpoint_layer_io.TransformersCheckpointLayerIO,
              transformers_frozen_inputs.TransformersFrozenInputs,
              transformers_ddp_find_unused.TransformersDdpFindUnused)


def _design_rows(heading: str):
    """The rows of the table under ``heading`` in docs/design.md, each a list of its cells' backticked names."""
    text = (REPO / "docs" / "design.md").read_text()
    section = re.split(r"\n#{2,3} ", text.split(heading + "\n", 1)[1], maxsplit=1)[0]
    return [re.findall(r"`([^`]+)`", line) for line in section.splitlines() if line.startswith("| ") and "`" in line]


def test_the_design_page_lists_the_slot_order_and_the_reliances_of_the_data():
    assert [row[0] for row in _design_rows("### Slot order")] == list(relations.SLOT_ORDER)
    assert [row[0] for row in _design_rows("### Join order")] == list(relations.JOIN_ORDER)
    assert [tuple(row[:2]) for row in _design_rows("### Reliances")] == [(r.fix, r.on) for r in relations.RELIANCES]


def test_every_fix_the_tables_name_is_a_built_in_fix():
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as handle:
        fixes = set(tomllib.load(handle)["project"]["entry-points"]["hotfix.patches"])
    named = (set(relations.SLOT_ORDER) | set(relations.JOIN_ORDER) | {r.fix for r in relations.RELIANCES}
             | {r.on for r in relations.RELIANCES})
    assert named <= fixes, named - fixes
    assert [relations.slot_rank(name) for name in relations.SLOT_ORDER] == sorted(
        (relations.slot_rank(name) for name in relations.SLOT_ORDER), reverse=True)


def test_the_registry_binds_each_fix_to_the_fix_objects_it_relies_on():
    """Bound at activation: ``relied_on`` hands the registry's own fix objects, nothing looked up per call."""
    from hotfix.registry import registry

    patches = registry.patches()
    relations.bind(patches)
    layer_io = patches["transformers-checkpoint-layer-io"]
    assert layer_io.relied_on(relations.FORK_CHECKPOINT) == (patches["axolotl-offload-checkpoint"],)
    assert layer_io.relied_on(relations.UNSLOTH_FUNCTION) == (patches["unsloth-zoo-offload-backward"],)
    routing = patches["unsloth-zoo-nonreentrant-offload"]
    assert routing.relied_on(relations.ALWAYS) == (patches["transformers-checkpoint-layer-io"],
                                                   patches["transformers-frozen-inputs"])


# --------------------------------------------------------------------------- slot fixes -> axolotl's fix
def _axolotl_module():
    module = types.ModuleType(axolotl_offload_checkpoint.AxolotlOffloadCheckpoint.targets[0])

    def hf_grad_checkpoint_offload_wrapper(decoder_layer, *args, use_reentrant=None):
        return decoder_layer.func.__self__  # axolotl 0.19's first read: a partial transformers made, nothing else

    hf_grad_checkpoint_offload_wrapper.__module__ = module.__name__
    module.hf_grad_checkpoint_offload_wrapper = hf_grad_checkpoint_offload_wrapper
    return module


@pytest.mark.parametrize("slot_fix", SLOT_FIXES, ids=lambda cls: cls.name)
def test_a_slot_fix_steps_aside_for_axolotls_wrapper_unless_axolotls_fix_replaced_it(slot_fix):
    """transformers' layers through axolotl's own wrapper (axolotl-offload-checkpoint opted out, skipped, drifted):
    the slot fix leaves the call as transformers makes it (its rewrite of the call is no partial, and
    axolotl's wrapper reads ``.func``: "'FlatOutputs' object has no attribute 'func'").  Through the wrapper
    the fix put in its place, and through any other function, it acts."""
    module, fork = _axolotl_module(), axolotl_offload_checkpoint.AxolotlOffloadCheckpoint()
    fix = slot_fix()
    original = functools.partial(module.hf_grad_checkpoint_offload_wrapper, use_reentrant=True)
    relations.bind({fix.name: fix, fork.name: fork})
    assert not fix.serves(original)  # loaded, not applied
    replacement = functools.wraps(module.hf_grad_checkpoint_offload_wrapper)(lambda *a, **k: None)
    fork.replace(module, "hf_grad_checkpoint_offload_wrapper", replacement)
    assert fix.serves(functools.partial(replacement, use_reentrant=True))
    assert not fix.serves(original)  # the original itself, held from before: still axolotl's own
    assert fix.serves(functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True))
    fork.revert()
    assert not fix.serves(functools.partial(replacement, use_reentrant=True))


def test_the_slot_chain_leaves_out_the_fixes_that_step_aside():
    """The slot on a module's class hands the stored function wrapped only by the fixes that serve it."""
    from hotfix.checkpointing.slot import ATTRIBUTE, CheckpointFunctionSlot

    class Layer(torch.nn.Module):
        pass

    seen = []
    outer = CheckpointFunctionSlot(Layer, lambda w, i, a, k: seen.append("outer") or w(*a, **k), lambda: False, 2,
                                   serves=lambda raw: raw is not aside)
    setattr(Layer, ATTRIBUTE, outer)
    inner = CheckpointFunctionSlot(Layer, lambda w, i, a, k: seen.append("inner") or w(*a, **k), lambda: False, 1,
                                   displaced=outer)
    setattr(Layer, ATTRIBUTE, inner)
    layer, aside, served = Layer(), (lambda: "aside"), (lambda: "served")
    layer.__dict__[ATTRIBUTE] = aside
    assert getattr(layer, ATTRIBUTE)() == "aside" and seen == ["inner"]
    seen.clear()
    layer.__dict__[ATTRIBUTE] = served
    assert getattr(layer, ATTRIBUTE)() == "served" and seen == ["outer", "inner"]


def test_a_third_party_fix_on_the_checkpoint_function_takes_the_innermost_place():
    """Issue 52 part 1: relations.slot_rank raised for a name SLOT_ORDER does not hold, so a plugin subclassing
    CheckpointFunctionFix failed at apply; now it ranks innermost, its slot nearest the function as stored."""
    from hotfix.checkpointing.slot import ATTRIBUTE, SlotCoverage, slots_on
    from hotfix.checkpointing.slot_fix import CheckpointFunctionFix

    def tag(label):
        return lambda wrapped, instance, args, kwargs: (label, wrapped(*args, **kwargs))

    class ThirdParty(CheckpointFunctionFix):
        name = "acme-checkpoint-fix"

        def build_wrapper(self):
            return tag("acme")

    class Layer(torch.nn.Module):
        pass

    plugin, built_in = ThirdParty(), transformers_frozen_inputs.TransformersFrozenInputs()
    model = Layer()
    model.__dict__[ATTRIBUTE] = lambda: "stored"
    assert relations.slot_rank(plugin.name) == 0 < relations.slot_rank(built_in.name)
    try:
        plugin.coverage.cover(model)
        SlotCoverage(built_in, tag("frozen"), relations.slot_rank(built_in.name)).cover(model)
        assert [slot.fix for slot in slots_on(Layer)] == [plugin.name, built_in.name]  # innermost first
        assert getattr(model, ATTRIBUTE)() == ("frozen", ("acme", "stored"))
    finally:
        built_in.revert()
        plugin.revert()
    assert ATTRIBUTE not in Layer.__dict__


# --------------------------------------------------------------------------- -> unsloth-zoo-offload-backward
RELYING_ON_THE_BACKWARD = (*SLOT_FIXES, unsloth_zoo_closure_tensors.UnslothZooClosureTensors,
                           torch_ddp_find_unused.TorchDdpFindUnused)


@pytest.mark.parametrize("relying", RELYING_ON_THE_BACKWARD, ids=lambda cls: cls.name)
def test_an_added_input_goes_behind_an_anchor_unless_the_offload_fix_put_its_backward_in_place(relying, monkeypatch):
    """An affected release's own backward (unsloth-zoo-offload-backward not applied) returns one gradient behind a
    frozen first input: what a fix adds goes behind a 0-byte anchor.  The fix's backward in place: no anchor.  The
    rule is a fact of the backward in place, not of a call: decided once per backward object, however often asked."""
    release = types.ModuleType(unsloth.MODULE)

    class UnslothCheckpointFunction(torch.autograd.Function):
        @staticmethod
        def backward(ctx, *grads):
            return None

    release.UnslothCheckpointFunction = UnslothCheckpointFunction
    monkeypatch.setitem(sys.modules, unsloth.MODULE, release)
    decided = []
    monkeypatch.setattr(unsloth, "check_range",  # an affected release
                        lambda ranges: decided.append(ranges) or types.SimpleNamespace(applies=True))
    fix, offload = relying(), unsloth_zoo_offload_backward.UnslothZooOffloadBackward()
    relations.bind({fix.name: fix, offload.name: offload})
    rule = unsloth.FirstInputRule(fix)
    assert all(rule.needs_grad_first() for _ in range(3))  # the release's own backward
    offload.replace(UnslothCheckpointFunction, "backward", staticmethod(lambda ctx, *grads: grads))
    assert not any(rule.needs_grad_first() for _ in range(3))  # the offload fix's, which returns every gradient
    offload.revert()
    assert rule.needs_grad_first() and rule.needs_grad_first()
    # the release's range read once per time its own backward stands (the fix's is decided without it), not per ask
    assert len(decided) == 2


# --------------------------------------------------------------------------- routing -> the reentrant repairs
@pytest.mark.parametrize("absent", ["transformers-checkpoint-layer-io", "transformers-frozen-inputs",
                                    "transformers-ddp-find-unused"])
def test_the_routing_names_each_repair_it_relies_on_that_is_not_applied(absent):
    """unsloth-zoo-nonreentrant-offload routes a call to unsloth's reentrant checkpoint only where the fixes a
    reentrant call needs are applied (DDP's: under a searching DDP forward); the call then stays non-reentrant
    (tests/unit/test_nonreentrant_offload_routing.py shows the gradients)."""
    fix = unsloth_zoo_nonreentrant_offload.UnslothZooNonreentrantOffload()
    others = {r.on: types.SimpleNamespace(name=r.on, applied=r.on != absent)
              for r in relations.RELIANCES if r.fix == fix.name}
    fix.bind_reliances(relations.reliances_of(fix.name, others))
    under_ddp = absent == "transformers-ddp-find-unused"
    assert fix.missing(under_ddp=True) == [absent]
    assert fix.missing() == ([] if under_ddp else [absent])
