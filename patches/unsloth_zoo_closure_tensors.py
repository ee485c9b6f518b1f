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
extra positional inputs (``hotfix.patches._checkpoint_inputs.lift_closure_tensors``),
put back in place inside the recomputation.  Because the wrapper sits on the
class, it works however late hotfix is activated, before or after unsloth's
``patch_unsloth_smart_gradient_checkpointing()`` swapped torch's function.
On the transformers path the transformers patch has usually lifted the
tensors already; the function we then see is no longer a partial and the call
goes through unchanged.  Reverting deletes the class attribute, so the
inherited ``Function.apply`` is visible again.
"""

from __future__ import annotations

from typing import Any, Optional

from hotfix.patch import Mechanism, Patch
from hotfix.patches._unsloth_checkpoint_shape import CLASS_NAME, checkpoint_function_drift


def _apply_with_lifted_inputs(wrapped, instance, args, kwargs):
    """wrapt wrapper around ``UnslothCheckpointFunction.apply``."""
    # apply(run_function, preserve_rng_state, *inputs): anything else (keywords,
    # too few arguments) is not a call shape we understand: pass it through.
    if len(args) >= 2 and not kwargs:
        from hotfix.patches._checkpoint_inputs import lift_closure_tensors  # imports torch: only when called

        lifted = lift_closure_tensors(args[0], args[2:])
        if lifted is not None:
            patch.repaired("tensors bound in a partial became checkpoint inputs")
            function, inputs = lifted
            return wrapped(function, args[1], *inputs)
    return wrapped(*args, **kwargs)


class UnslothZooClosureTensors(Patch):
    name = "unsloth-zoo-closure-tensors"
    targets = ("unsloth_zoo.gradient_checkpointing",)
    # Spelled as the metadata spells the distribution; importlib.metadata
    # normalises unsloth_zoo / unsloth-zoo alike (checked by the tests).
    affected = {"unsloth-zoo": ">=2024.11.6"}
    mechanisms = (
        Mechanism("closure-tensors", {"unsloth-zoo": ">=2024.11.6"},
                  summary="a tensor needing grad bound in the checkpointed partial (Whisper decoder)"),
    )
    symptom = (
        "RuntimeError: Trying to backward through the graph a second time - unsloth "
        "use_gradient_checkpointing='unsloth' with a tensor bound in a functools.partial (Whisper decoder)"
    )
    upstream = "unslothai/unsloth-zoo gradient_checkpointing.py UnslothCheckpointFunction (since 2024.11.6)"
    fixed_in = None  # 2026.10.9 still has it

    def drift(self, module: Any) -> Optional[str]:
        return checkpoint_function_drift(module)

    def _apply(self, module: Any) -> None:
        # Patch.wrap takes the inherited classmethod object itself (wrapt's
        # resolve_path), so the wrapper binds to whichever class calls apply;
        # set on the class, it shadows Function.apply until revert deletes it.
        self.wrap(getattr(module, CLASS_NAME), "apply", _apply_with_lifted_inputs)


patch = UnslothZooClosureTensors()
