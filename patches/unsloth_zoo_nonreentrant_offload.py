"""unsloth-zoo 2025.1.1 - 2026.3.2: a non-reentrant checkpoint call bypasses unsloth's offloading checkpoint.

What breaks: ``use_gradient_checkpointing="unsloth"`` puts ``UnslothCheckpointFunction`` where torch's
*reentrant* checkpoint looks for ``CheckpointFunction``; ``use_reentrant=False`` (transformers' default
from 5.0.0, TRL's kwargs) never gets there: no offload, plain checkpointing's memory, OOM.  2026.3.3
forces reentrant itself; 2025.6.3-2025.6.4 are out of reach (transformers kept torch's ``checkpoint``).

How this fixes it: the outermost checkpoint-function slot (``hotfix.relations.SLOT_ORDER``) makes a non-reentrant
call reentrant where unsloth's swap is in place at that moment (asked for), the stored function is
torch's ``checkpoint`` (or the release's ``unsloth_checkpoint``) with nothing only non-reentrant takes,
and the fixes a reentrant call needs are applied (layer I/O, frozen inputs; DDP's inside a searching
DDP forward: ``hotfix.relations.RELIANCES``): it reaches unsloth's function through them, the closure fix and hotfix's offloading
forward/backward.  Otherwise the call is left as made (a reason said once).
docs/fixes/unsloth-zoo-nonreentrant-offload.md.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

from hotfix import Mechanism
from hotfix.checkpointing.slot_fix import MODELING_UTILS, REACHED, CheckpointFunctionFix
from hotfix.checkpointing.unsloth import CLASS_NAME, MODULE, checkpoint_function_drift

#: unsloth-zoo's drop-in for torch.utils.checkpoint.checkpoint (honours use_reentrant before 2026.3.3)
UNSLOTH_CHECKPOINT = "unsloth_checkpoint"
#: what a reentrant torch checkpoint takes besides the function and its inputs
REENTRANT_KEYWORDS = frozenset({"use_reentrant", "preserve_rng_state"})
#: the offloading releases with the bypass, less 2025.6.3/2025.6.4 (no transformers call reaches their function)
BYPASSED = ">=2025.1.1,<2026.3.3,!=2025.6.3,!=2025.6.4"
NOT_REACHED = {"unsloth-zoo": ">=2025.6.3,<2025.6.5"}


def is_torch_checkpoint(function: Any) -> bool:
    """Is ``function`` torch's own ``torch.utils.checkpoint.checkpoint`` (whoever replaced the module attribute)?"""
    return getattr(function, "__module__", None) == "torch.utils.checkpoint" and \
        getattr(function, "__name__", None) == "checkpoint"


def unsloth_reached(function: Any) -> bool:
    """Does ``function(..., use_reentrant=True)`` reach the loaded release's ``UnslothCheckpointFunction`` now?

    Only while the release's swap is in place: the user asked for unsloth's offload (and did not undo it).
    """
    zoo = sys.modules.get(MODULE)
    cls = getattr(zoo, CLASS_NAME, None)
    if cls is None:
        return False
    import torch.utils.checkpoint as torch_checkpoint  # imported already: it is the call being made

    swapped = torch_checkpoint.CheckpointFunction is cls
    if is_torch_checkpoint(function):
        return swapped  # torch's reentrant branch calls the module's CheckpointFunction
    unsloth_checkpoint = getattr(zoo, UNSLOTH_CHECKPOINT, None)
    return function is unsloth_checkpoint and (swapped or torch_checkpoint.checkpoint is unsloth_checkpoint)


