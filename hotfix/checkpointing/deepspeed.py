"""What the fixes rely on in DeepSpeed's activation checkpointing (``deepspeed.checkpointing``).

Its ``checkpoint`` / ``non_reentrant_checkpoint`` take the layer's inputs to be that layer's alone: with the
``"activation_checkpointing"`` options ``partition_activations`` or ``cpu_checkpointing`` (each alone or both) it keeps
a partition or a host copy of each floating-point input and, after the layer's forward, sets the input's own
``.data`` to an empty tensor (``get_partitioned_activations_for_backward``, 0.12.6+, flattened in place before;
``get_cpu_activations_for_backward``; on an accelerator with streams ``get_offloaded_activations_for_backward``), and
with ``partition_activations`` it saves a non-tensor input as a pair its backward counts as one.  transformers
hands every decoder layer the same encoder states and mask (positionally on 5.x; on 4.x by keyword, lifted into the
inputs by ``checkpointing.inputs``): emptied, the next layer reads a 0-d tensor.  Read in DeepSpeed 0.11.2 - 0.19.8
(docs/fixes/deepspeed-checkpoint-layer-io.md).  Loading this imports no torch.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable, Sequence, Tuple

#: DeepSpeed's activation checkpointing module (``deepspeed.checkpointing``) and its checkpoint functions
DEEPSPEED_CHECKPOINTING = "deepspeed.runtime.activation_checkpointing.checkpointing"
FUNCTIONS = ("checkpoint", "non_reentrant_checkpoint")
#: DeepSpeed's own opt-out (``is_activation_to_checkpoint``, from 0.16): a tensor carrying it is neither partitioned,
#: copied nor emptied, only kept as it is
OPT_OUT = "no_checkpointing"


def is_deepspeed_checkpoint(stored: Any) -> bool:
    """Is ``stored`` (what transformers holds: a function, or a partial of one) DeepSpeed's checkpoint function?"""
    function = stored.func if isinstance(stored, functools.partial) else stored
    return getattr(function, "__module__", None) == DEEPSPEED_CHECKPOINTING and getattr(
        function, "__name__", None) in FUNCTIONS


def partitions_activations() -> bool:
    """Are DeepSpeed's ``partition_activations`` on (its module state, set by ``deepspeed.checkpointing.configure``)?"""
    module = sys.modules.get(DEEPSPEED_CHECKPOINTING)
    return bool(getattr(module, "PARTITION_ACTIVATIONS", False))


def empties_inputs() -> bool:
    """Does DeepSpeed empty a layer's floating-point inputs after its forward (``partition_activations`` or
    ``cpu_checkpointing`` on: its module state)?"""
    module = sys.modules.get(DEEPSPEED_CHECKPOINTING)
    return bool(getattr(module, "PARTITION_ACTIVATIONS", False) or getattr(module, "CPU_CHECKPOINT", False))


def would_be_emptied(tensor: Any) -> bool:
    """Would DeepSpeed empty ``tensor`` after the forward where it empties inputs (``is_activation_to_checkpoint``:
    floating point, at least one element per model-parallel rank, not carrying the opt-out)?"""
    module = sys.modules.get(DEEPSPEED_CHECKPOINTING)
    return (tensor.is_floating_point() and tensor.numel() >= getattr(module, "mp_size", 1)
            and not getattr(tensor, OPT_OUT, False))


def shared_with_previous(function: Any, inputs: Sequence[Any], previous: list) -> bool:
    """Was a later tensor of this call (the caller's own: not one hotfix's rewrites added, ``inputs_added``) handed to
    DeepSpeed by the previous forward call too, as one DeepSpeed would have emptied then?  Then, without hotfix, this
    layer would have read it empty.  ``previous`` (weak references) becomes this call's."""
    from hotfix.checkpointing.layer_call import inputs_added  # not at load, as below
    from torch import is_tensor

    added = inputs_added(function)
    later = [item for item in inputs if is_tensor(item)][1:]  # the first goes to DeepSpeed as it is, by design
    candidates = [tensor for tensor in later if id(tensor) not in added and would_be_emptied(tensor)]
    shared = any(reference() is tensor for reference in previous for tensor in candidates)
    previous[:] = [weakref.ref(tensor) for tensor in candidates]
    return shared


def as_deepspeed_needs(function: Callable, inputs: Sequence[Any]) -> Tuple[Callable, Tuple[Any, ...], bool]:
    """``(function', tensors, shifted)``: a transformers layer call put the way DeepSpeed's checkpoint handles it.

    Only tensors are handed to DeepSpeed: a non-tensor positional input (Whisper's encoder passes ``None``) is bound
    into ``function'``, since with ``partition_activations`` DeepSpeed saves it as a pair of non-tensors that its
    backward counts as one: the recomputation gets an extra positional argument, and each tensor after it moves one
    place on (``shifted``: a tensor follows a non-tensor, so that recomputation would be certain to differ).  The
    first tensor (the layer's hidden states) goes as it is: DeepSpeed may partition it.  Every later one is the
    caller's, often every layer's (a mask, the encoder's states, a tensor hotfix lifted out of the ``partial``): it
    goes as a view carrying DeepSpeed's opt-out, so DeepSpeed keeps it as it is, or (before the opt-out) partitions
    and empties the view, never the caller's tensor (``.data`` set on a view leaves its base alone); its gradient
    reaches the tensor through the view.  The forward gets the caller's objects back (the rewrites before this one
    check their identity); the recomputation's detached copies pass on.
    """
    from hotfix.checkpointing.layer_call import ShownCall  # not at load: the DeepSpeed fix's loading imports no torch
    from torch import is_tensor

    slots = [index for index, item in enumerate(inputs) if is_tensor(item)]
    originals = [inputs[index] for index in slots]
    handed = (*originals[:1], *(_opted_out_view(tensor) for tensor in originals[1:]))
    template = list(inputs)

    def run_as_called(*tensors):
        if len(tensors) == len(handed) and all(item is given for item, given in zip(tensors, handed)):
            tensors = originals  # the forward: the caller's own objects
        call = list(template)
        for index, tensor in zip(slots, tensors):
            call[index] = tensor
        return function(*call)

    shifted = bool(slots) and slots[-1] >= len(slots)  # the last tensor is not where a run of tensors only puts it
    return ShownCall(run_as_called, function), handed, shifted


def _opted_out_view(tensor: Any) -> Any:
    view = tensor.view_as(tensor)
    setattr(view, OPT_OUT, True)
    return view
