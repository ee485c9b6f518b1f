"""unsloth-zoo >= 2024.11.6: tensors in a checkpointed ``partial``'s closure break backward.

What breaks
-----------
``unsloth_zoo.gradient_checkpointing.UnslothCheckpointFunction`` is a
reentrant checkpoint (an ``autograd.Function``): only the tensors passed to
``apply(run_function, preserve_rng_state, *args)`` positionally are inputs of
its graph node.  When ``run_function`` is a ``functools.partial`` holding a
tensor that requires grad (transformers' ``GradientCheckpointingLayer`` passes
``partial(layer.__call__, encoder_hidden_states=enc, ...)``), the backward
recomputes with the *original* tensor and walks its whole history again, once
per layer: "Trying to backward through the graph a second time" on Whisper's
second decoder layer.  Every release from 2024.11.6 (the first with this
class) to 2026.10.9 has it; 2026.8.11 only fixed keywords passed to
``unsloth_checkpoint(fn, *args, **kwargs)`` itself.

How this patch fixes it
-----------------------
Every way into unsloth's checkpoint ends in ``UnslothCheckpointFunction.apply``:
torch's ``checkpoint`` (after unsloth swaps ``torch.utils.checkpoint.
CheckpointFunction``), ``unsloth_checkpoint``, and direct calls.  We wrap that
classmethod (wrapt ``FunctionWrapper`` around the inherited ``classmethod``
object, set on the class itself) so that a partial's closure tensors become
extra positional inputs (``hotfix.checkpoint_inputs.lift_closure_tensors``),
put back in place inside the recomputation.  Because the wrapper sits on the
class, it works however late hotfix is activated, before or after unsloth's
``patch_unsloth_smart_gradient_checkpointing()`` swapped torch's function.
On the transformers path the transformers patch has usually lifted the
tensors already; the function we then see is no longer a partial and the call
goes through unchanged.  Reverting deletes the class attribute, so the
inherited ``Function.apply`` is visible again.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import wrapt

from hotfix.patch import Patch

CLASS_NAME = "UnslothCheckpointFunction"


def _apply_with_lifted_inputs(wrapped, instance, args, kwargs):
    """wrapt wrapper around ``UnslothCheckpointFunction.apply``."""
    # apply(run_function, preserve_rng_state, *inputs): anything else (keywords,
    # too few arguments) is not a call shape we understand: pass it through.
    if len(args) >= 2 and not kwargs:
        from hotfix.checkpoint_inputs import lift_closure_tensors  # imports torch: only when called

        lifted = lift_closure_tensors(args[0], args[2:])
        if lifted is not None:
            function, inputs = lifted
            return wrapped(function, args[1], *inputs)
    return wrapped(*args, **kwargs)


def checkpoint_function_drift(module: Any) -> Optional[str]:
    """Shared by both unsloth-zoo patches: is UnslothCheckpointFunction what we know?"""
    import torch  # here, not at module level: loading a patch must not import torch

    cls = getattr(module, CLASS_NAME, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        return f"{CLASS_NAME} is missing or not a torch.autograd.Function"
    if not isinstance(inspect.getattr_static(cls, "apply", None), classmethod):
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


class UnslothZooClosureTensors(Patch):
    name = "unsloth-zoo-closure-tensors"
    targets = ("unsloth_zoo.gradient_checkpointing",)
    # Spelled as the metadata spells the distribution; importlib.metadata
    # normalises unsloth_zoo / unsloth-zoo alike (checked by the tests).
    affected = {"unsloth-zoo": ">=2024.11.6"}
    symptom = (
        "RuntimeError: Trying to backward through the graph a second time - unsloth "
        "use_gradient_checkpointing='unsloth' with a tensor bound in a functools.partial (Whisper decoder)"
    )
    details = (
        "UnslothCheckpointFunction.apply(partial(layer, encoder_hidden_states=enc), preserve, h): "
        "closure tensors needing grad become checkpoint inputs, on every path into it "
        "(torch checkpoint after unsloth's swap, unsloth_checkpoint, direct apply)."
    )
    upstream = "unslothai/unsloth-zoo gradient_checkpointing.py UnslothCheckpointFunction (since 2024.11.6)"
    fixed_in = None  # 2026.10.9 still has it

    def drift(self, module: Any) -> Optional[str]:
        return checkpoint_function_drift(module)

    def _apply(self, module: Any) -> None:
        cls = getattr(module, CLASS_NAME)
        # Wrap the classmethod object itself (not the bound method that
        # getattr returns, as Patch.wrap would): bound to cls it would pass
        # cls even for a subclass's apply.  Setting it on cls shadows the
        # inherited Function.apply; revert deletes it again.
        raw = inspect.getattr_static(cls, "apply")
        self.replace(cls, "apply", wrapt.FunctionWrapper(raw, _apply_with_lifted_inputs))


patch = UnslothZooClosureTensors()
