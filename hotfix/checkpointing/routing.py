"""A mixture of experts' routing, recorded in a checkpointed region's forward and replayed in its recomputation.

A router picks each token's experts with ``topk`` over its scores.  On a GPU the recomputation's scores differ
from the forward's in the last bits (nondeterministic kernels), and where two experts nearly tie, the recomputation
picks the other one: the experts' code then runs other shapes (CheckpointError) or sends that token's gradient to
an expert the forward never used (silently wrong).  :class:`Replay` is ``topk`` inside checkpointed regions
(``hotfix.checkpointing.region``): in a forward it records the indices it returns; in a recomputation it returns
the forward's indices, in the forward's order, with the values read from the recomputed scores at those indices
(a ``gather`` shaped as ``topk``'s autograd): the router keeps its gradient, exactly where the forward's choice put
it.  Outside a region (no checkpointing, inference, ``generate``, eval) and while dynamo traces it is torch's
``topk``, unchanged.

Where the routing code calls ``topk`` decides how it is reached, found in the code of the classes a model is made
of (:func:`topk_sites`), once per class:

- ``torch.topk(...)`` (most routers): the defining module's global ``torch`` becomes a :class:`RoutingTorch`,
  torch with ``topk`` replaced (every other attribute is torch's own, read on first use);
- ``scores.topk(...)`` (GraniteMoE, JetMoE, Doge, the sparse-attention indexers): the method that calls it runs,
  inside a region only, under :class:`_TopkMode` (a ``TorchFunctionMode`` that answers ``topk`` alone).

A router that samples its experts instead (PhiMoE's ``sparsemixer``: Gumbel sampling over ``max`` and a relative
threshold mask) is a module-level helper handed the scores (:func:`sampling_helpers`): it becomes a
:class:`ScoresReplay`, which hands it, in a recomputation, the forward's scores' values (recorded in the forward),
the gradient flowing to the recomputed scores unchanged: every choice it makes from them is the forward's.
"""

from __future__ import annotations

import contextvars
import dis
import functools
import inspect
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from hotfix.checkpointing.code import code_objects
from hotfix.checkpointing.region import FORWARD, RECOMPUTE, regions

#: set while :meth:`Replay.topk` answers a call (a topk inside it, under the TorchFunctionMode, is torch's own)
_ANSWERING: "contextvars.ContextVar[bool]" = contextvars.ContextVar("hotfix_answering_topk", default=False)
TORCH_FUNCTION = "function"  # a class's code calls torch.topk(...)
TENSOR_METHOD = "method"  # a class's code calls <tensor>.topk(...)
#: how many replays compare the forward's choice with the recomputation's own (a device sync each) to tell the
#: user a choice was repaired; after them replays stay silent (never wrong: silent)
COMPARED_REPLAYS = 256


def _deciding(stack: tuple) -> Tuple[Any, List[Any]]:
    """For a routing decision made under ``stack`` (``regions()``): the region whose forward's record it replays
    (the outermost recomputation: its forward decided for everything inside it), or None; and the regions that
    record it (those in their forward, begun inside that recomputation, or anywhere where there is none)."""
    for position, (region, phase) in enumerate(stack):
        if phase == RECOMPUTE:
            return region, [inner for inner, inner_phase in stack[position + 1:] if inner_phase == FORWARD]
    return None, [region for region, phase in stack if phase == FORWARD]


class Replay:
    """``topk`` that records inside a region's forward and replays inside its recomputation."""

    def __init__(self, topk: Callable, is_compiling: Callable[[], bool], repaired: Callable[[], None],
                 mismatch: Callable[[str], None]) -> None:
        self._topk = topk  # torch's own
        self._is_compiling = is_compiling
        self._repaired = repaired  # a recomputation would have chosen other experts: said once
        self._mismatch = mismatch  # a record that does not fit the call (one line per reason)
        self.compared_left = COMPARED_REPLAYS

    def topk(self, input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *,
             out: Any = None) -> Any:
        if out is not None:  # writes into the caller's tensors: torch's, as asked
            return self._topk(input, k, dim, largest, sorted, out=out)
        if self._is_compiling():
            return self._topk(input, k, dim, largest, sorted)
        stack = regions()
        if not stack or _ANSWERING.get():
            return self._topk(input, k, dim, largest, sorted)
        # once per call: torch's topk inside it (the comparison) must not come back here through the mode
        token = _ANSWERING.set(True)
        try:
            return self._decided(stack, input, k, dim, largest, sorted)
        finally:
            _ANSWERING.reset(token)

    def _decided(self, stack: tuple, input: Any, k: int, dim: int, largest: bool, sorted: bool) -> Any:
        replaying, recording = _deciding(stack)
        if replaying is not None:
            result = self._replayed(replaying, input, k, dim, largest, sorted)
        else:
            result = self._topk(input, k, dim, largest, sorted)
        for region in recording:
            region.records.append(result.indices.clone())
        return result

    def _replayed(self, region: Any, input: Any, k: int, dim: int, largest: bool, sorted: bool) -> Any:
        recorded = region.next_record()
        if recorded is None:
            self._mismatch("the recomputation asked for more routing decisions than its forward made")
            return self._topk(input, k, dim, largest, sorted)
        shape = list(input.shape)
        if shape:
            shape[dim] = k
        if list(recorded.shape) != shape or recorded.device != input.device:
            self._mismatch("a recorded routing decision does not fit the recomputation's scores")
            return self._topk(input, k, dim, largest, sorted)
        if self.compared_left > 0:
            self.compared_left -= 1
            with torch.no_grad():  # saves nothing: non-reentrant checkpointing counts what the recomputation saves
                own = self._topk(input, k, dim, largest, sorted).indices
            if not torch.equal(own.sort(dim).values, recorded.sort(dim).values):
                self._repaired()
                self.compared_left = 0
        indices = recorded.clone()  # the model's code may write into what it is handed; the record stays
        values = _values_at(input, indices, dim)
        return torch.return_types.topk((values, indices))


