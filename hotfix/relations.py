"""What the built-in fixes need of each other: data in one place, bound once at activation.

No fix looks another up.  When hotfix activates, the registry binds each fix to the fixes it relies on
(:func:`bind`, from :data:`RELIANCES`); a fix then asks its own ``relied_on(where)`` whether they are
applied.  Where a fix it relies on is not applied (opted out, skipped, drifted, not loaded), it leaves
the call as upstream makes it, or takes the one path that works without it (``Reliance.without``):
opting a fix out gives upstream's behaviour for what that fix covers, never a crash upstream does not
have.  :data:`SLOT_ORDER` is how the fixes that wrap transformers' checkpoint function compose
(``hotfix.checkpointing.slot``), :data:`JOIN_ORDER` how those that wrap one attribute of torch, unsloth-zoo or
DeepSpeed together do (``hotfix.junction``).  docs/design.md's tables are tested against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple

from hotfix.config import normalize_patch_name

#: The fixes that wrap the checkpoint function transformers stores on a module, outermost first: each sees
#: the call as the ones before it pass it on.
SLOT_ORDER: Tuple[str, ...] = (
    "unsloth-zoo-nonreentrant-offload",  # makes a non-reentrant call reentrant: the others then see a reentrant call
    "transformers-checkpoint-layer-io",  # sees the partial as transformers made it; lifts what it hides
    "transformers-frozen-inputs",  # anchors a layer no input of which needs grad (lifted inputs count)
    "transformers-ddp-find-unused",  # adds the layer's trainable parameters as the last inputs
    "deepspeed-checkpoint-layer-io",  # innermost: sees the function handed to DeepSpeed's checkpoint, as handed
)

#: The fixes that wrap one attribute together (``hotfix.junction``: torch's ``CheckpointFunction.apply`` and its
#: non-reentrant generator, unsloth-zoo's ``UnslothCheckpointFunction.apply``, DeepSpeed's ``CheckpointFunction.apply``),
#: outermost first: each hands the next the call as it changed it.  A fix not named here joins innermost.
JOIN_ORDER: Tuple[str, ...] = (
    "torch-compile-recompute-graph",  # outermost: settles Dynamo's graph order before anything in the call compiles
    "unsloth-zoo-closure-tensors",  # lifts the tensors unsloth's partial hides: the others see them as inputs
    "torch-ddp-find-unused",  # adds the trainable parameters the function uses as its last inputs
    "torch-checkpoint-rng-state",  # asks torch to stash the generators; probes the function's first call
    "moe-routing-replay",  # innermost: the function the checkpoint runs (and runs again) becomes a region's call
)

# Where one fix relies on another (``Reliance.where``; the keys a fix passes to ``relied_on``).
ALWAYS = "every call it changes"
UNDER_DDP = "a call inside a DDP forward that searches for unused parameters"
FORK_CHECKPOINT = "a call through a checkpoint function of the other fix's targets"
UNSLOTH_FUNCTION = "a call that may reach unsloth-zoo's UnslothCheckpointFunction"
ROUTED = "a call it hands from torch's checkpoint_wrapper to transformers' own checkpointing of the layer"


@dataclass(frozen=True)
class Reliance:
    """``fix`` relies on ``on`` at ``where``; without it there, ``fix`` does ``without``."""

    fix: str
    on: str
    where: str
    without: str


_ROUTED = "leaves the call non-reentrant (unsloth's offload stays bypassed, one warning)"
_UPSTREAM = "leaves the call as upstream makes it (axolotl's wrapper reads the partial transformers made)"
_WRAPPER = "leaves the wrapper's call as upstream makes it (the Cache written again by the recomputation)"
_ROUTED_BARE = "hands the call on without that repair, as transformers' own checkpointing has it without the fix"
_ANCHOR = "puts what it adds behind a 0-byte anchor that needs grad (the release's backward needs a first input that does)"

RELIANCES: Tuple[Reliance, ...] = (
    Reliance("unsloth-zoo-nonreentrant-offload", "transformers-checkpoint-layer-io", ALWAYS, _ROUTED),
    Reliance("unsloth-zoo-nonreentrant-offload", "transformers-frozen-inputs", ALWAYS, _ROUTED),
    Reliance("unsloth-zoo-nonreentrant-offload", "transformers-ddp-find-unused", UNDER_DDP, _ROUTED),
    Reliance("transformers-checkpoint-layer-io", "axolotl-offload-checkpoint", FORK_CHECKPOINT, _UPSTREAM),
    Reliance("transformers-frozen-inputs", "axolotl-offload-checkpoint", FORK_CHECKPOINT, _UPSTREAM),
    Reliance("transformers-ddp-find-unused", "axolotl-offload-checkpoint", FORK_CHECKPOINT, _UPSTREAM),
    Reliance("transformers-checkpoint-layer-io", "unsloth-zoo-offload-backward", UNSLOTH_FUNCTION, _ANCHOR),
    Reliance("transformers-frozen-inputs", "unsloth-zoo-offload-backward", UNSLOTH_FUNCTION, _ANCHOR),
    Reliance("transformers-ddp-find-unused", "unsloth-zoo-offload-backward", UNSLOTH_FUNCTION, _ANCHOR),
    Reliance("unsloth-zoo-closure-tensors", "unsloth-zoo-offload-backward", UNSLOTH_FUNCTION, _ANCHOR),
    Reliance("torch-ddp-find-unused", "unsloth-zoo-offload-backward", UNSLOTH_FUNCTION, _ANCHOR),
    Reliance("torch-checkpoint-wrapper", "transformers-checkpoint-layer-io", ALWAYS, _WRAPPER),
    Reliance("torch-checkpoint-wrapper", "transformers-frozen-inputs", ROUTED, _ROUTED_BARE),
    Reliance("torch-checkpoint-wrapper", "transformers-ddp-find-unused", ROUTED, _ROUTED_BARE),
)


def slot_rank(name: str) -> int:
    """The rank of a fix's checkpoint-function slot: outermost highest (``SLOT_ORDER``).  A fix it does not name (a
    third-party fix on the checkpoint function) ranks 0: innermost, nearest the function as transformers stored it
    (two such fixes: by name, ``slot.slots_on``)."""
    return len(SLOT_ORDER) - SLOT_ORDER.index(name) if name in SLOT_ORDER else 0


def join_rank(name: str) -> Tuple[int, str]:
    """Where a fix's hook runs in a junction: ``JOIN_ORDER``'s place, outermost lowest; a fix it does not name (a
    third-party fix) after every named one, by name."""
    return (JOIN_ORDER.index(name), "") if name in JOIN_ORDER else (len(JOIN_ORDER), name)


class NotLoaded:
    """Stands for a fix relied on that is not loaded here: never applied."""

    applied = False
    targets: Tuple[str, ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name

    def installed(self, value: Any) -> bool:
        return False


def reliances_of(fix: str, patches: Mapping[str, Any]) -> Dict[str, Tuple[Any, ...]]:
    """``where -> the fixes`` ``fix`` relies on there, taken from ``patches`` (by name; absent: :class:`NotLoaded`)."""
    by_name = {normalize_patch_name(patch.name): patch for patch in patches.values()}
    found: Dict[str, Tuple[Any, ...]] = {}
    for reliance in RELIANCES:
        if reliance.fix == fix:
            found[reliance.where] = found.get(reliance.where, ()) + (
                by_name.get(normalize_patch_name(reliance.on)) or NotLoaded(reliance.on),)
    return found


def unbound(fix: str) -> Dict[str, Tuple[Any, ...]]:
    """What a fix no registry bound relies on: every fix it names, not loaded."""
    return reliances_of(fix, {})


def bind(patches: Mapping[str, Any]) -> None:
    """Bind every fix of ``patches`` to the fixes it relies on (the registry, at activation)."""
    for patch in patches.values():
        patch.bind_reliances(reliances_of(patch.name, patches))
