"""torch's checkpoint with ``preserve_rng_state=False`` around code that draws random numbers (dropout).

What breaks: the recomputation runs the layer again from whatever state the random number generators are in at
backward time; its dropout masks differ from the forward's, so the gradients belong to another network: silently
wrong, the loss unchanged (allenai/OLMo-core#828: loss 2.49 against 2.19).  ``preserve_rng_state=False`` is set
for speed (torchtitan's and torchtune's wrappers, trainers' ``gradient_checkpointing_kwargs``).

How this fixes it: torch's reentrant ``CheckpointFunction.apply`` and its non-reentrant generator are wrapped; a call
asking ``preserve_rng_state=False`` runs with True: torch stashes the generators' state in the forward and restores
it in the recomputation.  Where nothing draws random numbers the results are the same bit for bit (the stash's cost
is not measured); where something does, the recomputation draws what the forward drew.  One "repaired"
line where a forward did draw (its CPU or device generator moved).  Under torch.compile the call is left alone.
Revert puts both back.  docs/fixes/torch-checkpoint-rng-state.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.torch_checkpoint import (FUNCTION_CLASS, GENERATOR, MODULE, debug_asked,
                                                   function_class_drift, generator_drift)


class TorchCheckpointRngState(Patch):
    name = "torch-checkpoint-rng-state"
    targets = (MODULE,)
    # torch has the flag, and no guard against random numbers drawn without it, on every line hotfix supports
    mechanisms = (
        Mechanism("rng-not-preserved", {"torch": ">=2.4.0"}, unreached={"torch": "<2.4.0"},
                  summary="checkpoint(..., preserve_rng_state=False) around dropout: the recomputation draws other "
                          "masks than the forward, silently wrong gradients"),
    )
    symptom = ("silently wrong gradients (loss unchanged) with checkpoint(..., preserve_rng_state=False) and dropout "
               "in the checkpointed layers")
    upstream = "allenai/OLMo-core#828; torch documents preserve_rng_state=False as 'omit stashing'"

    def __init__(self) -> None:
        super().__init__()
        self._bound: list = []

    def _helpers(self) -> tuple:
        if not self._bound:
            import torch
            from torch.utils.checkpoint import get_device_states

            def state(args: tuple) -> tuple:
                devices, states = get_device_states(*args)
                return torch.get_rng_state(), devices, states

            def moved(before: tuple, after: tuple) -> bool:
                return not torch.equal(before[0], after[0]) or before[1] != after[1] or any(
                    not torch.equal(a, b) for a, b in zip(before[2], after[2]))

            self._bound[:] = [state, moved, torch.compiler.is_compiling]
        return tuple(self._bound)

    def _drew(self) -> None:
        self.repaired("a checkpointed forward drew random numbers with preserve_rng_state=False: the recomputation "
                      "would have drawn others; the generators' state was preserved",
                      call="torch's checkpoint with preserve_rng_state=False")

    def _probe(self, function: Callable, args: tuple) -> Callable:
        """``function``, telling whether its first call (the forward) moved a generator."""
        state, moved, _ = self._helpers()
        calls = []

        def forward_then_recomputations(*inner: Any, **kwargs: Any) -> Any:
            if calls:
                return function(*inner, **kwargs)
            calls.append(True)
            before = state(args)
            result = function(*inner, **kwargs)
            if moved(before, state(args)):
                self._drew()
            return result

        return forward_then_recomputations

    def _reentrant(self) -> Callable:
        def idle(instance, args, kwargs) -> bool:  # preserve_rng_state not False (hotfix.junction)
            return len(args) < 2 or args[1] is not False

        def preserve_rng_reentrant(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if idle(instance, args, kwargs) or self._helpers()[2]():
                return wrapped(*args, **kwargs)
            return wrapped(self._probe(args[0], args[2:]), True, *args[2:], **kwargs)

        preserve_rng_reentrant.idle = idle
        return preserve_rng_reentrant

    def _non_reentrant(self, module: Any) -> Callable:
        fix = self

        class ForwardProbe:
            """Around the user's forward context (``context_fn``'s first): did the forward move a generator?"""

            def __init__(self, inner: Any, args: tuple) -> None:
                self.inner, self.args, self.before = inner, args, None

            def __enter__(self) -> Any:
                self.before = fix._helpers()[0](self.args)
                return self.inner.__enter__()

            def __exit__(self, *exc: Any) -> Any:
                suppressed = self.inner.__exit__(*exc)
                state, moved, _ = fix._helpers()
                if exc[0] is None and moved(self.before, state(self.args)):
                    fix._drew()
                return suppressed

        def probed(context_fn: Callable, args: tuple) -> Callable:
            def contexts() -> tuple:
                forward_context, recompute_context = context_fn()
                return ForwardProbe(forward_context, args), recompute_context

            return contexts

        def idle(instance, args, kwargs) -> bool:  # preserve_rng_state not False (hotfix.junction)
            return len(args) < 5 or args[1] is not False

        def preserve_rng_non_reentrant(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if idle(instance, args, kwargs) or self._helpers()[2]():
                return wrapped(*args, **kwargs)
            if debug_asked(module, args):  # debug: no context_fn of ours
                return wrapped(args[0], True, *args[2:], **kwargs)
            # the forward is called by checkpoint() itself: its context (``context_fn``'s first) tells what it drew
            return wrapped(args[0], True, probed(args[2], args[5:]), *args[3:], **kwargs)

        preserve_rng_non_reentrant.idle = idle
        return preserve_rng_non_reentrant

    def drift(self, module: Any) -> Optional[str]:
        return function_class_drift(module) or generator_drift(module)

    def _apply(self, module: Any) -> None:
        self.join(module.__dict__[FUNCTION_CLASS], "apply", self._reentrant())
        self.join(module, GENERATOR, self._non_reentrant(module))


patch = TorchCheckpointRngState()
