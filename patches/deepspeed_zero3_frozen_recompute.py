"""DeepSpeed ZeRO-3 before 0.19.3: non-reentrant checkpointing of layers with frozen parameters (LoRA) fails.

What breaks: torch's non-reentrant recomputation keeps a tensor that needs no grad as itself, not as a detached
alias.  A frozen ZeRO-3 parameter is saved so while gathered; the recomputed forward's post-hook then partitions
it (``param.data`` becomes an empty tensor), and torch's check finds it changed ("Recomputed values for the
following tensors have different metadata ... shape torch.Size([0])"): TRL, axolotl and the HF Trainer with PEFT
LoRA and ZeRO-3 stop at the first backward.  DeepSpeed 0.19.3 (#8148) keeps such parameters gathered until the
backward of the module whose gradient started the recomputation.

How this fixes it: torch's recomputation hook is wrapped (wrapt, its ``__init__`` and ``__exit__``): it saves a
frozen ZeRO-3 parameter (``ds_id``) as a detached alias of its gathered data, as torch saves every tensor that needs
grad.  ZeRO-3 partitions the parameter as before; the alias keeps its gathered storage only until the backward
that reads it has run.  Revert deletes the class attributes.
docs/fixes/deepspeed-zero3-frozen-recompute.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from hotfix import Mechanism, Patch

#: torch's checkpoint module, its recomputation hook class, the base class whose __enter__ reads ``pack_hook``
CHECKPOINT_MODULE = "torch.utils.checkpoint"
RECOMPUTATION_HOOK = "_recomputation_hook"
PACK_HOOK = "pack_hook"
#: the instance attribute holding one recomputation's (parameter, alias) pairs until its __exit__
ALIASED = "_hotfix_aliased_parameters"
#: the first DeepSpeed release with its own fix (deepspeedai/DeepSpeed#8148)
DEEPSPEED_FIX = "0.19.3"


def alias_frozen_parameters(fix: Patch) -> Tuple[Callable, Callable]:
    """The wrapt wrappers of ``_recomputation_hook.__init__(self, frame_ref, gid)`` and of its ``__exit__``.

    After torch's own ``__init__`` the instance's ``pack_hook`` first turns a frozen ZeRO-3 parameter into an alias
    (also one ZeRO-3 keeps gathered: it partitions even those while it records its first step's trace); on
    ``__exit__`` (torch checks the recomputed tensors just after) the repair is said where ZeRO-3 has partitioned
    one of them meanwhile: there, without the alias, torch's check would have failed.
    """

    def save_frozen_parameters_as_aliases(wrapped, instance, args, kwargs):  # named: wrapper chains read it
        wrapped(*args, **kwargs)
        torch_pack = getattr(instance, PACK_HOOK)
        aliased: list = []  # (parameter, its alias) of this recomputation
        frame_ref = args[0] if args else kwargs.get("target_frame_ref")  # the checkpoint's frame: its own check
        instance.__dict__[ALIASED] = (frame_ref, aliased)

        def pack(x):
            if not x.requires_grad and getattr(x, "ds_id", None) is not None:  # ZeRO-3 marks its parameters
                alias = x.detach()
                aliased.append((x, alias))
                x = alias
            return torch_pack(x)

        setattr(instance, PACK_HOOK, pack)

    def say_where_partitioned(wrapped, instance, args, kwargs):
        try:
            return wrapped(*args, **kwargs)
        finally:
            frame_ref, aliased = instance.__dict__.pop(ALIASED, (None, ()))
            if aliased and _check_would_fail(frame_ref, aliased):
                fix.repaired("the recomputation kept frozen ZeRO-3 parameters that ZeRO-3 partitioned after it "
                             "(without hotfix: 'Recomputed values ... different metadata')",
                             call="a non-reentrant checkpoint recomputed under DeepSpeed ZeRO-3")

    return save_frozen_parameters_as_aliases, say_where_partitioned


def _check_would_fail(frame_ref: Any, aliased: list) -> bool:
    """Would torch's own check of this checkpoint have failed on a partitioned parameter, saved as itself?  It
    compares what the checkpoint's ``metadata_fn`` (its ``determinism_check``) says of the saved and the recomputed
    tensor: ``determinism_check="none"`` compares nothing (upstream trains equal there: no repair to claim)."""
    frame = frame_ref() if callable(frame_ref) else None
    if frame is not None and hasattr(frame, "metadata_fn"):
        metadata = frame.metadata_fn
        if metadata is None:
            return False
        import torch

        with torch.no_grad():
            return any(metadata(parameter) != metadata(alias) for parameter, alias in aliased)
    return any(parameter.shape != alias.shape for parameter, alias in aliased)  # a torch without the frame's rule


class DeepspeedZero3FrozenRecompute(Patch):
    name = "deepspeed-zero3-frozen-recompute"
    targets = (CHECKPOINT_MODULE,)
    # measured: 0.19.2 broken, 0.19.8 fixed (tests/e2e/test_deepspeed.py); before 0.19.2: DeepSpeed's #8148 account
    mechanisms = (
        Mechanism("zero3-frozen-recompute", {"deepspeed": f"<{DEEPSPEED_FIX}", "torch": ">=2.4.0"},
                  fixed_in=DEEPSPEED_FIX,
                  summary="ZeRO-3 with non-reentrant checkpointing and frozen parameters in the layer (PEFT LoRA, "
                          "frozen towers): the recomputation sees the frozen parameters partitioned"),
    )
    symptom = ("CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different "
               "metadata than during the forward pass - DeepSpeed ZeRO-3 + LoRA + use_reentrant=False")
    upstream = "deepspeedai/DeepSpeed#4332, fixed by #8148 (0.19.3); huggingface/transformers#47254, huggingface/trl#2514"

    def drift(self, module: Any) -> Optional[str]:
        hook = module.__dict__.get(RECOMPUTATION_HOOK)
        if not isinstance(hook, type):
            return f"{RECOMPUTATION_HOOK} is missing"
        enter = getattr(hook, "__enter__", None)
        if PACK_HOOK not in getattr(getattr(enter, "__code__", None), "co_names", ()):
            return f"{RECOMPUTATION_HOOK} no longer hands its {PACK_HOOK} attribute to autograd on __enter__"
        return None

    def _apply(self, module: Any) -> None:
        hook = module.__dict__[RECOMPUTATION_HOOK]
        around_init, around_exit = self.wrapper
        self.wrap(hook, "__init__", around_init)
        self.wrap(hook, "__exit__", around_exit)

    def build_wrapper(self) -> Tuple[Callable, Callable]:
        return alias_frozen_parameters(self)


patch = DeepspeedZero3FrozenRecompute()
