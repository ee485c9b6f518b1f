"""What runs for one checkpointed call of a layer, outermost first: for a developer (issue 52, part 1).

    from hotfix.checkpointing.explain import what_runs
    print("\\n".join(what_runs(model.model.layers[0])))

The layer's read of the checkpoint function transformers stored on it (the slots on its class's MRO, in
``relations.SLOT_ORDER``, and whether each acts on that function), the function itself, and where torch's or
unsloth-zoo's checkpoint then goes (the junction there and its hooks, in ``relations.JOIN_ORDER``).  Read-only:
it composes nothing and calls nothing.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, List

from hotfix.checkpointing.slot import ATTRIBUTE, reentrant_slots_bypassed, slots_on
from hotfix.checkpointing.torch_checkpoint import FUNCTION_CLASS, GENERATOR, MODULE as TORCH_CHECKPOINT
from hotfix.checkpointing.unsloth import CLASS_NAME as UNSLOTH_CLASS, MODULE as UNSLOTH_MODULE
from hotfix.junction import hooks_on


def _name(function: Any) -> str:
    inner = function.func if isinstance(function, functools.partial) else function
    name = "%s.%s" % (getattr(inner, "__module__", "?"), getattr(inner, "__qualname__", type(inner).__name__))
    if isinstance(function, functools.partial):
        keywords = ", ".join("%s=%r" % item for item in function.keywords.items())
        return "partial(%s%s)" % (name, ", " + keywords if keywords else "")
    return name


def _junction(owner: Any, attribute: str, label: str) -> List[str]:
    hooks = hooks_on(getattr(owner, "__dict__", {}).get(attribute))
    if not hooks:
        return ["  %s: as upstream has it (no fix joined there)" % label]
    return ["  %s, one wrapper running, outermost first:" % label] + ["    %d. %s" % (i, name)
                                                                        for i, name in enumerate(hooks, 1)]


def what_runs(layer: Any) -> List[str]:
    """Lines saying what runs for one checkpointed call of ``layer``, outermost first."""
    cls = type(layer)
    raw = layer.__dict__.get(ATTRIBUTE)
    lines = ["%s.%s (checkpoint function stored: %s)" % (cls.__module__, cls.__qualname__,
                                                           _name(raw) if raw is not None else "none")]
    slots = slots_on(cls)
    if not slots:
        lines.append("  no hotfix slot on its class: the stored function runs as transformers stored it")
    else:
        lines.append("  reading it, hotfix's slots, outermost first:")
        acting = [slot for slot in slots if raw is not None and slot.acts_on(raw)]
        bypassed = reentrant_slots_bypassed(raw, acting)
        for slot in reversed(slots):  # slots_on: innermost first
            said = ": steps aside here" if slot not in acting else (
                ": out of the call (non-reentrant: only a call passing use_reentrant=True goes through it)"
                if bypassed else "")
            lines.append("    %s (%s, on %s)%s" % (slot.fix or "?", getattr(slot.wrapper, "__name__", "?"),
                                                    slot.owner.__qualname__, said))
    inner = raw.func if isinstance(raw, functools.partial) else raw
    module = getattr(inner, "__module__", "")
    if module == TORCH_CHECKPOINT and TORCH_CHECKPOINT in sys.modules:
        checkpoint = sys.modules[TORCH_CHECKPOINT]
        reentrant = isinstance(raw, functools.partial) and raw.keywords.get("use_reentrant")
        if reentrant is not False:
            lines += _junction(checkpoint.__dict__.get(FUNCTION_CLASS), "apply",
                               "then torch's %s.apply (reentrant)" % FUNCTION_CLASS)
        if reentrant is not True:
            lines += _junction(checkpoint, GENERATOR, "then torch's %s (non-reentrant)" % GENERATOR)
    elif module.startswith("unsloth") and UNSLOTH_MODULE in sys.modules:
        lines += _junction(getattr(sys.modules[UNSLOTH_MODULE], UNSLOTH_CLASS, None), "apply",
                           "then unsloth-zoo's %s.apply" % UNSLOTH_CLASS)
    return lines
