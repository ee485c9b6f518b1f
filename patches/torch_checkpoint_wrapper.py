"""torch's ``checkpoint_wrapper`` around transformers layers (FSDP/FSDP2 activation checkpointing: accelerate, Lightning).

What breaks: ``apply_activation_checkpointing`` wraps each layer in ``CheckpointWrapper``; transformers does not
know the layer is checkpointed and hands it the Cache (``use_cache`` defaults to True), which the recomputation
writes again: ``CheckpointImpl.REENTRANT`` gives silently wrong gradients (tiny Llama 8 of 21 equal), ``NO_REENTRANT``
a CheckpointError ("Recomputed values ... have different metadata"); a layer with no input needing grad (LoRA,
Whisper's encoder) fails under REENTRANT ("element 0 of tensors does not require grad").

How this fixes it: ``CheckpointWrapper.forward`` is wrapped; for a transformers ``GradientCheckpointingLayer`` in
training (grad on, not checkpointed by transformers already, not compiling) the call goes through the layer's own
checkpointing with the wrapper's checkpoint function (``checkpointing.torch_wrapper``): no Cache for the layer, as
under transformers' function, whose fixes then act on it.  ``use_cache`` stays as set; the model's Cache is built
and stays empty.  docs/fixes/torch-checkpoint-wrapper.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.code import code_objects
from hotfix.checkpointing.torch_wrapper import CLASS_NAME

#: torch's module holding ``CheckpointWrapper`` (imported by accelerate's FSDP plugin, Lightning, the user)
CHECKPOINT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"


def forward_through_transformers(fix: "TorchCheckpointWrapper") -> Callable:
    """The wrapt wrapper of ``CheckpointWrapper.forward`` (built at the first apply: torch is imported then)."""
    import torch

    from hotfix.checkpointing.torch_wrapper import (CheckpointedByTransformers, RoutePlans, StoredFunctions,
                                                    hands_a_cache, transformers_layer, without_cache)

    is_grad_enabled, is_compiling = torch.is_grad_enabled, torch.compiler.is_compiling
    stored, plans = StoredFunctions(), RoutePlans(fix)

    def checkpoint_as_transformers_does(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which is where
        layer = getattr(instance, "_checkpoint_wrapped_module", None)
        if (layer is None or not transformers_layer(layer) or not layer.training or not is_grad_enabled()
                or getattr(layer, "gradient_checkpointing", False) or is_compiling()
                or plans.missing(type(layer))):  # (the routed fixes' slots stand on the layer's class once it says none)
            return wrapped(*args, **kwargs)
        reentrant = getattr(getattr(instance, "checkpoint_impl", None), "name", None) == "REENTRANT"
        function = stored.of(instance.checkpoint_fn, reentrant)
        if hands_a_cache(layer, args, kwargs):
            # Said for REENTRANT only: there the second write gives wrong gradients on every release measured; under
            # NO_REENTRANT some (5.14+, the census's Llama) train equal upstream, and no line may claim a repair there
            if reentrant:
                fix.repaired("a layer checkpointed by torch's checkpoint_wrapper gets no Cache in training, as under "
                             "transformers' own checkpointing (its recomputation wrote the Cache a second time)")
            args, kwargs = without_cache(args, kwargs)
        with CheckpointedByTransformers(layer, function):  # stored through the slots, which record it
            return layer(*args, **kwargs)

    return checkpoint_as_transformers_does


class TorchCheckpointWrapper(Patch):
    name = "torch-checkpoint-wrapper"
    targets = (CHECKPOINT_WRAPPER,)
    # GradientCheckpointingLayer (4.52.0; every layer from 4.53.0) is what this fix hands the call to: before it,
    # each model's forward decides about its Cache itself, out of this fix's reach.
    mechanisms = (
        Mechanism("wrapper-cache", {"transformers": ">=4.52.0"}, unreached={"transformers": "<4.52.0"},
                  summary="a transformers layer under torch's checkpoint_wrapper (FSDP/FSDP2 activation "
                          "checkpointing) writes the Cache again when recomputed; its frozen and keyword inputs "
                          "are repaired as under transformers' own function"),
    )
    symptom = ("Silently wrong gradients, or torch.utils.checkpoint.CheckpointError: Recomputed values for the "
               "following tensors have different metadata - FSDP activation checkpointing (checkpoint_wrapper) "
               "of transformers layers with use_cache left on")
    upstream = ("huggingface/transformers#34928, #28499, #32073; Lightning-AI/pytorch-lightning#19267; "
                "hiyouga/LlamaFactory#9064")
    fixed_in = None  # transformers 5.23.0 and torch 2.13.0 still have it

    def drift(self, module: Any) -> Optional[str]:
        wrapper = getattr(module, CLASS_NAME, None)
        if not isinstance(wrapper, type) or "forward" not in wrapper.__dict__:
            return f"{CLASS_NAME}.forward is missing"
        names = {name for code in code_objects(wrapper.__dict__["forward"]) for name in code.co_names}
        if not {"checkpoint_fn", "_checkpoint_wrapped_module"} <= names:
            return f"{CLASS_NAME}.forward no longer calls self.checkpoint_fn on self._checkpoint_wrapped_module"
        return None

    def _apply(self, module: Any) -> None:
        self.wrap(getattr(module, CLASS_NAME), "forward", self.wrapper)

    def build_wrapper(self) -> Callable:
        return forward_through_transformers(self)


patch = TorchCheckpointWrapper()
