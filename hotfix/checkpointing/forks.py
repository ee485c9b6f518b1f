"""Calling a fork of unsloth's first offloaded checkpointer so that every input and output is connected.

LlamaFactory (``use_unsloth_gc``) and axolotl (``gradient_checkpointing: offload`` / ``offload_disk``)
carry copies of the ``torch.autograd.Function`` unsloth published in 2024: ``apply(forward_function,
hidden_states, *args)`` keeps ``hidden_states`` on the host (or disk), runs the layer without grad, and
in backward recomputes ``forward_function(hidden_states', *args)`` and returns a gradient for
``hidden_states`` alone.  Every other tensor needing grad (``args``, or bound in the ``partial`` that
transformers >= 4.52 passes) is recomputed as the original object, its history walked again inside the
backward ("Trying to backward through the graph a second time"), and gets no gradient through the
node; a layer returning several values is handed one gradient too few (the backward takes one);
some copies unpack ``(output,) = ...`` and fail on a layer that returns a tensor.

:func:`checkpoint_through` makes the call so that none of that can happen, without touching the
fork's Function (its offload stays): closure tensors are lifted (``checkpointing.inputs``); the fork
gets a layer call that takes and returns exactly what it handles (``hidden_states`` in, a 1-tuple
out); three small relay Functions carry the rest around it.  ``_Gather`` joins the other inputs to
``hidden_states`` on the way in: in the recomputation the layer gets detached twins of them, whose
gradients ``_Gather``'s backward (which runs after the fork's) returns.  ``_Scatter`` connects the
layer's other outputs (computed in the fork's forward, without grad) behind its first, keeping the
gradients that reach them; ``_Inject`` hands those gradients to the recomputed outputs inside the
fork's own backward pass.  docs/fixes/llamafactory-unsloth-gc.md, docs/fixes/axolotl-offload-checkpoint.md.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch

from hotfix.checkpointing.inputs import lift_closure_tensors


class _Call:
    """One checkpointed call's state, shared by the layer call the fork gets and the three relays."""

    def __init__(self, function: Callable, slots: Sequence[int]) -> None:
        self.function = function
        self.slots = list(slots)  # positions (in the fork's ``args``) of the inputs needing grad
        self.twins: List[Optional[torch.Tensor]] = [None] * len(self.slots)
        self.layout: Any = None  # "tensor", a tuple's type, or None: an output the fork gets unchanged
        self.others: tuple = ()  # the forward's outputs after the first
        self.connected: List[int] = []  # positions in ``others`` connected through _Scatter
        self.other_grads: Optional[List[Optional[torch.Tensor]]] = None
        self.first_unused = False  # the loss used only the other outputs: the first gets no gradient, not zeros

    def run(self, hidden: torch.Tensor, *args: Any) -> Any:
        """The layer call the fork's Function is given: its forward runs it without grad, its backward with."""
        recomputing = torch.is_grad_enabled()
        if recomputing and self.slots:
            args = list(args)
            for k, slot in enumerate(self.slots):
                twin = args[slot].detach().requires_grad_(True)
                args[slot] = self.twins[k] = twin
        output = self.function(hidden, *args)
        if not recomputing:
            if isinstance(output, torch.Tensor):
                self.layout = "tensor"
            elif isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                self.layout, self.others = type(output), tuple(output[1:])
            else:  # an output whose first value is no tensor: the fork gets it as it is (its own behaviour)
                return output
        elif self.layout is None:
            return output
        first = output if self.layout == "tensor" else output[0]
        if recomputing and self.other_grads is not None:
            first = _Inject.apply(self, first, *(output[1 + j] for j in self.connected))
        return (first,)

    def finish(self, result: Any) -> Any:
        """What the layer returned, from the fork's result: its first value with the others connected behind it."""
        if self.layout is None:
            return result
        first = result[0]
        if self.layout == "tensor":
            return first
        others = list(self.others)
        self.connected = [j for j, value in enumerate(others)
                          if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())]
        if self.connected and first.requires_grad:
            joined = _Scatter.apply(self, first, *(others[j] for j in self.connected))
            first = joined[0]
            for j, value in zip(self.connected, joined[1:]):
                others[j] = value
        else:
            self.connected = []
        items = (first, *others)
        try:
            return self.layout(*items) if hasattr(self.layout, "_fields") else self.layout(items)
        except Exception:  # a tuple subclass with a constructor of its own
            return items


class _Gather(torch.autograd.Function):
    """``hidden_states`` unchanged; its backward returns the recomputed twins' gradients for the other inputs."""

    @staticmethod
    def forward(ctx, call, hidden, *extras):
        ctx.call = call
        ctx.set_materialize_grads(False)  # hidden_states that got no gradient pass None on, never zeros
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        call, ctx.call = ctx.call, None
        twins, call.twins = call.twins, [None] * len(call.twins)
        grads = [twin.grad if twin is not None else None for twin in twins]
        return (None, grad if ctx.needs_input_grad[1] else None, *grads)


