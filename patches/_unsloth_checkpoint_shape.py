"""What both unsloth-zoo fixes rely on in ``UnslothCheckpointFunction`` (a helper, not a fix).

Kept beside the fixes that use it, so neither fix imports the other.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Optional

CLASS_NAME = "UnslothCheckpointFunction"


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
