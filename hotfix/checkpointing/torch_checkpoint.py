"""What fixes rely on in torch's own checkpoint module: the names where every call ends, and the generator's shape.

Every reentrant call of ``torch.utils.checkpoint.checkpoint`` ends in ``CheckpointFunction.apply(function,
preserve_rng_state, *inputs)``; every non-reentrant one in ``_checkpoint_without_reentrant_generator(fn,
preserve_rng_state, context_fn, determinism_check, debug, ...)``, looked up as a module global at each call (so a
wrapper on the module reaches calls through any reference to ``checkpoint``).  Read without importing torch.
"""

from __future__ import annotations

from typing import Any, Optional

# the start-up hook watches the generator and the class's apply too (a torch-only script's first checkpoint call
# activates hotfix)
from hotfix.startup.hook import CHECKPOINT_FUNCTION as FUNCTION_CLASS
from hotfix.startup.hook import CHECKPOINT_GENERATOR as GENERATOR, CHECKPOINT_MODULE as MODULE

#: the generator's leading parameters, in order (torch 2.4 - 2.15); its positional arguments after them are the call's
GENERATOR_PARAMETERS = ("fn", "preserve_rng_state", "context_fn", "determinism_check", "debug")


def function_class_drift(module: Any) -> Optional[str]:
    cls = module.__dict__.get(FUNCTION_CLASS)
    if not isinstance(cls, type) or cls.__module__ != MODULE:
        return f"{FUNCTION_CLASS} is missing or not torch's own"
    return None


def generator_drift(module: Any) -> Optional[str]:
    code = getattr(module.__dict__.get(GENERATOR), "__code__", None)
    if code is None:
        return f"{GENERATOR} is missing"
    if code.co_varnames[:len(GENERATOR_PARAMETERS)] != GENERATOR_PARAMETERS:
        return f"{GENERATOR} no longer takes ({', '.join(GENERATOR_PARAMETERS)}, ...)"
    return None


def debug_asked(module: Any, args: tuple) -> bool:
    """Does this generator call run torch's checkpoint debug mode (which refuses any ``context_fn`` but the default)?"""
    return bool(args[4]) or bool(module.__dict__.get("_checkpoint_debug_enabled"))