def checkpoint_routed_to_unsloth(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``.

    Built when the fix first applies (its target has imported torch by then): loading this module
    imports no torch.
    """
    from hotfix.checkpointing.inputs import is_reentrant
    from hotfix.checkpointing.ddp import searching_ddp

    def route_to_unsloth(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        # A reentrant call (4.x's default) is unsloth's own path.  Otherwise only transformers' shape,
        # partial(checkpoint, **gradient_checkpointing_kwargs) (wrapt's proxies answer for it), is routed.
        if (not args or is_reentrant(wrapped, kwargs) or not isinstance(wrapped, functools.partial)
                or not unsloth_reached(wrapped.func) or MODULE not in fix.applied_targets):
            return wrapped(*args, **kwargs)
        extra = (set(wrapped.keywords) | set(kwargs)) - REENTRANT_KEYWORDS
        if extra:
            fix.warn_once(("keywords", frozenset(extra)), f"unsloth's offloading checkpoint stays bypassed: the "
                          f"checkpoint call passes {', '.join(sorted(extra))}, which only non-reentrant "
                          f"checkpointing takes")
            return wrapped(*args, **kwargs)
        # the fixes that make a reentrant call give the gradients of the non-reentrant call it replaces (keyword,
        # nested, stored tensors; layers with no input needing grad), and under a searching DDP the DDP fix
        always = fix.missing()
        missing = fix.missing(under_ddp=True) if searching_ddp() is not None else always
        if missing:  # routed, the call would crash or lose gradients: better unsloth's offload stays bypassed
            where = " under DistributedDataParallel(find_unused_parameters=True)" if missing != always else ""
            fix.warn_once(("missing", tuple(missing)), f"unsloth's offloading checkpoint stays bypassed{where}: "
                          f"reentrant checkpointing needs {', '.join(missing)} here, not applied")
            return wrapped(*args, **kwargs)
        fix.repaired("use_reentrant=False bypassed the offloading checkpoint use_gradient_checkpointing=\"unsloth\" "
                     "installed; the call runs there, reentrant")
        return wrapped(*args, **dict(kwargs, use_reentrant=True))

    return route_to_unsloth


def torch_checkpoint_drift() -> Optional[str]:
    """Why torch's reentrant checkpoint no longer reaches ``torch.utils.checkpoint.CheckpointFunction``, or None."""
    import torch.utils.checkpoint as torch_checkpoint

    original = next((f for f in (torch_checkpoint.checkpoint, getattr(torch_checkpoint, "_old_checkpoint", None))
                     if is_torch_checkpoint(f)), None)
    if original is None:
        return "torch.utils.checkpoint.checkpoint is not torch's own and no _old_checkpoint holds it"
    code = getattr(getattr(original, "__wrapped__", original), "__code__", None)
    if code is None or "CheckpointFunction" not in code.co_names:
        return "torch's checkpoint no longer calls the module's CheckpointFunction for use_reentrant=True"
    return None


class UnslothZooNonreentrantOffload(CheckpointFunctionFix):
    name = "unsloth-zoo-nonreentrant-offload"
    # modeling_utils: the classes models store a checkpoint function on; the release: the class routed to
    # (its drift check; a call is routed only where this fix applied to the loaded release)
    targets = (MODELING_UTILS, MODULE)
    # Ranges equal to the census's evidence (docs/census/zoo-nonreentrant.md,
    # tests/versions/test_unsloth_zoo_nonreentrant_offload.py).  The transformers bound: the hook
    # (_set_gradient_checkpointing(enable, gradient_checkpointing_func), 4.35.0); 5.0.0 made
    # use_reentrant=False the default.
    mechanisms = (
        Mechanism("non-reentrant-default", {"unsloth-zoo": BYPASSED, "transformers": ">=5.0.0"}, fixed_in="2026.3.3",
                  unreached=NOT_REACHED,
                  summary="gradient_checkpointing_enable() checkpoints non-reentrantly by default (transformers "
                          "5.x): unsloth's offloading checkpoint never runs"),
        Mechanism("non-reentrant-requested", {"unsloth-zoo": BYPASSED, **REACHED},
                  fixed_in="2026.3.3", unreached=NOT_REACHED,
                  summary="gradient_checkpointing_kwargs={\"use_reentrant\": False} (TRL): unsloth's offloading "
                          "checkpoint never runs"),
    )
    symptom = (
        "use_gradient_checkpointing=\"unsloth\" with transformers >= 5.0 or TRL's use_reentrant=False: no "
        "'Unsloth: Will smartly offload gradients' line, VRAM as without offload, CUDA out of memory"
    )
    upstream = ("unslothai/unsloth-zoo 2026.3.3 (unsloth_checkpoint forces use_reentrant=True); "
                "reported as unsloth-zoo#549, unsloth#3969, unsloth#4321, OpenPipe/ART#604")

    def build_wrapper(self) -> Callable:
        return checkpoint_routed_to_unsloth(self)

    def drift(self, module: Any) -> Optional[str]:
        if module.__name__ == MODULE:
            return checkpoint_function_drift(module)  # nothing to change there: the slots find the class per call
        return super().drift(module) or torch_checkpoint_drift()


patch = UnslothZooNonreentrantOffload()
