"""unsloth-zoo >= 2024.11.6: tensors in a checkpointed ``partial``'s closure break backward.

What breaks: ``UnslothCheckpointFunction`` is a reentrant checkpoint; only the tensors passed
to ``apply(run_function, preserve_rng_state, *args)`` positionally are inputs of its node.  A
``functools.partial`` holding a tensor that needs grad (transformers' layers bind
``encoder_hidden_states=`` that way) is recomputed with the original tensor, whose history is
walked again per layer: "Trying to backward through the graph a second time" (Whisper).

How this fixes it: ``UnslothCheckpointFunction.apply`` (every path into unsloth's checkpoint
ends there) is wrapped on the class; a partial's closure tensors become extra positional
inputs, put back in place inside the recomputation (``checkpointing.inputs``); behind a frozen first
input on a release whose own backward then returns one gradient, after a 0-byte anchor
(``checkpointing.unsloth.FirstInputRule``).  Revert deletes the class attribute.
docs/fixes/unsloth-zoo-closure-tensors.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing import BACKWARD_TWICE
from hotfix.checkpointing.unsloth import CLASS_NAME, FirstInputRule, checkpoint_function_drift


def apply_with_lifted_inputs(fix: "UnslothZooClosureTensors") -> Callable:
    """The wrapt wrapper around ``UnslothCheckpointFunction.apply`` (built at the first apply)."""

    def apply_with_lifted_inputs(wrapped, instance, args, kwargs):  # named: wrapper chains read it
        # apply(run_function, preserve_rng_state, *inputs): anything else (keywords,
        # too few arguments) is not a call shape we understand: pass it through.
        if len(args) >= 2 and not kwargs:
            # imports torch: only when called
            from hotfix.checkpointing.inputs import anchored, first_input_needs_grad, lift_closure_tensors

            lifted = lift_closure_tensors(args[0], args[2:])
            if lifted is not None:
                function, inputs = lifted
                # a lifted leaf (a parameter) is right upstream too; a tensor with a history is re-walked there
                if any(tensor.grad_fn is not None for tensor in inputs[len(args) - 2:]):
                    fix.repaired("tensors bound in a partial became checkpoint inputs")
                # This release's own backward (unsloth-zoo-offload-backward opted out) returns one gradient when
                # the first input needs none: the lifted inputs then come after a 0-byte anchor that needs grad.
                if not first_input_needs_grad(inputs) and fix.first_input.needs_grad_first():
                    function, inputs = anchored(function, inputs, first=True)
                return wrapped(function, args[1], *inputs)
        return wrapped(*args, **kwargs)

    return apply_with_lifted_inputs


class UnslothZooClosureTensors(Patch):
    name = "unsloth-zoo-closure-tensors"
    targets = ("unsloth_zoo.gradient_checkpointing",)
    # Spelled as the metadata spells the distribution; importlib.metadata
    # normalises unsloth_zoo / unsloth-zoo alike (checked by the tests).  2024.11.6 is the
    # first release with UnslothCheckpointFunction; every release since is broken (census).
    mechanisms = (
        Mechanism("closure-tensors", {"unsloth-zoo": ">=2024.11.6"},
                  summary="a tensor needing grad bound in the checkpointed partial (Whisper decoder)"),
    )
    symptom = (f"{BACKWARD_TWICE} - unsloth use_gradient_checkpointing='unsloth' with a tensor bound in a "
               "functools.partial (Whisper decoder)")
    upstream = "unslothai/unsloth-zoo gradient_checkpointing.py UnslothCheckpointFunction (since 2024.11.6)"
    fixed_in = None  # 2026.10.9 still has it

    def __init__(self) -> None:
        super().__init__()
        self.first_input = FirstInputRule(self)

    def drift(self, module: Any) -> Optional[str]:
        return checkpoint_function_drift(module)

    def _apply(self, module: Any) -> None:
        # Patch.join takes the inherited classmethod object itself (wrapt's resolve_path), so the junction binds to
        # whichever class calls apply; set on the class, it shadows Function.apply until revert deletes it.
        self.join(getattr(module, CLASS_NAME), "apply", self.wrapper)

    def build_wrapper(self) -> Callable:
        return apply_with_lifted_inputs(self)


patch = UnslothZooClosureTensors()
