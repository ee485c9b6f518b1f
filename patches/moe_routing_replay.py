"""Mixtures of experts under checkpointing: the recomputation routes every token to the experts its forward chose.

What breaks: the recomputation runs the router again; on a GPU its scores drift in the last bits and where experts
nearly tie ``topk`` picks another.  Experts looping over the hit ones: CheckpointError (non-reentrant); same shapes
either way (5.x fused experts, reentrant): gradients sent to experts the forward never used, silently
(huggingface/transformers#47467, pytorch/pytorch#171355).  No release replays routing.

How this fixes it: every checkpointed call is a region (``hotfix.checkpointing.region``), entered where calls end:
torch's reentrant ``CheckpointFunction.apply`` and non-reentrant generator (its ``context_fn``), unsloth-zoo's and
DeepSpeed's functions.  A model whose checkpointing is switched on (transformers' enabler, torch's checkpoint_wrapper)
has its classes read once; their ``topk`` calls become ``routing.Replay.topk``: recorded in a region's forward,
replayed in its recomputation with values read from the recomputed scores (the router keeps its gradient); a helper
that samples experts (PhiMoE) is handed the forward's scores' values; unsloth-zoo's fused router declines inside
regions (its caller's eager routing is replayed).  No drift: bit-identical to upstream; outside checkpointed calls
nothing changes.  One "repaired" line where a compared replay differed.  docs/fixes/moe-routing-replay.md.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, List, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.slot import SETTER
from hotfix.checkpointing.torch_checkpoint import (FUNCTION_CLASS, GENERATOR, debug_asked, function_class_drift,
                                                   generator_drift)
from hotfix.checkpointing.torch_checkpoint import MODULE as CHECKPOINT_MODULE
from hotfix.checkpointing.unsloth import CLASS_NAME as UNSLOTH_CLASS
from hotfix.checkpointing.unsloth import MODULE as UNSLOTH_MODULE
from hotfix.checkpointing.unsloth import checkpoint_function_drift

MODELING_UTILS = "transformers.modeling_utils"
DEEPSPEED_MODULE = "deepspeed.runtime.activation_checkpointing.checkpointing"
#: torch's checkpoint_wrapper (FSDP / FSDP2 activation checkpointing: accelerate, Lightning, torchtitan-style): a
#: module wrapped there is checkpointed without transformers' enabler, so its classes are read when it is wrapped
WRAPPER_MODULE = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
#: the classes whose ``apply(function, <flag>, *inputs)`` runs ``function`` in the forward and again in the backward
FUNCTION_CLASSES = {CHECKPOINT_MODULE: FUNCTION_CLASS, UNSLOTH_MODULE: UNSLOTH_CLASS,
                    DEEPSPEED_MODULE: "CheckpointFunction"}
#: unsloth-zoo 2026.10.8+: its fused MoE router (``UNSLOTH_MOE_FUSED_ROUTER=1``), a Triton kernel that chooses the
#: experts inside itself, behind one gate every caller asks first: ``fused_route_or_none`` (None: route eagerly)
FUSED_ROUTER_MODULE = "unsloth_zoo.temporary_patches.moe_router_triton"
FUSED_ROUTER = "fused_route_or_none"
#: where modules that imported the gate before this fix applied hold it under names of their own
#: (``from .moe_router_triton import fused_route_or_none as _fused_route_or_none``)
FUSED_ROUTER_CALLERS = ("unsloth_zoo.", "unsloth.", "unsloth_compiled_cache")


def _runs_its_function_twice(cls: Any) -> Optional[str]:
    """None where ``cls`` is an autograd Function whose ``forward(ctx, run_function, <flag>, *args)`` keeps the function
    it runs (DeepSpeed's ``CheckpointFunction``: it calls ``ctx.run_function`` again in its backward)."""
    import inspect

    import torch  # its target imported torch

    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        return "CheckpointFunction is missing or not a torch.autograd.Function"
    forward = inspect.getattr_static(cls, "forward", None)
    try:
        kinds = [p.kind for p in inspect.signature(forward.__func__).parameters.values()]
    except (AttributeError, TypeError, ValueError):
        return "CheckpointFunction.forward is not a staticmethod with a readable signature"
    if kinds[:3] != [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3 or inspect.Parameter.VAR_POSITIONAL not in kinds:
        return "CheckpointFunction.forward is no longer forward(ctx, run_function, flag, *args)"
    return None


def _declinable_gate(gate: Any) -> Optional[str]:
    """None where ``gate`` is unsloth-zoo's fused router gate as this fix reads it: ``fused_route_or_none(logits,
    top_k, ...)``, whose callers route eagerly where it returns None."""
    import inspect

    try:
        names = list(inspect.signature(gate).parameters)[:2]
    except (TypeError, ValueError):
        return f"{FUSED_ROUTER} is missing or not a function"
    return None if names == ["logits", "top_k"] else f"{FUSED_ROUTER} no longer takes (logits, top_k, ...)"


class MoeRoutingReplay(Patch):
    name = "moe-routing-replay"
    targets = (CHECKPOINT_MODULE, WRAPPER_MODULE, MODELING_UTILS, UNSLOTH_MODULE, DEEPSPEED_MODULE,
               FUSED_ROUTER_MODULE)
    # no transformers release replays routing; 4.35.0 is where hotfix reaches transformers' checkpointing
    mechanisms = (
        Mechanism("routing-drift", {"transformers": ">=4.35.0"}, unreached={"transformers": "<4.35.0"},
                  summary="a checkpoint's recomputation routes tokens to other experts than its forward where the "
                          "router's scores drift (GPU nondeterminism): CheckpointError, or silently wrong gradients"),
        Mechanism("fused-router", {"unsloth-zoo": ">=2026.10.8"},
                  summary="unsloth-zoo's fused MoE router (UNSLOTH_MOE_FUSED_ROUTER=1) chooses the experts inside its "
                          "Triton kernel, again in the recomputation: the same drift, out of a topk's reach"),
    )
    symptom = ("torch.utils.checkpoint.CheckpointError: A different number of tensors was saved during the original "
               "forward and recomputation (MoE models: Qwen3-MoE, Mixtral, gpt-oss, DeepSeek), or wrong gradients")
    details = ("routers found in the model's code (topk, or a helper sampling experts) when checkpointing is enabled "
               "(transformers' enablers, torch's checkpoint_wrapper); the forward's choice replayed in the "
               "recomputation; unsloth-zoo's fused router (UNSLOTH_MOE_FUSED_ROUTER=1) steps aside inside "
               "checkpointed calls")
    upstream = "huggingface/transformers#47467 (fix PR #47508 closed unmerged); pytorch/pytorch#171355"

    def __init__(self) -> None:
        super().__init__()
        self._read: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()  # classes read once
        self._parts: List[Any] = []  # (Replay, RoutingTorch, mode class) once torch is imported
        self.routing = False  # a router was found: checkpointed calls enter regions from now on

    # -- what replays -------------------------------------------------------
    def parts(self) -> tuple:
        if not self._parts:
            import torch

            from hotfix.checkpointing.routing import Replay, RoutingTorch, topk_mode

            def repaired() -> None:
                self.repaired("a recomputation would have sent tokens to other experts than its forward did (the "
                              "router's scores drifted); the forward's routing was replayed",
                              call="an MoE router's top-k in a checkpointed call")

            replay = Replay(torch.topk, torch.compiler.is_compiling, repaired, self._mismatch)
            self._parts[:] = [replay, RoutingTorch(torch, replay), topk_mode(replay)]
        return tuple(self._parts)

    def _mismatch(self, reason: str) -> None:
        self.warn_once(reason, f"{reason}: that decision was made again, as upstream makes it")

    def route(self, model: Any) -> None:
        """Replay the routing of every class ``model`` is made of whose code calls ``topk``, or a helper that samples
        experts (each class read once)."""
        from hotfix.checkpointing.routing import (TORCH_FUNCTION, defining_module, modules_of, sampling_helpers,
                                                  topk_sites)

        for cls in modules_of(model):
            with self._lock:
                if cls in self._read:
                    continue
                self._read[cls] = True
            for owner, name, function, how in topk_sites(cls):
                if how == TORCH_FUNCTION:
                    self._route_module(defining_module(function), owner, name)
                else:
                    self._route_method(owner, name)
            for owner, name, helper in sampling_helpers(cls):
                self._route_helper(defining_module(helper), owner, name, helper)

    def _route_module(self, module: Any, owner: type, name: str) -> None:
        _, routing_torch, _ = self.parts()
        if module is None:
            self.warn_once((owner, name), f"{owner.__qualname__}.{name} has no module namespace; its routing is "
                                          "not replayed")
            return
        present = module.__dict__.get("torch")
        if present is routing_torch:
            return
        if present is not sys.modules.get("torch"):
            self.warn_once(module.__name__, f"{module.__name__}.torch is not torch ({type(present).__name__}); its "
                                            "routing is not replayed")
            return
        self.replace(module, "torch", routing_torch)
        self.routing = True

    def _route_helper(self, module: Any, owner: type, name: str, helper: Any) -> None:
        """The module's global ``helper`` (a sampling router, called by ``owner.name``) becomes a ScoresReplay."""
        present = module.__dict__.get(helper.__name__) if module is not None else None
        if present is not helper:  # replayed already (that object is ours), or not the global its callers read
            if not self.installed(present):
                self.warn_once((owner, name, "helper"), f"{owner.__qualname__}.{name} calls {helper.__name__}, which "
                                                        "is not its module's global; its routing is not replayed")
            return
        import torch

        from hotfix.checkpointing.routing import ScoresReplay

        self.replace(module, helper.__name__, ScoresReplay(helper, torch.compiler.is_compiling, self._mismatch))
        self.routing = True

    def _route_method(self, owner: type, name: str) -> None:
        if self.installed(owner.__dict__.get(name)):
            return
        from hotfix.checkpointing.region import regions

        _, _, mode = self.parts()
        import torch

        is_compiling = torch.compiler.is_compiling

        def topk_replayed_in_regions(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if not regions() or is_compiling():
                return wrapped(*args, **kwargs)
            with mode():
                return wrapped(*args, **kwargs)

        self.wrap(owner, name, topk_replayed_in_regions)
        self.routing = True

    # -- where checkpointed calls enter regions -------------------------------
    def _function_in_region(self) -> Callable:
        bound: list = []

        def idle(instance, args, kwargs) -> bool:  # no router found yet (hotfix.junction)
            return not self.routing or not args

        def function_in_region(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if idle(instance, args, kwargs):
                return wrapped(*args, **kwargs)
            if not bound:
                import torch

                from hotfix.checkpointing.region import RegionCall

                bound[:] = [RegionCall, torch.compiler.is_compiling]
            region_call, is_compiling = bound
            if is_compiling():
                return wrapped(*args, **kwargs)
            return wrapped(region_call(args[0]), *args[1:], **kwargs)

        function_in_region.idle = idle
        return function_in_region

    def _phases_in_context(self, module: Any) -> Callable:
        bound: list = []

        def idle(instance, args, kwargs) -> bool:  # no router found yet (hotfix.junction)
            return not self.routing or len(args) < 5

        def phases_in_context(wrapped, instance, args, kwargs):  # named: wrapper chains read it
            if idle(instance, args, kwargs) or debug_asked(module, args):
                return wrapped(*args, **kwargs)  # debug=True refuses any context_fn of its own
            if not bound:
                import torch

                from hotfix.checkpointing.region import with_phases

                bound[:] = [with_phases, module.__dict__.get("_is_compiling"), torch.compiler.is_compiling]
            with_phases, torch_is_compiling, is_compiling = bound
            compiling = torch_is_compiling(args[0], args[5:], kwargs) if torch_is_compiling else is_compiling()
            if compiling:  # compiled, a context_fn must make TorchDispatchModes
                return wrapped(*args, **kwargs)
            return wrapped(args[0], args[1], with_phases(args[2]), *args[3:], **kwargs)

        phases_in_context.idle = idle
        return phases_in_context

    def _decline_fused_router(self, module: Any) -> None:
        """unsloth-zoo's fused router answers None inside a region: its caller routes with its eager code, whose
        ``topk`` this fix replays (the kernel's choice, made inside it, no recomputation can).  A plain function, not
        a wrapt proxy: a compiled router inlines it (traced, it is the release's gate: no region is entered there)."""
        import functools

        import torch

        from hotfix.checkpointing.region import regions

        original, is_compiling, said = module.__dict__[FUSED_ROUTER], torch.compiler.is_compiling, []
        if self.installed(original):  # applied again: it stands
            return

        @functools.wraps(original)
        def fused_router_declined_in_regions(*args: Any, **kwargs: Any) -> Any:  # named: wrapper chains read it
            if is_compiling() or not regions():
                return original(*args, **kwargs)
            if not said:
                said.append(True)
                self.warn_once(FUSED_ROUTER, "unsloth-zoo's fused MoE router (UNSLOTH_MOE_FUSED_ROUTER=1) is not used "
                                             "inside checkpointed calls: there the model's eager router chooses, and "
                                             "the recomputation replays its forward's choice")
            return None

        gate = self.replace(module, FUSED_ROUTER, fused_router_declined_in_regions)
        for name, caller in list(sys.modules.items()):  # hotfix activated after unsloth-zoo: the names they read
            if caller is not module and name.startswith(FUSED_ROUTER_CALLERS):
                for attribute, value in list(getattr(caller, "__dict__", {}).items()):
                    if value is original:
                        self.replace(caller, attribute, gate)

    # -- the fix's lifecycle ------------------------------------------------
    def drift(self, module: Any) -> Optional[str]:
        if module.__name__ == MODELING_UTILS:
            pretrained = getattr(module, "PreTrainedModel", None)
            return None if hasattr(pretrained, SETTER) else f"PreTrainedModel.{SETTER} is missing"
        if module.__name__ == WRAPPER_MODULE:
            wrapper = module.__dict__.get("CheckpointWrapper")
            return None if isinstance(wrapper, type) else "CheckpointWrapper is missing"
        if module.__name__ == UNSLOTH_MODULE:
            return checkpoint_function_drift(module)
        if module.__name__ == FUSED_ROUTER_MODULE:
            return _declinable_gate(module.__dict__.get(FUSED_ROUTER))
        if module.__name__ == CHECKPOINT_MODULE:
            return function_class_drift(module) or generator_drift(module)
        return _runs_its_function_twice(module.__dict__.get(FUNCTION_CLASSES[module.__name__]))

    def _apply(self, module: Any) -> None:
        if module.__name__ == MODELING_UTILS:
            self.wrap(module.PreTrainedModel, SETTER, self._route_after)
            return
        if module.__name__ == WRAPPER_MODULE:
            self.wrap(module.CheckpointWrapper, "__init__", self._route_wrapped)
            return
        if module.__name__ == FUSED_ROUTER_MODULE:
            self._decline_fused_router(module)
            return
        # installed now, joined with the other fixes there (relations.JOIN_ORDER: innermost); until a router is found
        # the hooks hand every call on as it is
        self.join(module.__dict__[FUNCTION_CLASSES[module.__name__]], "apply", self._function_in_region())
        if module.__name__ == CHECKPOINT_MODULE:
            self.join(module, GENERATOR, self._phases_in_context(module))

    def _route_after(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """wrapt wrapper of ``PreTrainedModel._set_gradient_checkpointing``: read the model's classes once."""
        result = wrapped(*args, **kwargs)
        if instance is not None and self.applied:
            self._route_safely(instance)
        return result

    def _route_wrapped(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        """wrapt wrapper of ``CheckpointWrapper.__init__``: read the wrapped module's classes once."""
        result = wrapped(*args, **kwargs)
        inner = getattr(instance, "_checkpoint_wrapped_module", None)
        if inner is not None and self.applied:
            self._route_safely(inner)
        return result

    def _route_safely(self, model: Any) -> None:
        try:
            self.route(model)
        except Exception as exc:  # never the user's call: this model's routing is not replayed
            self.warn_once(("route", type(model)), f"routing not replayed for {type(model).__name__}: "
                                                   f"{type(exc).__name__}: {exc}")

    def _revert(self) -> None:
        super()._revert()
        self._read.clear()
        self.routing = False


patch = MoeRoutingReplay()
