"""torch's reentrant checkpoint entered directly, under DDP(find_unused_parameters=True): "ready only once".

What breaks: as in transformers-ddp-find-unused, a reentrant checkpoint runs its layer under no_grad, so DDP's
search for unused parameters does not reach the layer's parameters: it marks them ready when backward starts, and
the recomputation marks them again ("Expected to mark a variable ready only once").  That fix acts on the calls
through transformers' checkpoint function; a plain ``nn.Module`` whose blocks call
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)``, or a Hub model's own modeling code calling
a ``checkpoint`` it imported at module level, never passes there.

How this fixes it: ``CheckpointFunction.apply`` (where every reentrant call of torch's checkpoint ends, however
``checkpoint`` was imported) is wrapped on the class; inside a DDP forward that searches for unused parameters
(not ``static_graph``, not ``no_sync``), a call whose layer has trainable parameters not already among its inputs
passes them as extra inputs (``checkpointing.ddp``): each gradient reaches its parameter once, through the node DDP
saw.  Revert deletes the class attribute.  docs/fixes/torch-ddp-find-unused.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.code import code_objects

#: torch's checkpoint module and its reentrant autograd Function
CHECKPOINT_MODULE = "torch.utils.checkpoint"
FUNCTION_CLASS = "CheckpointFunction"


def apply_with_visible_parameters(fix: Patch) -> Callable:
    """The wrapt wrapper of ``CheckpointFunction.apply(function, preserve_rng_state, *inputs)``.

    Applied while ``import torch`` is still running (torch imports its checkpoint module itself): what the wrapper
    needs of torch, DDP and dynamo is looked up at its first call, by which time that import has finished.
    """
    bound: list = []  # (searching_ddp, trainable_slots, with_parameters_as_inputs, modules_called, ...) once known

    def recomputing() -> None:
        fix.repaired("a layer checkpointed by torch's reentrant checkpoint, called directly, had its parameters "
                     "become checkpoint inputs, seen by DDP's search for unused ones")

    def helpers() -> tuple:
        if not bound:
            import torch

            from hotfix.checkpointing.code import keep_dynamo_out_of_hotfix
            from hotfix.checkpointing.ddp import (ddp_drift, searching_ddp, trainable_slots, unused_reporter,
                                                  with_parameters_as_inputs)
            from hotfix.checkpointing.layer_call import modules_called

            keep_dynamo_out_of_hotfix()  # its compiler must not trace hotfix's frames
            drifted = ddp_drift()
            if drifted:  # searching_ddp() then never sees a DDP forward: every call is left as it is
                fix.warn_once("ddp drift", f"{drifted}: calls under DDP are left as upstream makes them")
            bound.append((searching_ddp, trainable_slots, with_parameters_as_inputs, modules_called,
                          torch.is_grad_enabled, torch.compiler.is_compiling, unused_reporter(fix)))
        return bound[0]

    def expose_parameters_to_ddp(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        (searching_ddp, trainable_slots, with_parameters_as_inputs, modules_called, is_grad_enabled, is_compiling,
         unused) = helpers()
        if kwargs or len(args) < 2 or searching_ddp() is None or not is_grad_enabled() or is_compiling():
            return wrapped(*args, **kwargs)
        function, preserve, inputs = args[0], args[1], args[2:]
        present = {id(item) for item in inputs}
        # transformers-ddp-find-unused has passed them already where the call came through transformers
        slots = [slot for slot in trainable_slots(modules_called(function)) if id(slot[2]) not in present]
        if not slots:
            return wrapped(*args, **kwargs)
        parameters = tuple({id(p): p for _, _, p in slots}.values())
        function = with_parameters_as_inputs(function, len(inputs), slots, parameters, recomputing, unused)
        return wrapped(function, preserve, *inputs, *parameters)

    return expose_parameters_to_ddp


class TorchDdpFindUnused(Patch):
    name = "torch-ddp-find-unused"
    targets = (CHECKPOINT_MODULE,)
    # torch's DDP reducer has the defect on every release measured (docs/census/ddp.md: 2.4 - 2.15); hotfix's
    # census does not reach below 2.4.
    mechanisms = (
        Mechanism("ddp-direct-checkpoint", {"torch": ">=2.4.0"}, unreached={"torch": "<2.4.0"},
                  summary="torch.utils.checkpoint.checkpoint(..., use_reentrant=True) called directly (a plain "
                          "module's blocks, a Hub model's own modeling code) under DDP(find_unused_parameters=True)"),
    )
    symptom = ("RuntimeError: Expected to mark a variable ready only once - DDP with find_unused_parameters=True "
               "and torch.utils.checkpoint.checkpoint(..., use_reentrant=True) called by the model itself")
    upstream = "pytorch/pytorch DDP reducer with reentrant torch.utils.checkpoint (pytorch/pytorch#43259)"
    fixed_in = None  # torch 2.13.0 still fails; upstream's answer is non-reentrant checkpointing

    def __init__(self) -> None:
        super().__init__()
        self._wrapper: Optional[Callable] = None

    def drift(self, module: Any) -> Optional[str]:
        # Read, not imported: torch's own import is running (DDP's class is checked again at each call)
        function_class = module.__dict__.get(FUNCTION_CLASS)
        if not isinstance(function_class, type) or function_class.__module__ != CHECKPOINT_MODULE:
            return f"{FUNCTION_CLASS} is missing or not torch's own (another library replaced it)"
        checkpoint = getattr(module, "checkpoint", None)
        for _ in range(4):  # torch decorates it (dynamo's disable): the function under the decorators
            checkpoint = getattr(checkpoint, "__wrapped__", checkpoint)
        if not any(FUNCTION_CLASS in code.co_names for code in code_objects(checkpoint)):
            return f"checkpoint() no longer calls {FUNCTION_CLASS}.apply"
        return None

    def _apply(self, module: Any) -> None:
        if self._wrapper is None:
            self._wrapper = apply_with_visible_parameters(self)
        self.wrap(getattr(module, FUNCTION_CLASS), "apply", self._wrapper)


patch = TorchDdpFindUnused()