class _Scatter(torch.autograd.Function):
    """The layer's first output and its others, connected; keeps the gradients that reach the others."""

    @staticmethod
    def forward(ctx, call, first, *others):
        ctx.call = call
        ctx.first = (first.shape, first.dtype, first.device)
        ctx.set_materialize_grads(False)  # an output the loss does not use: None, never zeros
        return (first.view_as(first), *(value.view_as(value) for value in others))

    @staticmethod
    def backward(ctx, grad_first, *grad_others):
        call, ctx.call = ctx.call, None
        call.other_grads = list(grad_others)
        call.first_unused = grad_first is None
        if grad_first is None:  # only the other outputs are used: the fork's backward must still run
            shape, dtype, device = ctx.first
            grad_first = torch.zeros(shape, dtype=dtype, device=device)
        return (None, grad_first, *(None for _ in grad_others))


class _Inject(torch.autograd.Function):
    """In the recomputation: the first output unchanged; its backward sends the kept gradients into the others."""

    @staticmethod
    def forward(ctx, call, first, *others):
        ctx.call = call
        return first.view_as(first)

    @staticmethod
    def backward(ctx, grad):
        call, ctx.call = ctx.call, None
        kept, call.other_grads = call.other_grads or [], None
        grads = [g if ctx.needs_input_grad[2 + i] else None for i, g in enumerate(kept)]
        grads += [None] * (len(ctx.needs_input_grad) - 2 - len(grads))
        return (None, None if call.first_unused else grad, *grads)


def checkpoint_through(apply: Callable, function: Callable, inputs: Sequence[Any],
                       notice: Optional[Callable[[str], None]] = None,
                       unchanged: Optional[Callable[[], Any]] = None) -> Any:
    """``apply(function, *inputs)`` of a fork's Function, every tensor that needs grad connected (module docstring).

    ``notice(what)`` is told what this call needed beyond the fork's own handling ("inputs": a
    tensor with a history besides ``hidden_states``; "outputs": a layer returning several values,
    "outputs-none" too where one of them is no tensor (Whisper's ``(hidden, None)``); "tensor": a layer
    returning a tensor), for the fix to say "repaired" where its release needs it.
    Not training (no grad, nothing needing it) or a call whose first input is no tensor: ``unchanged()``,
    the call as the fork makes it (default ``apply(function, *inputs)``).
    """
    if unchanged is None:
        def unchanged():
            return apply(function, *inputs)
    if not torch.is_grad_enabled() or not inputs:
        return unchanged()
    lifted = lift_closure_tensors(function, inputs)
    if lifted is not None:
        function, inputs = lifted
    first, rest = inputs[0], tuple(inputs[1:])
    if not isinstance(first, torch.Tensor):
        return unchanged()
    slots = [i for i, value in enumerate(rest) if isinstance(value, torch.Tensor) and value.requires_grad]
    if not first.requires_grad and not slots:
        return unchanged()
    if notice is not None and any(rest[i].grad_fn is not None for i in slots):
        notice("inputs")
    call = _Call(function, slots)
    entry = _Gather.apply(call, first, *(rest[i] for i in slots)) if slots else first
    result = call.finish(apply(call.run, entry, *rest))
    if notice is not None and call.layout == "tensor":
        notice("tensor")
    elif notice is not None and call.layout is not None and call.others:
        notice("outputs")
        if not all(isinstance(value, torch.Tensor) for value in call.others):
            notice("outputs-none")
    return result


def function_drift(cls: Any, name: str) -> Optional[str]:
    """None when ``cls`` is the fork's Function as the fixes know it: ``forward(ctx, forward_function,
    hidden_states, *args[, keyword-only...])`` and ``backward``, both staticmethods."""
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        return f"{name} is missing or not a torch.autograd.Function"
    forward = inspect.getattr_static(cls, "forward", None)
    if not isinstance(forward, staticmethod) or not isinstance(inspect.getattr_static(cls, "backward", None),
                                                               staticmethod):
        return f"{name}.forward/backward are not staticmethods"
    try:
        params = list(inspect.signature(forward.__func__).parameters.values())
    except (TypeError, ValueError):
        return f"{name}.forward has no readable signature"
    kinds = [p.kind for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    if kinds != [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3 + [inspect.Parameter.VAR_POSITIONAL]:
        return f"{name}.forward is no longer forward(ctx, forward_function, hidden_states, *args)"
    return None


class RepairNotice:
    """A fork fix's ``notice`` for :func:`checkpoint_through`: "repaired" (``fix.repaired``) for what a call needed
    only where the installed release has the mechanism whose repair that is.

    ``repairs``: what ``checkpoint_through`` reports -> the mechanism; ``said``: mechanism -> the repaired line.
    Made when the fix applies (the mechanisms here are read then).
    """

    def __init__(self, fix: Any, repairs: Mapping[str, str], said: Mapping[str, str]) -> None:
        self.fix, self.repairs, self.said = fix, repairs, said
        self.here = frozenset(mechanism.name for mechanism in fix.mechanisms_here())

    def __call__(self, what: str) -> None:
        mechanism = self.repairs.get(what)
        if mechanism in self.here:
            self.fix.repaired(self.said[mechanism])
