"""torch's reentrant checkpoint (or unsloth's in its place) entered directly, under DDP(find_unused_parameters=True).

What breaks: as in transformers-ddp-find-unused, a reentrant checkpoint runs its layer under no_grad: DDP's search
for unused parameters misses the layer's parameters, marks them ready when backward starts, and the recomputation
marks them again ("Expected to mark a variable ready only once").  That fix acts on calls through transformers'
checkpoint function; a plain module's blocks calling ``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)``,
a Hub model's code calling a ``checkpoint`` imported at module level, unsloth's own model code (its smart gradient
checkpointing swaps unsloth-zoo's ``UnslothCheckpointFunction`` in for torch's class) never pass there.

How this fixes it: ``apply`` of both classes (where every reentrant call ends, however ``checkpoint`` was imported)
is wrapped on the class; inside a DDP forward that searches (not ``static_graph``, not ``no_sync``), a layer's
trainable parameters not already inputs become extra inputs (``checkpointing.ddp``): each gradient reaches its
parameter once, through the node DDP saw; behind a frozen first input on an unsloth-zoo release whose backward then
returns one gradient, after a 0-byte anchor (``FirstInputRule``).  Revert deletes the class attributes.
docs/fixes/torch-ddp-find-unused.md.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.code import code_objects
from hotfix.checkpointing.torch_checkpoint import FUNCTION_CLASS
from hotfix.checkpointing.torch_checkpoint import MODULE as CHECKPOINT_MODULE  # torch's checkpoint module
from hotfix.checkpointing.unsloth import CLASS_NAME as UNSLOTH_CLASS
from hotfix.checkpointing.unsloth import MODULE as UNSLOTH_MODULE
from hotfix.checkpointing.unsloth import checkpoint_function_drift

#: where unsloth's swap keeps torch's own class once it has put UnslothCheckpointFunction in its place
SWAPPED_OUT = "_old_CheckpointFunction"
#: torch's checkpoint(), and where unsloth keeps it once its own is in its place
TORCH_CHECKPOINT_NAMES = ("checkpoint", "_unsloth_pristine_checkpoint", "_old_checkpoint")


def torch_function_class(module: Any) -> Any:
    """torch's own ``CheckpointFunction`` of ``module`` (torch.utils.checkpoint), also after unsloth's swap; or None.

    Read from the module's ``__dict__``, not imported: torch's own import may still be running.
    """
    for name in (FUNCTION_CLASS, SWAPPED_OUT):
        found = module.__dict__.get(name)
        if isinstance(found, type) and found.__module__ == CHECKPOINT_MODULE:
            return found
    return None


class _Bound(NamedTuple):
    """What the wrapper needs of torch, DDP and dynamo, looked up at its first call."""

    searching_ddp: Callable
    trainable_slots: Callable
    with_parameters_as_inputs: Callable
    modules_maybe_called: Callable
    is_grad_enabled: Callable
    is_compiling: Callable
    unused: Callable
    anchor_first: Callable
    active_ddp: Callable


def apply_with_visible_parameters(fix: Patch) -> Callable:
    """The wrapt wrapper of ``CheckpointFunction.apply(function, preserve_rng_state, *inputs)``.

    Applied while ``import torch`` is still running (torch imports its checkpoint module itself): what the wrapper
    needs of torch, DDP and dynamo is looked up at its first call, by which time that import has finished.
    """
    bound: list = []  # the _Bound, once known

    def recomputing() -> None:
        fix.repaired("a layer's parameters became checkpoint inputs, seen by DDP's search for unused ones",
                     call="a reentrant checkpoint entered directly (torch's or unsloth-zoo's class, not through "
                          "transformers' checkpoint function)")

    def helpers() -> tuple:
        if not bound:
            import torch

            from hotfix.checkpointing.code import keep_dynamo_out_of_hotfix
            from hotfix.checkpointing.ddp import (active_ddp, ddp_drift, searching_ddp, trainable_slots,
                                                  unused_reporter, with_parameters_as_inputs)
            from hotfix.checkpointing.inputs import anchored, first_input_needs_grad
            from hotfix.checkpointing.layer_call import modules_maybe_called
            from hotfix.checkpointing.unsloth import FirstInputRule

            keep_dynamo_out_of_hotfix()  # its compiler must not trace hotfix's frames
            drifted = ddp_drift()
            if drifted:  # searching_ddp() then never sees a DDP forward: every call is left as it is
                fix.warn_once("ddp drift", f"{drifted}: calls under DDP are left as upstream makes them")
            first_input = FirstInputRule(fix)

            def anchor_first(function: Callable, inputs: tuple) -> tuple:
                if not first_input_needs_grad(inputs) and first_input.needs_grad_first():
                    return anchored(function, inputs, first=True)
                return function, inputs

            bound.append(_Bound(searching_ddp, trainable_slots, with_parameters_as_inputs, modules_maybe_called,
                                torch.is_grad_enabled, torch.compiler.is_compiling, unused_reporter(fix), anchor_first,
                                active_ddp))
        return bound[0]

    def idle(instance, args, kwargs) -> bool:  # outside a searching DDP forward (hotfix.junction)
        # every checkpointed call asks this: outside any DDP forward answered by one C call (active_ddp), without
        # the helpers() frame once bound
        found = bound[0] if bound else helpers()
        return found.active_ddp() is None or found.searching_ddp() is None

    def expose_parameters_to_ddp(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        (searching_ddp, trainable_slots, with_parameters_as_inputs, modules_maybe_called, is_grad_enabled,
         is_compiling, unused, anchor_first, _) = helpers()
        if idle(instance, args, kwargs) or kwargs or len(args) < 2 or not is_grad_enabled() or is_compiling():
            return wrapped(*args, **kwargs)
        function, preserve, inputs = args[0], args[1], args[2:]
        present = {id(item) for item in inputs}
        # transformers-ddp-find-unused has passed them already where the call came through transformers
        modules, in_sequences = modules_maybe_called(function)
        slots = [slot for slot in trainable_slots(modules) if id(slot[2]) not in present]
        if not slots:
            return wrapped(*args, **kwargs)
        parameters = tuple({id(p): p for _, _, p in slots}.values())
        maybe_run = frozenset(id(p) for _, _, p in trainable_slots(in_sequences)) if in_sequences else frozenset()
        function, inputs = anchor_first(function, inputs)
        function = with_parameters_as_inputs(function, len(inputs), slots, parameters, recomputing, unused, maybe_run)
        return wrapped(function, preserve, *inputs, *parameters)

    expose_parameters_to_ddp.idle = idle
    return expose_parameters_to_ddp


def _called_code(module: Any, function: Any) -> list:
    """The code objects of ``function`` and of the functions of ``module`` it calls by name (torch 2.14 moved the
    reentrant call from ``checkpoint()`` into ``_checkpoint_impl()``)."""
    found = list(code_objects(function))
    for name in {name for code in found for name in code.co_names}:
        callee = module.__dict__.get(name)
        ours = getattr(callee, "__module__", None) == CHECKPOINT_MODULE
        if callable(callee) and not isinstance(callee, type) and ours:
            found += code_objects(callee)
    return found


class TorchDdpFindUnused(Patch):
    name = "torch-ddp-find-unused"
    targets = (CHECKPOINT_MODULE, UNSLOTH_MODULE)
    # torch's DDP reducer has the defect on every release measured (docs/census/ddp.md: 2.4 - 2.15); hotfix's
    # census does not reach below 2.4.  unsloth-zoo: every release with UnslothCheckpointFunction (reentrant).
    mechanisms = (
        Mechanism("ddp-direct-checkpoint", {"torch": ">=2.4.0"}, unreached={"torch": "<2.4.0"},
                  summary="torch.utils.checkpoint.checkpoint(..., use_reentrant=True) called directly (a plain "
                          "module's blocks, a Hub model's own modeling code) under DDP(find_unused_parameters=True)"),
        Mechanism("ddp-direct-unsloth", {"unsloth-zoo": ">=2024.11.6"},
                  summary="the same calls after unsloth's smart gradient checkpointing swapped in its "
                          "UnslothCheckpointFunction (unsloth's own model code calls torch's checkpoint directly)"),
    )
    symptom = ("RuntimeError: Expected to mark a variable ready only once - DDP with find_unused_parameters=True "
               "and torch.utils.checkpoint.checkpoint(..., use_reentrant=True) called by the model itself")
    upstream = "pytorch/pytorch DDP reducer with reentrant torch.utils.checkpoint (pytorch/pytorch#43259)"
    fixed_in = None  # torch 2.13.0 still fails; upstream's answer is non-reentrant checkpointing

    def drift(self, module: Any) -> Optional[str]:
        if module.__name__ == UNSLOTH_MODULE:
            return checkpoint_function_drift(module)
        # Read, not imported: torch's own import is running (DDP's class is checked again at each call)
        if torch_function_class(module) is None:
            return f"{FUNCTION_CLASS} is missing or not torch's own (another library replaced it)"
        checkpoint = None
        for name in TORCH_CHECKPOINT_NAMES:  # torch's own function, also where unsloth has put its own in its place
            found = module.__dict__.get(name)
            for _ in range(4):  # torch decorates it (dynamo's disable): the function under the decorators
                found = getattr(found, "__wrapped__", found)
            if getattr(found, "__module__", None) == CHECKPOINT_MODULE:
                checkpoint = found
                break
        if not any(FUNCTION_CLASS in code.co_names for code in _called_code(module, checkpoint)):
            return f"checkpoint() no longer calls {FUNCTION_CLASS}.apply"
        return None

    def _apply(self, module: Any) -> None:
        if module.__name__ == UNSLOTH_MODULE:
            self.join(getattr(module, UNSLOTH_CLASS), "apply", self.wrapper)
        else:
            self.join(torch_function_class(module), "apply", self.wrapper)

    def build_wrapper(self) -> Callable:
        return apply_with_visible_parameters(self)  # one object on both apply's


patch = TorchDdpFindUnused()
