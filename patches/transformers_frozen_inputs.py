"""transformers >= 4.35: a checkpointed layer with no grad-requiring input loses its parameters' gradients.

What breaks
-----------
Reentrant checkpointing (``use_reentrant=True``, the 4.x default) is an
``autograd.Function``: if none of its tensor inputs requires grad, its outputs
do not either, no graph node is made, and the layer is never recomputed in
backward.  Its *parameters* then get no gradient, even when they are
trainable.  That is the adapter case: PEFT LoRA on Whisper's ``q_proj`` /
``v_proj`` with everything else frozen.  ``enable_input_require_grads()``
exists for exactly this, but on 4.x it hooks only
``model.get_input_embeddings()``, which for Whisper is the *decoder*'s
``embed_tokens``.  The encoder's front end (``conv1``/``conv2``, frozen) feeds
encoder layers whose inputs do not require grad, so every encoder LoRA weight
silently gets no gradient (tiny Whisper, LoRA on q/v: 8 of 24 trainable
tensors, measured on 4.52.4, 4.53.3, 4.56.2, 4.57.6).  The same holds for any
sub-model whose embeddings are not the top-level ones (vision towers of VLMs).

What 5.x changed
----------------
From 5.0.0 (huggingface/transformers#41993, made tolerant in #42558),
``PreTrainedModel.enable_input_require_grads`` walks ``self.modules()`` and
registers its "output.requires_grad_(True)" hook on the input embeddings of
*every* ``PreTrainedModel`` inside the model (deduplicated by module), not only
the top-level one.  For Whisper that adds ``WhisperEncoder.conv1`` (declared
as ``_input_embed_layer = "conv1"`` in 5.x): the conv front end's output
requires grad, so every encoder layer's checkpoint has a grad-requiring input
and the LoRA weights get their gradients.  The layers and checkpointing did
not change: with only the 4.x top-level hook, 5.23.0 loses the same 8, and a
script that never calls ``enable_input_require_grads()`` (5.x defaults to
non-reentrant, but unsloth-zoo forces ``use_reentrant=True`` on 5.x and users
still pass it) fails at the first backward on every release: "element 0 of
tensors does not require grad and does not have a grad_fn".  So this fix is
gated on the mechanism, checked at each call, not on a 4.x version range.

How this patch fixes it
-----------------------
Not by copying 5.x: making the front-end output require grad also makes
autograd save the frozen front end's activations for a backward whose results
nobody needs.  Instead, at the checkpoint call itself: when a checkpointed call
is reentrant, grad mode is on, the layer is training and has trainable
parameters, and *no* tensor reaching the call requires grad (positional
inputs, nested or in the ``partial``'s closure), one empty leaf tensor
(``torch.empty(0, requires_grad=True)``, 0 bytes) is passed as an extra
positional input and dropped again before the layer runs.  The checkpoint node
now exists, so backward recomputes the layer and its parameters get exactly
the gradients of a run without checkpointing; the anchor itself gets none.
Everything else (a layer with an input that requires grad, a frozen layer,
non-reentrant checkpointing, eval, ``no_grad``) is the original call unchanged.

The layer is found from the function transformers hands to the checkpoint:
the bound method's ``__self__`` (4.53-4.57 ``partial(super().__call__, **kw)``,
4.52 and earlier ``layer.__call__`` from the model's own loop) or the
partial's first argument (5.x ``partial(forward, self, **kw)``).

Where: every checkpointed call reads ``module._gradient_checkpointing_func``
first, whichever module makes it (a ``GradientCheckpointingLayer`` from 4.53,
the encoder itself in 4.52 and earlier, models that never moved to the layer
class).  A data descriptor of that name on ``torch.nn.Module``
(``hotfix.patches._checkpoint_slot``) returns the stored function wrapped; the model
keeps exactly what transformers stored (copies, pickles and saves of it hold
no hotfix object, and a copy is repaired like the original).  Models built
and set up before hotfix was applied are covered too.  Reverting deletes the
descriptor.

On 4.53-4.57 the encoder output of a Whisper LoRA model now requires grad and
reaches the decoder layers by keyword (``encoder_hidden_states=``):
``transformers-keyword-tensors`` is what makes that path correct.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from hotfix.patches._checkpoint_slot import ATTRIBUTE, CheckpointFunctionSlot, code_objects
from hotfix.patch import Mechanism, Patch

SETTER = "_set_gradient_checkpointing"


def _layer_of(function: Any) -> Any:
    """The ``nn.Module`` whose call ``function`` is, or None."""
    from torch import nn

    for _ in range(8):  # partials of partials, bounded
        if isinstance(function, nn.Module):
            return function
        if isinstance(function, functools.partial):
            if function.args and isinstance(function.args[0], nn.Module):
                return function.args[0]  # 5.x: partial(forward, self, **kwargs)
            function = function.func
            continue
        inner = getattr(function, "__wrapped__", None)  # a hotfix wrapper around the layer call
        if inner is not None:
            function = inner
            continue
        owner = getattr(function, "__self__", None)  # bound layer.__call__ / super().__call__
        return owner if isinstance(owner, nn.Module) else None
    return None


def _checkpoint_with_anchor(wrapped, instance, args, kwargs):
    """wrapt wrapper around a module's checkpoint function."""
    if not args:
        return wrapped(*args, **kwargs)
    import torch

    from hotfix.patches._checkpoint_inputs import find_grad_tensors, is_reentrant, layer_call

    function, inputs = args[0], args[1:]
    if not torch.is_grad_enabled() or not is_reentrant(wrapped, kwargs):
        return wrapped(*args, **kwargs)
    found: list = []
    seen: set = set()
    find_grad_tensors(inputs, found, seen)
    call = layer_call(function)  # the partial itself, also when another fix wrapped it
    if isinstance(call, functools.partial):
        find_grad_tensors(call.args, found, seen)
        find_grad_tensors(call.keywords, found, seen)
    if found:  # the checkpoint node exists (or the keyword patch's case): leave it
        return wrapped(*args, **kwargs)
    layer = _layer_of(call)
    if layer is None or not layer.training or not any(p.requires_grad for p in layer.parameters()):
        return wrapped(*args, **kwargs)

    patch.repaired("a layer with trainable parameters and no input needing grad is recomputed")
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), None)
    anchor = torch.empty(0, device=device, requires_grad=True)
    n_inputs = len(inputs)

    def run_without_anchor(*all_inputs):
        return function(*all_inputs[:n_inputs])

    return wrapped(run_without_anchor, *inputs, anchor, **kwargs)


