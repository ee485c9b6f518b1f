"""What the fixes rely on in unsloth-zoo's ``UnslothCheckpointFunction``.

Both unsloth-zoo fixes check its shape here (:func:`checkpoint_function_drift`), and every fix that
adds a checkpoint input asks :class:`FirstInputRule` where to put it.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any, Optional, Tuple

from hotfix.gate import check_range
from hotfix.relations import UNSLOTH_FUNCTION

MODULE = "unsloth_zoo.gradient_checkpointing"
CLASS_NAME = "UnslothCheckpointFunction"

#: The releases whose ``UnslothCheckpointFunction.backward`` returns one gradient (``return None``) whenever
#: its first input needs none, however many inputs the call has: it decides from ``args[0]`` alone whether
#: the node needs a backward (census, docs/versions.md: frozen-first-input; 2026.8.11 decides from every input).
#: unsloth-zoo-offload-backward's mechanism of that name is this range.
FIRST_INPUT_ONLY = {"unsloth-zoo": ">=2025.1.1,<2026.8.11"}


class FirstInputRule:
    """Must a checkpoint input that ``fix`` adds come after a first input that needs grad?

    Where an affected release's own backward is in place (unsloth-zoo-offload-backward opted out, or not
    applied), a call whose first input needs no grad but a later one does gets one gradient back
    for all of its inputs: "UnslothCheckpointFunctionBackward returned an incorrect number of
    gradients".  A fix that adds an input needing grad behind a frozen first input (the frozen-inputs
    anchor, lifted closure tensors) then puts a 0-byte anchor first instead
    (``checkpointing.inputs.anchored(first=True)``): the node's backward returns every gradient.  Wherever
    such a release is loaded, whichever checkpoint function the call goes through (the anchor first is
    harmless to any other).  Whether the backward in place is one that returns every gradient is asked of
    the fixes ``fix`` relies on for it (``hotfix.relations.UNSLOTH_FUNCTION``: did one of them put it
    there).  The answer is kept per ``backward`` object: decided once, re-decided when a fix replaces or
    restores it.
    """

    def __init__(self, fix: Any) -> None:
        self._fix = fix
        self._known: Tuple[Any, bool] = (None, False)

    def needs_grad_first(self) -> bool:
        cls = getattr(sys.modules.get(MODULE), CLASS_NAME, None)
        if not isinstance(cls, type):
            return False  # unsloth-zoo's checkpoint is not loaded: no call reaches it
        backward = cls.__dict__.get("backward")
        known, answer = self._known
        if backward is None or backward is not known:
            replaced = any(other.installed(backward) for other in self._fix.relied_on(UNSLOTH_FUNCTION))
            answer = not replaced and check_range(FIRST_INPUT_ONLY).applies
            self._known = (backward, answer)
        return answer


def checkpoint_function_drift(module: Any) -> Optional[str]:
    """None when ``module.UnslothCheckpointFunction`` has the shape both fixes were written for."""
    import torch  # here, not at module level: loading a fix must not import torch

    cls = getattr(module, CLASS_NAME, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        return f"{CLASS_NAME} is missing or not a torch.autograd.Function"
    # torch <= 2.13: Function.apply is a Python classmethod; 2.14 leaves the C one
    # (_FunctionBase.apply, a classmethod_descriptor) on Function.  wrapt wraps either.
    if not isinstance(inspect.getattr_static(cls, "apply", None), (classmethod, types.ClassMethodDescriptorType)):
        return f"{CLASS_NAME}.apply is not a classmethod"
    forward = inspect.getattr_static(cls, "forward", None)
    if not isinstance(forward, staticmethod):
        return f"{CLASS_NAME}.forward is not a staticmethod"
    try:
        params = list(inspect.signature(forward.__func__).parameters.values())
    except (TypeError, ValueError):
        return f"{CLASS_NAME}.forward has no readable signature"
    shape = [p.kind for p in params]
    if shape != [
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    ]:
        return f"{CLASS_NAME}.forward is no longer forward(ctx, run_function, preserve_rng_state, *args)"
    return None
