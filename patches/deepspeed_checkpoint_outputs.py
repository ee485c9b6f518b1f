"""DeepSpeed's own checkpoint function as transformers' checkpoint function: a layer's tuple of one comes back bare.

What breaks: ``deepspeed.checkpointing.checkpoint(function, *args)`` returns what the layer returned as the list it
collected, unwrapped where it holds one item: a layer returning ``(hidden_states,)`` (Whisper, Bart and most
encoder-decoders on transformers 4.x) gets back the bare tensor, the model's ``layer_outputs[0]`` takes its first
batch row, and the next layer fails ("ValueError: not enough values to unpack").  Set as transformers' checkpoint
function: ``model._set_gradient_checkpointing(True, deepspeed.checkpointing.checkpoint)`` (Megatron-style recipes
that want DeepSpeed's activation partitioning or CPU checkpointing).

How this fixes it: the slot wraps transformers' stored checkpoint function (innermost, ``hotfix.relations``);
where that function is DeepSpeed's ``checkpoint`` or ``non_reentrant_checkpoint``, the layer function it receives
is wrapped to remember whether it returned a tuple of one, and the bare tensor DeepSpeed hands back is put back
into that tuple.  Calls of DeepSpeed's function that do not pass through transformers are left as they are.
docs/fixes/deepspeed-checkpoint-outputs.md.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from hotfix import Mechanism
from hotfix.checkpointing.slot_fix import CheckpointFunctionFix, NOT_REACHED

#: DeepSpeed's activation checkpointing module (``deepspeed.checkpointing``) and its checkpoint functions
DEEPSPEED_CHECKPOINTING = "deepspeed.runtime.activation_checkpointing.checkpointing"
FUNCTIONS = ("checkpoint", "non_reentrant_checkpoint")


def is_deepspeed_checkpoint(stored: Any) -> bool:
    """Is ``stored`` (what transformers holds: a function, or a partial of one) DeepSpeed's checkpoint function?"""
    function = stored.func if isinstance(stored, functools.partial) else stored
    return getattr(function, "__module__", None) == DEEPSPEED_CHECKPOINTING and getattr(
        function, "__name__", None) in FUNCTIONS


def checkpoint_keeping_tuples_of_one(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``."""
    import torch

    tensor = torch.Tensor

    def restore_tuple_of_one(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        if not args or not is_deepspeed_checkpoint(wrapped):
            return wrapped(*args, **kwargs)
        function = args[0]
        returned: list = []  # whether the layer returned a tuple of one, from its first run (the forward)

        def layer(*inputs, **keywords):
            output = function(*inputs, **keywords)
            if not returned:
                returned.append(type(output) is tuple and len(output) == 1)
            return output

        result = wrapped(layer, *args[1:], **kwargs)
        if returned and returned[0] and isinstance(result, tensor):
            fix.repaired("the layer's tuple of one, returned bare by DeepSpeed's checkpoint function, was put back "
                         "into its tuple", call="a call through DeepSpeed's checkpoint function")
            return (result,)
        return result

    return restore_tuple_of_one


class DeepspeedCheckpointOutputs(CheckpointFunctionFix):
    name = "deepspeed-checkpoint-outputs"
    # every release read (0.11.2; first and last of each line 0.12 - 0.19) returns a lone output bare; the slot
    # exists from transformers 4.35
    mechanisms = (
        Mechanism("tuple-of-one-unwrapped", {"deepspeed": ">=0.11.2", "transformers": ">=4.35.0"},
                  unreached=NOT_REACHED,
                  summary="deepspeed.checkpointing.checkpoint as transformers' checkpoint function: a layer "
                          "returning a tuple of one (Whisper on 4.x) gets its tensor back bare"),
    )
    symptom = ("ValueError: not enough values to unpack - transformers' layers checkpointed with "
               "deepspeed.checkpointing.checkpoint (Whisper, Bart: the layer's tuple of one comes back bare)")
    upstream = "deepspeedai/DeepSpeed activation_checkpointing/checkpointing.py (checkpoint returns all_outputs[0])"
    fixed_in = None  # DeepSpeed 0.19.8 still unwraps

    def build_wrapper(self) -> Callable:
        return checkpoint_keeping_tuples_of_one(self)


patch = DeepspeedCheckpointOutputs()
