"""DeepSpeed's own checkpoint function as transformers' checkpoint function: what it does to a layer's call.

What breaks: set as transformers' checkpoint function (``model._set_gradient_checkpointing(True,
deepspeed.checkpointing.checkpoint)``), DeepSpeed treats a layer call as a Megatron layer's.  A layer's tuple of one
(Whisper, Bart on 4.x) comes back bare and the next layer fails ("not enough values to unpack").  With
``partition_activations`` / ``cpu_checkpointing``, a non-tensor positional input (Whisper's encoder passes ``None``)
shifts the recomputation's arguments ("got multiple values for argument"), and the inputs every layer shares (encoder
states and mask passed positionally on 5.x, keyword tensors hotfix lifts on 4.x) are emptied after the first ("0D").

How this fixes it: the innermost slot (``hotfix.relations``) hands DeepSpeed's ``checkpoint`` /
``non_reentrant_checkpoint`` only the layer's tensors (non-tensors bound into the call), the first as it is (the
hidden states DeepSpeed partitions), every later one as a view carrying DeepSpeed's own opt-out
(``checkpointing.deepspeed``), and puts a bare returned tensor back into the layer's tuple of one.  Other calls of
DeepSpeed's function are left as they are.  docs/fixes/deepspeed-checkpoint-layer-io.md.
"""

from __future__ import annotations

from typing import Callable

from hotfix import Mechanism
from hotfix.checkpointing.deepspeed import (as_deepspeed_needs, empties_inputs, is_deepspeed_checkpoint,
                                           partitions_activations, shared_with_previous)
from hotfix.checkpointing.slot_fix import CheckpointFunctionFix, NOT_REACHED


def checkpoint_as_deepspeed_needs(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``."""
    import torch

    tensor = torch.Tensor
    previous: list = []  # weak references to the caller's later tensors the last forward handed DeepSpeed

    def deepspeed_layer_call(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        if not args or not is_deepspeed_checkpoint(wrapped):
            return wrapped(*args, **kwargs)
        function, inputs, shifted = as_deepspeed_needs(args[0], args[1:])
        if shifted and partitions_activations():
            fix.repaired("a non-tensor positional input was kept out of DeepSpeed's partitioned activations, which "
                         "move the recomputation's later inputs one place on",
                         call="a call through DeepSpeed's checkpoint function")
        if empties_inputs() and torch.is_grad_enabled() and shared_with_previous(args[0], args[1:], previous):
            fix.repaired("an input the layers share (the encoder's states, a mask) was kept whole: DeepSpeed's "
                         "partition_activations / cpu_checkpointing empty each input after its layer's forward, "
                         "and the next layer would have read it empty",
                         call="a call through DeepSpeed's checkpoint function")
        returned: list = []  # whether the layer returned a tuple of one, from its first run (the forward)

        def layer(*inputs, **keywords):
            output = function(*inputs, **keywords)
            if not returned:
                returned.append(type(output) is tuple and len(output) == 1)
            return output

        result = wrapped(layer, *inputs, **kwargs)
        if returned and returned[0] and isinstance(result, tensor):
            fix.repaired("the layer's tuple of one, returned bare by DeepSpeed's checkpoint function, was put back "
                         "into its tuple", call="a call through DeepSpeed's checkpoint function")
            return (result,)
        return result

    return deepspeed_layer_call


class DeepspeedCheckpointLayerIO(CheckpointFunctionFix):
    name = "deepspeed-checkpoint-layer-io"
    aliases = ("deepspeed-checkpoint-outputs",)  # its name until it repaired the inputs too; still accepted as an opt-out
    # every release read (0.11.2; first and last of each line 0.12 - 0.19) returns a lone output bare; the slot
    # exists from transformers 4.35
    mechanisms = (
        Mechanism("tuple-of-one-unwrapped", {"deepspeed": ">=0.11.2", "transformers": ">=4.35.0"},
                  unreached=NOT_REACHED,
                  summary="deepspeed.checkpointing.checkpoint as transformers' checkpoint function: a layer "
                          "returning a tuple of one (Whisper on 4.x) gets its tensor back bare"),
        # every release read from 0.11.2 (0.10.3 too) counts a non-tensor's saved pair as one and replaces each
        # floating-point input's data after the forward
        Mechanism("partitioned-inputs", {"deepspeed": ">=0.11.2", "transformers": ">=4.35.0"},
                  unreached=NOT_REACHED,
                  summary="its partition_activations / cpu_checkpointing: a non-tensor positional input (Whisper's "
                          "encoder) shifts the recomputation's arguments, and the inputs every layer shares (encoder "
                          "states, mask, lifted keyword tensors) are emptied after the first layer"),
    )
    symptom = ("ValueError: not enough values to unpack - transformers' layers checkpointed with "
               "deepspeed.checkpointing.checkpoint (Whisper, Bart: the layer's tuple of one comes back bare; with "
               "partition_activations also 'got multiple values for argument' or '0D and 2D')")
    upstream = ("deepspeedai/DeepSpeed activation_checkpointing/checkpointing.py (checkpoint returns all_outputs[0]; "
                "partition_activations: merge_tensors, get_partitioned_activations_for_backward)")
    fixed_in = None  # DeepSpeed 0.19.8 still unwraps, and still shifts and empties partitioned inputs

    def build_wrapper(self) -> Callable:
        return checkpoint_as_deepspeed_needs(self)


patch = DeepspeedCheckpointLayerIO()