def _values_at(input: Any, indices: Any, dim: int) -> Any:
    """``input``'s values at ``indices`` along ``dim``, with ``topk``'s own autograd shape: one tensor saved (the
    indices), the gradient scattered back there.  (``gather`` would save its input too: non-reentrant checkpointing
    compares what the forward and the recomputation save, and would fail on the difference.)"""
    return ValuesAtIndices.apply(input, indices, dim)


class ValuesAtIndices(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: Any, indices: Any, dim: int) -> Any:
        ctx.save_for_backward(indices)
        ctx.dim, ctx.shape = dim, input.shape
        return input.gather(dim, indices)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (indices,) = ctx.saved_tensors
        return grad.new_zeros(ctx.shape).scatter(ctx.dim, indices, grad), None, None


class ScoresReplay:
    """A sampling router's helper (``helper(scores, ...)``) inside regions: in a forward the scores it is handed are
    recorded; in a recomputation it is handed the forward's values instead, as the output of :class:`ForwardValues`
    (the gradient reaches the recomputed scores unchanged).  Its random draws are the forward's already (the
    checkpoint restores the generators).  Outside a region and while dynamo traces, the helper as it is.  It cannot
    tell which recomputation would have chosen otherwise (its rule is the helper's): it says nothing."""

    def __init__(self, helper: Callable, is_compiling: Callable[[], bool], mismatch: Callable[[str], None]) -> None:
        functools.update_wrapper(self, helper)  # its name, and ``__wrapped__``: what revert reads
        self._is_compiling = is_compiling
        self._mismatch = mismatch

    def __call__(self, scores: Any, *args: Any, **kwargs: Any) -> Any:
        stack = regions()
        if not stack or not isinstance(scores, torch.Tensor) or self._is_compiling():
            return self.__wrapped__(scores, *args, **kwargs)
        replaying, recording = _deciding(stack)
        if replaying is not None:
            scores = self._replayed(replaying, scores)
        for region in recording:
            region.records.append(scores.detach().clone())
        return self.__wrapped__(scores, *args, **kwargs)

    def _replayed(self, region: Any, scores: Any) -> Any:
        recorded = region.next_record()
        if recorded is None:
            self._mismatch("the recomputation asked for more routing decisions than its forward made")
            return scores
        if recorded.shape != scores.shape or recorded.dtype != scores.dtype or recorded.device != scores.device:
            self._mismatch("a recorded routing decision does not fit the recomputation's scores")
            return scores
        return ForwardValues.apply(scores, recorded)


class ForwardValues(torch.autograd.Function):
    """``recorded``'s values in ``scores``' place: the gradient passes to ``scores`` as it comes.  Saves nothing
    (non-reentrant checkpointing compares what the forward and the recomputation save)."""

    @staticmethod
    def forward(ctx: Any, scores: Any, recorded: Any) -> Any:
        return recorded.clone()  # the helper may write into what it is handed; the record stays

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad, None


class RoutingTorch(types.ModuleType):
    """The ``torch`` a module's routing code reads: ``topk`` is :meth:`Replay.topk`, every other attribute torch's
    own (looked up on first use, then kept here: a plain attribute read afterwards, as on torch itself)."""

    def __init__(self, torch: types.ModuleType, replay: Replay) -> None:
        super().__init__(torch.__name__, torch.__doc__)
        self.__dict__["_hotfix_torch"] = torch
        self.__dict__["topk"] = replay.topk

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_hotfix_torch"], name)
        if not name.startswith("__"):
            self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return "<torch, its topk replayed in checkpoint recomputations by hotfix>"


