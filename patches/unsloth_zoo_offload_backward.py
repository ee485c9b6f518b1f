"""unsloth-zoo 2025.1.1 - 2026.8.10: smart-offload checkpoint drops gradients / offloads late.

What breaks: from 2025.1.1 ``UnslothCheckpointFunction`` offloads each layer's first input to
host memory.  Whether the node needs a backward is decided from ``args[0]`` alone, so a frozen
first input with another input needing grad returns too few gradients (fixed in 2026.8.11);
and before 2025.11.5 nothing is offloaded during the first step (step 1 peaks at full memory).

How this fixes it: on the affected releases ``forward``/``backward`` are replaced by hotfix's
own reentrant checkpoint: every tensor input is saved (``args[0]`` offloaded from step 1
through ``checkpointing.offload.offloader.ActivationOffloader``), backward returns a gradient for every input, RNG and
autocast state are kept as torch's reentrant checkpoint keeps them.  The class, its name and
its ``apply`` stay; revert puts the original staticmethods back.
docs/fixes/unsloth-zoo-offload-backward.md.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing.unsloth import CLASS_NAME, FIRST_INPUT_ONLY, checkpoint_function_drift

if TYPE_CHECKING:
    from hotfix.checkpointing.offload.offloader import ActivationOffloader

# Private helpers of torch.utils.checkpoint that the reentrant checkpoint (and
# unsloth's copy of it) use to stash RNG and autocast state; drift() checks them.
TORCH_HELPERS = ("_infer_device_type", "_get_autocast_kwargs", "_get_device_module",
                 "get_device_states", "set_device_states")
RECOMPUTE_MARKER = "_gradient_checkpoint_recompute_marker"

_INVALID_CHECKPOINT = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible"
    " with .grad() or passing an `inputs` parameter to .backward()."
    " To resolve this error, you can either set use_reentrant=False,"
    " or call .backward() without passing the `inputs` argument."
)


def build_checkpoint_methods(offloader: "ActivationOffloader", recompute_marker: Optional[Callable] = None):
    """Return ``(forward, backward)`` for a reentrant, offloading checkpoint Function."""
    # torch is imported here, not at module level: loading the patch (at
    # activation, on the first transformers import) must not import torch.
    import torch
    import torch.utils.checkpoint as torch_checkpoint

    infer_device_type = torch_checkpoint._infer_device_type
    get_autocast_kwargs = torch_checkpoint._get_autocast_kwargs
    get_device_module = torch_checkpoint._get_device_module
    get_device_states = torch_checkpoint.get_device_states
    set_device_states = torch_checkpoint.set_device_states
    marker = recompute_marker or contextlib.nullcontext

    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        ctx.device_type = infer_device_type(*args)
        ctx.device_autocast_kwargs, ctx.cpu_autocast_kwargs = get_autocast_kwargs(ctx.device_type)
        if preserve_rng_state:
            ctx.fwd_cpu_state = torch.get_rng_state()
            # Like torch: stash device RNG only if the device is initialised,
            # so checkpointing never initialises CUDA by itself.
            ctx.had_device_in_fwd = False
            if getattr(get_device_module(ctx.device_type), "_initialized", False):
                ctx.had_device_in_fwd = True
                ctx.fwd_devices, ctx.fwd_device_states = get_device_states(*args)

        ctx.inputs = []
        ctx.tensor_indices = []
        tensors = []
        ticket = None
        for i, arg in enumerate(args):
            if torch.is_tensor(arg):
                if i == 0 and arg.requires_grad:
                    ticket = offloader.offload(arg)
                # Every tensor is saved (frozen-first-input fix: upstream saved only when args[0]
                # needed grad); an offloaded args[0] is saved as None.
                tensors.append(None if ticket is not None and i == 0 else arg)
                ctx.tensor_indices.append(i)
                ctx.inputs.append(None)
            else:
                ctx.inputs.append(arg)
        ctx.save_for_backward(*tensors)
        ctx.hotfix_offloaded = ticket
        try:
            with torch.no_grad():
                outputs = run_function(*args)
        finally:
            offloader.after_forward(ticket)
        return outputs

    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(_INVALID_CHECKPOINT)
        offloader.backward_started()
        inputs = list(ctx.inputs)
        for index, tensor in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[index] = tensor
        ticket, ctx.hotfix_offloaded = ctx.hotfix_offloaded, None
        if ticket is not None:
            inputs[0] = offloader.reload(ticket)

        rng_devices = ctx.fwd_devices if ctx.preserve_rng_state and ctx.had_device_in_fwd else []
        with torch.random.fork_rng(devices=rng_devices, enabled=ctx.preserve_rng_state,
                                   device_type=ctx.device_type):
            if ctx.preserve_rng_state:
                torch.set_rng_state(ctx.fwd_cpu_state)
                if ctx.had_device_in_fwd:
                    set_device_states(ctx.fwd_devices, ctx.fwd_device_states, device_type=ctx.device_type)
            detached = []
            for index, value in enumerate(inputs):
                if isinstance(value, torch.Tensor):
                    needs_grad = True if (index == 0 and ticket is not None) else value.requires_grad
                    value = value.detach()
                    value.requires_grad_(needs_grad)
                detached.append(value)
            device_autocast = (
                torch.amp.autocast(device_type=ctx.device_type, **ctx.device_autocast_kwargs)
                if torch.amp.is_autocast_available(ctx.device_type) else contextlib.nullcontext()
            )
            with torch.enable_grad(), device_autocast, torch.amp.autocast("cpu", **ctx.cpu_autocast_kwargs), \
                    marker(), offloader.recomputing():
                outputs = ctx.run_function(*detached)

        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [(out, grad) for out, grad in zip(outputs, grad_outputs)
                 if isinstance(out, torch.Tensor) and out.requires_grad]
        # No output needing grad: nothing to propagate (torch raises here;
        # unsloth stays silent, and so do we, to behave as the code we replace).
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        grads = tuple(value.grad if isinstance(value, torch.Tensor) else None for value in detached)
        return (None, None) + grads

    return forward, backward


class UnslothZooOffloadBackward(Patch):
    name = "unsloth-zoo-offload-backward"
    targets = ("unsloth_zoo.gradient_checkpointing",)
    mechanisms = (  # each range equal to the census's evidence (docs/versions.md)
        Mechanism("frozen-first-input", FIRST_INPUT_ONLY, fixed_in="2026.8.11",
                  summary="args[0] frozen, another input needing grad: too few gradients returned"),
        Mechanism("late-offload", {"unsloth-zoo": ">=2025.1.1,<2025.11.5"}, fixed_in="2025.11.5",
                  summary="no activation offloaded during the first step"),
    )
    symptom = (
        "RuntimeError: function UnslothCheckpointFunctionBackward returned an incorrect number of "
        "gradients (frozen first input); no 'Will smartly offload' offloading during the first step"
    )
    upstream = "unslothai/unsloth-zoo gradient_checkpointing.py smart offload (since 2025.1.1)"

    def __init__(self) -> None:
        super().__init__()
        self._offloader = None

    @property
    def offloader(self) -> "ActivationOffloader":
        """The one offload state object of the process (made on first use: it imports torch).

        Tests and benchmarks switch it to a CPU device with use_device() (tools/hotfix_lab/infra/simulated_device.py).
        """
        if self._offloader is None:
            from hotfix.checkpointing.offload.offloader import ActivationOffloader

            self._offloader = ActivationOffloader()
        return self._offloader

    def drift(self, module: Any) -> Optional[str]:
        reason = checkpoint_function_drift(module)
        if reason:
            return reason
        if not isinstance(getattr(module, CLASS_NAME).__dict__.get("backward"), staticmethod):
            return f"{CLASS_NAME}.backward is not a staticmethod of the class"
        import torch.utils.checkpoint as torch_checkpoint

        missing = [name for name in TORCH_HELPERS if not hasattr(torch_checkpoint, name)]
        if missing:
            return "torch.utils.checkpoint lacks " + ", ".join(missing)
        return None

    def _apply(self, module: Any) -> None:
        cls = getattr(module, CLASS_NAME)
        marker = getattr(module, RECOMPUTE_MARKER, None)
        forward, backward = build_checkpoint_methods(self.offloader, marker if callable(marker) else None)
        self.replace(cls, "forward", staticmethod(forward))
        self.replace(cls, "backward", staticmethod(backward))


patch = UnslothZooOffloadBackward()
