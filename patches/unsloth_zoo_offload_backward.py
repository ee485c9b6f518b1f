"""unsloth-zoo 2025.1.1 - 2026.8.10: smart-offload checkpoint drops gradients / offloads late.

What breaks
-----------
2025.1.1 rewrote ``UnslothCheckpointFunction`` to offload each layer's first
input (``args[0]``) to host memory.  Two defects came with it:

* frozen first input (2025.1.1 - 2026.8.10): whether the node needs a backward is decided from
  ``args[0]`` alone.  When ``args[0]`` is frozen but another input requires
  grad (frozen embeddings + LoRA; Whisper's decoder with frozen embeddings once
  ``encoder_hidden_states`` is an input), forward saves nothing and backward
  returns a bare ``None``: "function UnslothCheckpointFunctionBackward returned
  an incorrect number of gradients (expected N, got 1)".  Fixed in 2026.8.11.
* late offload (2025.1.1 - 2025.11.4): the offload gate ``CURRENT_GC_INDEX !=
  LAST_GC_INDEX`` is false for every layer of the first pass, so the first
  step keeps every activation on the GPU: the peak memory of step 1 is that of
  no offloading, and a run sized for offloading runs out of memory at step 1.
  Fixed in 2025.11.5 (``or FIRST_PASS``).

How this patch fixes it
-----------------------
Both live in ``forward``/``backward``, which depend on each other (what
forward saves is what backward can give gradients for), so on the affected
releases we replace the two staticmethods with our own reentrant checkpoint
(built here, offloading through ``hotfix.patches._offload.ActivationOffloader``):

* every tensor input is saved (or, for ``args[0]``, offloaded) and backward
  returns a gradient slot for every input: no frozen-first-input crash;
* ``args[0]`` is offloaded from the first step whenever it is above the size
  threshold (2 MiB, like unsloth), except the last layer once the first pass
  has told us how many layers there are: no late offload;
* RNG state, autocast state and the recomputation under ``enable_grad`` are
  handled as torch's own reentrant ``CheckpointFunction`` does;
* on releases that have it (2026.7.1+), the recomputation runs inside the
  release's ``_gradient_checkpoint_recompute_marker`` so its
  ``in_gradient_checkpoint_recompute()`` keeps answering correctly.

The class object, its name (unsloth checks ``__name__``) and its ``apply``
stay as they are; revert puts the original staticmethods back.  unsloth's own
buffers (allocated by ``initialize_unsloth_gradient_checkpointing``) are left
allocated but unused while the patch is applied.  2026.8.11+ gets no
replacement: its forward/backward are correct there and carry later upstream
work (double buffering, slot pool, prefetch).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Optional

from hotfix.patch import Mechanism, Patch
from hotfix.patches._unsloth_checkpoint_shape import CLASS_NAME, checkpoint_function_drift

if TYPE_CHECKING:
    from hotfix.patches._offload import ActivationOffloader

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
    affected = {"unsloth-zoo": ">=2025.1.1,<2026.8.11"}
    mechanisms = (
        Mechanism("frozen-first-input", {"unsloth-zoo": ">=2025.1.1,<2026.8.11"}, fixed_in="2026.8.11",
                  summary="args[0] frozen, another input needing grad: too few gradients returned"),
        Mechanism("late-offload", {"unsloth-zoo": ">=2025.1.1,<2025.11.5"}, fixed_in="2025.11.5",
                  summary="no activation offloaded during the first step"),
    )
    symptom = (
        "RuntimeError: function UnslothCheckpointFunctionBackward returned an incorrect number of "
        "gradients (frozen first input); no 'Will smartly offload' offloading during the first step"
    )
    upstream = "unslothai/unsloth-zoo gradient_checkpointing.py smart offload (since 2025.1.1)"
    fixed_in = "2026.8.11"

    def __init__(self) -> None:
        super().__init__()
        self._offloader = None

    @property
    def offloader(self) -> "ActivationOffloader":
        """The one offload state object of the process (made on first use: it imports torch).

        Tests and benchmarks switch it to a CPU device with use_device() (tools/lab/simulated_device.py).
        """
        if self._offloader is None:
            from hotfix.patches._offload import ActivationOffloader

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
