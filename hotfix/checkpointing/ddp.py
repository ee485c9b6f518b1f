"""Is a DistributedDataParallel forward running that will search its graph for unused parameters?

The one answer for transformers-ddp-find-unused and torch-ddp-find-unused (which act only there) and
unsloth-zoo-nonreentrant-offload (which makes a call reentrant there only where that fix is applied).
DDP searches when built with ``find_unused_parameters=True``, without ``static_graph``, and outside
``no_sync()`` (no search that step: the parameters' hooks are not awaited).  Which DDP module's forward
runs is ``DistributedDataParallel._active_ddp_module``, set by DDP around its module's forward (where it
is missing, the DDP fix's drift check says so; here it reads as no DDP forward).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Tuple

from torch.nn.parallel import DistributedDataParallel

__all__ = ["active_ddp", "ddp_drift", "searching_ddp", "trainable_slots", "unused_reporter", "with_parameters_as_inputs"]


#: where DDP keeps the module whose forward runs (a class attribute; None outside any DDP forward)
ACTIVE = "_active_ddp_module"

#: the DDP module whose forward is running, else None: one C call, no Python frame (asked at every read of a
#: checkpoint function by transformers-ddp-find-unused's slot)
active_ddp: Callable[[], Optional[Any]] = functools.partial(getattr, DistributedDataParallel, ACTIVE, None)


def searching_ddp() -> Optional[Any]:
    """The DDP module whose forward is running, where it will search the graph for unused parameters; else None."""
    ddp = active_ddp()
    if ddp is None or not getattr(ddp, "find_unused_parameters", False) or getattr(ddp, "static_graph", False):
        return None
    return ddp if getattr(ddp, "require_backward_grad_sync", True) else None


def trainable_slots(modules: List[Any]) -> List[Tuple[Any, str, Any]]:
    """``(owner, name, parameter)`` for every trainable parameter of ``modules`` and their submodules, in the order
    ``Module.modules()`` visits them, each submodule once.

    A parameter held by two owners (tied weights) comes once per owner: both places get its twin.  Walked over
    ``_modules`` with a list, not through ``modules()``: asked at every checkpointed call under a searching DDP, and
    ``named_modules``' nested generators were most of that call's cost (20 of 23.5 µs for a LoRA decoder layer of 33
    modules, tools/hotfix_lab/bench/ddp_cost.py).
    """
    slots, owners, pending = [], set(), list(reversed(modules))
    while pending:
        owner = pending.pop()
        key = id(owner)
        if owner is None or key in owners:  # a child set to None is no module
            continue
        owners.add(key)
        parameters = owner._parameters
        if parameters:
            for name, parameter in parameters.items():
                if parameter is not None and parameter.requires_grad:
                    slots.append((owner, name, parameter))
        children = owner._modules
        if children:
            pending.extend(reversed(children.values()))
    return slots


def with_parameters_as_inputs(function: Callable, count: int, slots: List[Tuple[Any, str, Any]],
                              parameters: Tuple[Any, ...], recomputing: Callable[[], None],
                              unused: Optional[Callable[[List[str]], None]] = None,
                              maybe_run: frozenset = frozenset()) -> Callable:
    """``function`` for a checkpoint call whose inputs are its ``count`` inputs followed by ``parameters``.

    The checkpoint's forward hands the parameters themselves: the layer runs as it is.  The
    recomputation hands their detached copies: the layer runs with each copy in its parameter's place
    (``owner._parameters``, restored after the call), so the recomputation's backward accumulates into
    the copies, which the checkpoint returns as the gradients of its parameter inputs.  ``recomputing``
    is called then: where upstream's recomputation would have marked those parameters ready again.
    ``unused``, where given, hears at the end of that backward the names of the parameters whose copies got no
    gradient (a MoE expert no token reached): DDP's search counted them as used (:func:`unused_reporter`); not of
    those in ``maybe_run`` (ids of parameters of blocks a segment runner holds but may not run: another call runs
    them).
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
        if unused is not None:
            _after_backward(lambda: unused(_names(function, [(owner, name) for owner, name, parameter in slots
                                                             if twins[id(parameter)].grad is None
                                                             and id(parameter) not in maybe_run])))
        try:
            return function(*inputs)
        finally:
            for owner, name, parameter in slots:
                owner._parameters[name] = parameter

    return ShownCall(run_with_parameters, function, tuple(parameters))


def _names(function: Callable, slots: List[Tuple[Any, str]]) -> List[str]:
    """``layer class.path.to.parameter`` for each ``(owner, name)`` of the layer ``function`` runs."""
    if not slots:
        return []
    from hotfix.checkpointing.layer_call import layer_of

    layer = layer_of(function)
    paths = {id(module): path for path, module in layer.named_modules()} if layer is not None else {}
    prefix = type(layer).__name__ if layer is not None else "?"
    return [".".join(part for part in (prefix, paths.get(id(owner), type(owner).__name__), name) if part)
            for owner, name in slots]


def _after_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the backward running now has finished (where torch's engine lets a caller queue one:
    DDP queues its own that way; elsewhere nothing is run)."""
    from torch.autograd import Variable

    try:
        Variable._execution_engine.queue_callback(callback)
    except Exception:  # no backward running, or an engine without the call: nothing to report
        pass


def unused_reporter(fix: Any) -> Callable[[List[str]], None]:
    """What tells the user, once, that DDP's advice to turn ``find_unused_parameters`` off does not hold.

    A fix that makes a checkpointed layer's parameters checkpoint inputs makes every one of them reachable to DDP's
    search, also those the step does not use; where the search then finds nothing unused, DDP advises turning the
    flag off, and following that advice fails at the next step.  hotfix cannot take DDP's line back (torch prints it
    from C++); this line, said where a parameter hotfix passed got no gradient, is why the flag must stay.
    """
    def report(names: List[str]) -> None:
        if names:
            fix.warn_once("unused parameters", (
                f"{len(names)} parameter(s) of checkpointed layers got no gradient in a step (e.g. {names[0]}); DDP's "
                f"search cannot tell under reentrant checkpointing, where hotfix hands it every parameter of such a "
                f"layer: if DDP said it \"did not find any unused parameters\" and advised turning "
                f"find_unused_parameters off, keep it on: this model leaves parameters unused in some steps, and "
                f"without the flag DDP fails (\"Expected to have finished reduction in the prior iteration\")"))

    return report


def ddp_drift() -> Optional[str]:
    """Why torch's DDP no longer tells which DDP module's forward is running, or None."""
    if not hasattr(DistributedDataParallel, ACTIVE):
        return f"DistributedDataParallel.{ACTIVE} (the module whose forward runs) is missing"
    return None