def topk_mode(replay: Replay) -> Any:
    """A ``TorchFunctionMode`` answering ``torch.topk`` / ``Tensor.topk`` with ``replay`` (made once per fix)."""
    from torch.overrides import TorchFunctionMode

    answered = (torch.topk, torch.Tensor.topk)

    class _TopkMode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
            if func in answered:
                return replay.topk(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    return _TopkMode


def _calls(code: types.CodeType) -> Iterator[str]:
    """How ``code`` calls ``topk``: ``TORCH_FUNCTION`` for ``torch.topk``, ``TENSOR_METHOD`` for anything else's."""
    previous = None
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and instruction.argval == "topk":
            torch_global = previous is not None and previous.opname in ("LOAD_GLOBAL", "LOAD_NAME") \
                and previous.argval == "torch"
            yield TORCH_FUNCTION if torch_global else TENSOR_METHOD
        previous = instruction


def _helpers(function: types.FunctionType, codes: List[types.CodeType]) -> List[types.FunctionType]:
    """The module-level functions ``function`` (whose code objects are ``codes``) calls by name (its globals'), one
    level deep: a routing helper beside a forward (unsloth-zoo's temporary patches replace an MoE block's ``forward``
    with one that routes in a helper of their module, ``_route_softmax_topk(self, ...)``)."""
    namespace, found = function.__globals__, []
    for code in codes:
        for name in code.co_names:
            helper = namespace.get(name)
            if isinstance(helper, types.FunctionType) and helper is not function and helper not in found \
                    and not _is_torchs(helper.__module__):
                found.append(helper)
    return found


def _is_torchs(module_name: Optional[str]) -> bool:
    """Code of torch's own (or a builtin): never routed, its module's ``torch`` is torch's everywhere."""
    return (module_name or "").split(".")[0] in ("torch", "builtins")


def _methods(cls: type) -> Iterator[Tuple[type, str, types.FunctionType]]:
    """``(owner, name, function)`` for each method of each class of ``cls``'s MRO short of torch's; a decorated
    method (``@torch.no_grad()``: DeepSeek's and GLM's group routers) shows its own code."""
    for owner in cls.__mro__:
        if _is_torchs(owner.__module__):
            continue
        for name, member in vars(owner).items():
            function = inspect.unwrap(getattr(member, "__func__", member))
            if isinstance(function, types.FunctionType):
                yield owner, name, function


def topk_sites(cls: type) -> List[Tuple[type, str, Any, str]]:
    """Where the code of ``cls`` (and its bases short of torch's) calls ``topk``: ``(owner, name, function, how)``
    for each method of ``owner`` (a class of ``cls``'s MRO) that does, itself or in a module-level function it calls
    by name (``function`` is then that helper: its module's ``torch`` is the one to route)."""
    found = []
    for owner, name, function in _methods(cls):
        own = list(code_objects(function))
        for candidate in (function, *_helpers(function, own)):
            codes = own if candidate is function else list(code_objects(candidate))
            if not any("topk" in code.co_names for code in codes):
                continue
            for how in sorted({how for code in codes for how in _calls(code)}):
                found.append((owner, name, candidate, how))
    return found


#: what a helper calls on torch or a tensor to draw random numbers for sampling (Gumbel noise, uniform draws)
RANDOM_DRAWS = frozenset({"exponential_", "rand_like", "uniform_", "multinomial", "bernoulli", "bernoulli_"})


def _attributes(code: types.CodeType) -> set:
    """The attributes ``code`` reads (``x.max``, ``torch.rand_like``), not the globals it calls (builtin ``max``)."""
    return {instruction.argval for instruction in dis.get_instructions(code)
            if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD")}


def sampling_helpers(cls: type) -> List[Tuple[type, str, types.FunctionType]]:
    """The module-level helpers the methods of ``cls`` (and its bases short of torch's) call by name that choose
    experts by sampling: their code takes a tensor's ``max`` and draws random numbers through torch (attributes read:
    not the builtin ``max``, not numpy's ``random.rand``), and never calls ``topk`` (PhiMoE's ``sparsemixer``).
    ``(owner, name, helper)``: the method of ``owner`` that calls it."""
    found = []
    for owner, name, function in _methods(cls):
        for helper in _helpers(function, list(code_objects(function))):
            read = set().union(*(_attributes(code) for code in code_objects(helper)))
            if "max" in read and read & RANDOM_DRAWS and "topk" not in read:
                found.append((owner, name, helper))
    return found


def defining_module(function: types.FunctionType) -> Optional[types.ModuleType]:
    """The module whose namespace is ``function``'s globals (where its global ``torch`` is read), or None."""
    module = sys.modules.get(function.__globals__.get("__name__", ""))
    return module if module is not None and vars(module) is function.__globals__ else None


def modules_of(model: Any) -> Dict[type, None]:
    """The classes ``model`` is made of, each once, in the order met."""
    return dict.fromkeys(type(module) for module in model.modules())
