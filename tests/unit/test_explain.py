"""hotfix.checkpointing.explain: what runs for one checkpointed call of a layer, as a developer reads it (issue 52
part 1): the slots in relations.SLOT_ORDER, then the junction of torch's checkpoint in relations.JOIN_ORDER."""

from __future__ import annotations

import re

import torch.utils.checkpoint

from hotfix import relations
from hotfix.checkpointing.explain import what_runs
from hotfix.checkpointing.slot import slots_on
from hotfix.junction import hooks_on


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config).train()


def _named(lines, start):
    """The fix names listed after the line starting with ``start`` (indented deeper), in order."""
    index = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    depth = len(lines[index]) - len(lines[index].lstrip())
    names = []
    for line in lines[index + 1:]:
        if len(line) - len(line.lstrip()) <= depth:
            break
        names.append(re.match(r"\s*(?:\d+\. )?([a-z0-9-]+)", line).group(1))
    return names


def test_a_layer_shows_its_slots_then_the_hooks_of_the_checkpoint_it_reaches():
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    lines = what_runs(model.model.layers[0])
    assert "use_reentrant=True" in lines[0], lines
    # what stands in this process (another test in it may have reverted a fix): listed as it stands, in order
    standing = [slot.fix for slot in reversed(slots_on(type(model.model.layers[0])))]
    assert standing and _named(lines, "reading it") == standing, lines
    assert standing == [name for name in relations.SLOT_ORDER if name in standing], lines
    joined = list(hooks_on(torch.utils.checkpoint.CheckpointFunction.__dict__.get("apply")))
    if joined:
        assert _named(lines, "then torch's CheckpointFunction.apply") == joined, lines
        assert joined == [name for name in relations.JOIN_ORDER if name in joined], lines
    else:
        assert any("CheckpointFunction.apply (reentrant): as upstream has it" in line for line in lines), lines
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert any("_checkpoint_without_reentrant_generator" in line for line in what_runs(model.model.layers[0]))
    assert "no hotfix slot" in what_runs(model.model.norm)[1]