class TransformersFrozenInputs(Patch):
    name = "transformers-frozen-inputs"
    targets = ("transformers.modeling_utils",)
    # 4.35.0 introduced _set_gradient_checkpointing(enable, gradient_checkpointing_func).
    # No upper bound: the condition is a mechanism, checked at every call (reentrant
    # checkpoint, layer training with trainable parameters, no input needing grad).
    # 5.x's enable_input_require_grads() hooks every sub-model, but without it, or with
    # use_reentrant=True forced (unsloth-zoo on 5.x), 5.x loses the same gradients.
    affected = {"transformers": ">=4.35.0"}
    mechanisms = (
        Mechanism("frozen-layer-inputs", {"transformers": ">=4.35.0"},
                  summary="a reentrant checkpointed layer with trainable parameters and no input needing grad "
                          "(Whisper + LoRA: encoder adapters without gradient)"),
    )
    symptom = (
        "Parameters silently get no gradient with gradient checkpointing (use_reentrant=True) "
        "when no input of a checkpointed layer requires grad - Whisper + LoRA: encoder adapters never train"
    )
    details = (
        "Adapters (PEFT LoRA) or partially frozen models on 4.x: enable_input_require_grads() hooks only "
        "the top-level input embeddings, so layers of other sub-models (Whisper encoder, vision towers) "
        "have no grad-requiring input and their trainable parameters get no gradient under reentrant "
        "checkpointing. A 0-byte leaf input makes the checkpoint node exist."
    )
    upstream = ("huggingface/transformers#41993 (5.0.0: enable_input_require_grads on every sub-model, "
                "which covers only models that call it)")
    fixed_in = None  # reentrant checkpointing of a layer without grad inputs is still silent in 5.23.0

    def drift(self, module: Any) -> Optional[str]:
        import torch

        setter = getattr(getattr(module, "PreTrainedModel", None), SETTER, None)
        if setter is None:
            return f"PreTrainedModel.{SETTER} is missing"
        if not any(ATTRIBUTE in code.co_names for code in code_objects(setter)):
            return f"PreTrainedModel.{SETTER} no longer stores the checkpoint function as {ATTRIBUTE}"
        present = torch.nn.Module.__dict__.get(ATTRIBUTE)
        if present is not None and not isinstance(present, CheckpointFunctionSlot):
            return f"torch.nn.Module already defines {ATTRIBUTE}"
        return None

    def _apply(self, module: Any) -> None:
        import torch
        from torch.compiler import is_compiling

        slot = CheckpointFunctionSlot(torch.nn.Module, _checkpoint_with_anchor, is_compiling)
        self.replace(torch.nn.Module, ATTRIBUTE, slot)


patch = TransformersFrozenInputs()
