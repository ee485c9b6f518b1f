"""transformers >= 4.35: a reentrant-checkpointed layer with no input needing grad loses its parameters' gradients.

What breaks: reentrant checkpointing is an ``autograd.Function``; when none of its tensor
inputs requires grad no graph node is made and the layer is never recomputed, so its
trainable parameters silently get no gradient.  That is LoRA on a frozen base wherever the
input-grad hook does not reach (4.x hooks only the top-level embeddings: Whisper's encoder
adapters; on every release a script that never calls ``enable_input_require_grads()``).

How this fixes it: when such a call is reentrant, in grad mode, the layer trains and has
trainable parameters, and no tensor reaching it needs grad, a 0-byte leaf is passed as an
extra input (dropped before the layer runs): the node exists, the gradients are exact.  It goes
last, or first where an unsloth-zoo backward needs its first input to need grad (FirstInputRule).
A slot on the classes of modules that receive a checkpoint function wraps it on read (after
transformers' enablers, on unpickling, and for models set up before activation).  docs/fixes/transformers-frozen-inputs.md.
"""

from __future__ import annotations

import functools
from typing import Callable

from hotfix.checkpointing.slot_fix import CheckpointFunctionFix, on_every_reached_release


def checkpoint_with_anchor(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``.

    Built when the fix first applies (its target has imported torch by then); loading this
    module imports no torch, and no checkpointed call pays for an import.
    """
    import torch

    from hotfix.checkpointing.inputs import anchored, is_reentrant
    from hotfix.checkpointing.layer_call import LayerCallWrapper, layer_call, layer_of
    from hotfix.checkpointing.structure import find_grad_tensors
    from hotfix.checkpointing.unsloth import FirstInputRule

    tensor, is_grad_enabled = torch.Tensor, torch.is_grad_enabled
    first_input = FirstInputRule(fix)

    def anchor_frozen_layer(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        for item in args:  # the usual case, answered first: a positional input needs grad, the node exists
            if isinstance(item, tensor) and item.requires_grad:
                return wrapped(*args, **kwargs)
        if not args or not is_grad_enabled() or not is_reentrant(wrapped, kwargs):
            return wrapped(*args, **kwargs)
        function, inputs = args[0], args[1:]
        handed = isinstance(function, LayerCallWrapper)  # another fix wrapped the call: it hands down what it knows
        # Where the fix outside found no tensor needing grad reaching the layer but these inputs (its wrapper says so),
        # none of which needs grad (above), nothing is left to search
        if not (handed and function.no_hidden_grad):
            call = layer_call(function)  # the partial itself, as handed down where another fix wrapped it
            found: list = []
            seen: set = set()
            find_grad_tensors(inputs, found, seen)
            if isinstance(call, functools.partial):
                find_grad_tensors(call.args, found, seen)
                find_grad_tensors(call.keywords, found, seen)
            if found:  # the checkpoint node exists (or the keyword fix's case): leave it
                return wrapped(*args, **kwargs)
        layer = layer_of(function if handed else call)  # a wrapper's: looked up once, handed on (else: searched above)
        if layer is None or not layer.training or not any(p.requires_grad for p in layer.parameters()):
            return wrapped(*args, **kwargs)

        fix.repaired("a layer with trainable parameters and no input needing grad is recomputed")
        # Last, except where the checkpoint's backward returns gradients only when the first input needs grad.
        function, inputs = anchored(function, inputs, first=first_input.needs_grad_first())
        return wrapped(function, *inputs, **kwargs)

    return anchor_frozen_layer


class TransformersFrozenInputs(CheckpointFunctionFix):
    name = "transformers-frozen-inputs"
    reentrant_only = True  # its wrapper hands every non-reentrant call on as it is
    # Ranges equal to the census's evidence (docs/versions.md)
    mechanisms = (
        on_every_reached_release("frozen-layer-inputs",
            "a reentrant checkpointed layer with trainable parameters and no input needing grad (Whisper + LoRA: "
            "encoder adapters without gradient)"),
    )
    symptom = (
        "Parameters silently get no gradient with gradient checkpointing (use_reentrant=True) "
        "when no input of a checkpointed layer requires grad - Whisper + LoRA: encoder adapters never train"
    )
    upstream = ("huggingface/transformers#41993 (5.0.0: enable_input_require_grads on every sub-model, "
                "which covers only models that call it)")
    fixed_in = None  # reentrant checkpointing of a layer without grad inputs is still silent in 5.23.0

    def build_wrapper(self) -> Callable:
        return checkpoint_with_anchor(self)


patch = TransformersFrozenInputs()
