"""DDP(find_unused_parameters=True) around reentrant-checkpointed layers: "mark a variable ready only once".

What breaks: with find_unused_parameters DDP searches the forward graph for the parameters it
reaches.  A reentrant checkpoint (torch's, unsloth-zoo's) runs its layer under no_grad, so the
layer's parameters are not in that graph: DDP marks them unused (ready) when backward starts,
then the recomputation's own backward gives them gradients and marks them again: "Expected to
mark a variable ready only once" (PEFT LoRA: the Trainer sets find_unused_parameters=True).

How this fixes it: inside such a DDP module's forward (not static_graph, not no_sync), a
reentrant call of a layer with trainable parameters passes them as extra checkpoint inputs; the
recomputation runs the layer with the checkpoint's detached copies in their places, so each
gradient reaches its parameter once, through the node DDP saw.  A slot (``checkpointing.slot``),
innermost (``hotfix.relations.SLOT_ORDER``); a first input that must need grad gets an anchor (``FirstInputRule``).
docs/fixes/transformers-ddp-find-unused.md.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from hotfix.checkpointing.slot_fix import CheckpointFunctionFix, on_every_reached_release


def trainable_slots(modules: List[Any]) -> List[Tuple[Any, str, Any]]:
    """``(owner, name, parameter)`` for every trainable parameter of ``modules`` and their submodules.

    A parameter held by two owners (tied weights) comes once per owner: both places get its twin.
    """
    slots, owners = [], set()
    for module in modules:
        for owner in module.modules():
            if id(owner) in owners:
                continue
            owners.add(id(owner))
            for name, parameter in owner._parameters.items():
                if parameter is not None and parameter.requires_grad:
                    slots.append((owner, name, parameter))
    return slots


def with_parameters_as_inputs(function: Callable, count: int, slots: List[Tuple[Any, str, Any]],
                              parameters: Tuple[Any, ...], recomputing: Callable[[], None]) -> Callable:
    """``function`` for a checkpoint call whose inputs are its ``count`` inputs followed by ``parameters``.

    The checkpoint's forward hands the parameters themselves: the layer runs as it is.  The
    recomputation hands their detached copies: the layer runs with each copy in its parameter's place
    (``owner._parameters``, restored after the call), so the recomputation's backward accumulates into
    the copies, which the checkpoint returns as the gradients of its parameter inputs.  ``recomputing``
    is called then: where upstream's recomputation would have marked those parameters ready again.
    Shows the layer as ``function`` does (``checkpointing.layer_call``).
    """
    from hotfix.checkpointing.layer_call import ShownCall  # imports torch: only when called

    def run_with_parameters(*all_inputs):
        given = all_inputs[count:]
        inputs = all_inputs[:count]
        if all(a is b for a, b in zip(given, parameters)):
            return function(*inputs)
        recomputing()
        twins = {id(parameter): twin for parameter, twin in zip(parameters, given)}
        for owner, name, parameter in slots:
            owner._parameters[name] = twins[id(parameter)]
        try:
            return function(*inputs)
        finally:
            for owner, name, parameter in slots:
                owner._parameters[name] = parameter

    return ShownCall(run_with_parameters, function)


def checkpoint_with_visible_parameters(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``.

    Built when the fix first applies (its target has imported torch by then): loading this module
    imports no torch.
    """
    import torch

    from hotfix.checkpointing.inputs import anchored, first_input_needs_grad, is_reentrant
    from hotfix.checkpointing.ddp import searching_ddp
    from hotfix.checkpointing.layer_call import modules_called
    from hotfix.checkpointing.unsloth import FirstInputRule

    is_grad_enabled = torch.is_grad_enabled
    first_input = FirstInputRule(fix)

    def recomputing() -> None:
        fix.repaired("a checkpointed layer's parameters became checkpoint inputs, seen by DDP's search for unused ones")

    def expose_parameters_to_ddp(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        if (not args or searching_ddp() is None or not is_grad_enabled()
                or not is_reentrant(wrapped, kwargs)):
            return wrapped(*args, **kwargs)
        function, inputs = args[0], args[1:]
        modules = modules_called(function)
        if not modules:  # said once: the one case this fix leaves to upstream's error
            fix.warn_once("no layer", f"a checkpointed call under DDP(find_unused_parameters=True) whose layer it "
                                      f"cannot find ({function!r:.80}) is left as it is: if it has trainable "
                                      f"parameters, DDP fails with \"Expected to mark a variable ready only once\"")
        slots = trainable_slots(modules)
        if not slots:
            return wrapped(*args, **kwargs)
        parameters = tuple({id(p): p for _, _, p in slots}.values())
        if not first_input_needs_grad(inputs) and first_input.needs_grad_first():
            function, inputs = anchored(function, inputs, first=True)
        function = with_parameters_as_inputs(function, len(inputs), slots, parameters, recomputing)
        return wrapped(function, *inputs, *parameters, **kwargs)

    return expose_parameters_to_ddp


def ddp_drift() -> Optional[str]:
    """Why torch's DDP no longer tells which DDP module's forward is running, or None."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception as exc:  # a torch without it: nothing this fix can read
        return f"torch.nn.parallel.DistributedDataParallel cannot be imported: {exc!r}"
    if not hasattr(DistributedDataParallel, "_active_ddp_module"):
        return "DistributedDataParallel._active_ddp_module (the module whose forward runs) is missing"
    return None


class TransformersDdpFindUnused(CheckpointFunctionFix):
    name = "transformers-ddp-find-unused"
    # torch's DDP reducer has the defect on every release measured (2.13.0, 2.14.1; none fixes it): the
    # range is transformers' (where the hook exists); the drift check reads torch's side.
    mechanisms = (
        on_every_reached_release("ddp-hidden-parameters",
            "DDP(find_unused_parameters=True) with reentrant checkpointing: the layers' parameters are marked "
            "unused, then ready a second time by the recomputation (LoRA with PEFT)"),
    )
    symptom = (
        "RuntimeError: Expected to mark a variable ready only once - DDP with find_unused_parameters=True "
        "and gradient checkpointing (use_reentrant=True; PEFT LoRA under Trainer / accelerate / TRL)"
    )
    upstream = ("pytorch/pytorch DDP reducer with reentrant torch.utils.checkpoint (huggingface/peft#313, "
                "huggingface/trl#921, huggingface/accelerate#3536)")
    fixed_in = None  # torch 2.14.1 still fails; upstream's answer is non-reentrant checkpointing

    def build_wrapper(self) -> Callable:
        return checkpoint_with_visible_parameters(self)

    def drift(self, module: Any) -> Optional[str]:
        return super().drift(module) or ddp_drift()


patch = TransformersDdpFindUnused()
