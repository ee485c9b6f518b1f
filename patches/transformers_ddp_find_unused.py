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
inside the others (``hotfix.relations.SLOT_ORDER``); a first input that must need grad gets an anchor (``FirstInputRule``).
docs/fixes/transformers-ddp-find-unused.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix.checkpointing.slot_fix import CheckpointFunctionFix, on_every_reached_release


def checkpoint_with_visible_parameters(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a module's checkpoint function, reporting through ``fix``.

    Built when the fix first applies (its target has imported torch by then): loading this module
    imports no torch.
    """
    import torch

    from hotfix.checkpointing.inputs import anchored, first_input_needs_grad, is_reentrant
    from hotfix.checkpointing.ddp import searching_ddp, trainable_slots, unused_reporter, with_parameters_as_inputs
    from hotfix.checkpointing.layer_call import modules_called
    from hotfix.checkpointing.unsloth import FirstInputRule

    is_grad_enabled = torch.is_grad_enabled
    first_input = FirstInputRule(fix)
    unused = unused_reporter(fix)

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
        function = with_parameters_as_inputs(function, len(inputs), slots, parameters, recomputing, unused)
        return wrapped(function, *inputs, *parameters, **kwargs)

    return expose_parameters_to_ddp


class TransformersDdpFindUnused(CheckpointFunctionFix):
    name = "transformers-ddp-find-unused"
    reentrant_only = True  # its wrapper hands every non-reentrant call on as it is
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

    def acting_while(self) -> Optional[Callable[[], Any]]:
        """Inside a DDP forward only (``checkpointing.ddp.active_ddp``, None outside one): elsewhere
        its slot stays out of the composed call, whose every read asks this without a Python frame (issue 52;
        tools/hotfix_lab/bench/wrapper_cost.py).  Inside one, the wrapper asks the rest (``searching_ddp``: find_unused_parameters,
        no static_graph, no no_sync).  Asked at the first apply, when transformers has imported torch."""
        from hotfix.checkpointing.ddp import active_ddp

        return active_ddp

    def drift(self, module: Any) -> Optional[str]:
        try:
            from hotfix.checkpointing.ddp import ddp_drift
        except Exception as exc:  # a torch without DDP: nothing this fix can read
            return f"torch.nn.parallel.DistributedDataParallel cannot be imported: {exc!r}"
        return super().drift(module) or ddp_drift()


patch = TransformersDdpFindUnused()
