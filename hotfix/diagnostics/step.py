"""One forward and backward of a check, with saved-tensor accounting and the guard.

The loss is the model's own (``output.loss``), the caller's ``loss_fn``, or,
where the model returns no loss, a fixed random projection of its first float
output.  A loss that does not require grad (checkpointing cut it off the
graph) is reported (``graph_cut``: every gradient missing) or, with
``cut="raise"``, goes to ``backward()`` as a training script's would, so the
step fails with torch's own error.
"""

from __future__ import annotations

import math
import time
from typing import Dict, Tuple

from hotfix.diagnostics.guard import Watchdog
from hotfix.diagnostics.model_state import seed_everything
from hotfix.diagnostics.results import ModeResult


class CheckerError(RuntimeError):
    """The check itself could not run (no loss, reference step failed, ...)."""


def call_model(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def float_tensors(output):
    """Every floating-point tensor of a model output, depth first (dicts and ModelOutputs by value, tuples, lists)."""
    import torch

    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            yield output
        return
    if isinstance(output, dict) or hasattr(output, "values") and callable(output.values):
        items = list(output.values())
    elif isinstance(output, (tuple, list)):
        items = list(output)
    else:
        return
    for item in items:
        yield from float_tensors(item)


def first_float_tensor(output):
    return next(float_tensors(output), None)


def random_projection(tensors):
    """A fixed random projection (one generator, seed 1234) of each tensor in turn, summed.

    A random projection, not ``.sum()``/``.mean()``: those are invariant to
    shifts that LayerNorm-style outputs absorb, which would make many
    gradients zero in exact arithmetic.
    """
    import torch

    g = torch.Generator().manual_seed(1234)
    total = None
    for tensor in tensors:
        weights = torch.randn(tensor.shape, generator=g, dtype=torch.float32).to(tensor.device)
        term = (tensor.float() * weights).sum() / math.sqrt(max(tensor.numel(), 1))
        total = term if total is None else total + term
    return total


def model_loss(output):
    """The model's own scalar loss tensor (``output.loss`` / ``output["loss"]``), or None."""
    import torch

    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def default_loss(output, batch):
    """``output.loss`` if the model computed one (required grad or not), else a fixed random projection
    of the first float output (:func:`random_projection`)."""
    loss = model_loss(output)
    if loss is not None:
        # The model's own loss, even where it does not require grad: then
        # checkpointing cut it off the graph and every gradient is missing
        # (a projection of another output would hide that and report a made-up loss).
        return loss
    tensor = first_float_tensor(output)
    if tensor is None:
        raise CheckerError("the model's output has no loss and no float tensor; pass loss_fn")
    return random_projection([tensor])


def run_step(model, batch, loss_fn, seed, watchdog: Watchdog, label: str, time_limit: float, result: ModeResult,
             cut: str = "report"):
    """One forward+backward, with saved-tensor accounting and the guard; fills ``result``.

    ``cut``: what to do when the loss does not require grad in a checkpointed
    step: ``"report"`` it (``result.graph_cut``) or ``"raise"`` torch's error
    from ``backward()``, as the user's training script would.
    """
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    seen: Dict[Tuple[str, int], int] = {}
    state = {"forward": True}

    def pack(t):
        watchdog.check()
        if state["forward"]:
            try:
                storage = t.untyped_storage()
                key = (str(t.device), storage.data_ptr())
                seen[key] = max(seen.get(key, 0), storage.nbytes())
            except Exception:
                pass
        return t

    def pre_hook(module, args):
        watchdog.check()

    cuda = torch.cuda.is_available() and any(p.is_cuda for p in model.parameters())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_start = torch.cuda.memory_allocated()
    model.zero_grad(set_to_none=True)
    seed_everything(seed)
    handle = register_module_forward_pre_hook(pre_hook)
    watchdog.begin(label, time_limit)
    rss_start = watchdog.peak
    started = time.monotonic()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = call_model(model, batch)
            loss = loss_fn(output, batch)
            if loss_fn is not default_loss:
                result.loss_source = "loss_fn"
            elif model_loss(output) is None:
                result.loss_source = "projection of the first float output"
            state["forward"] = False
            result.saved_bytes = sum(seen.values())
            result.saved_tensors = len(seen)
            del output
            if loss.requires_grad or (cut == "raise" and not label.startswith("reference")):
                loss.backward()
            elif label.startswith("reference"):
                raise CheckerError("the loss does not require grad without checkpointing: nothing to check")
            else:  # checkpointing cut every path to the loss; every gradient is missing
                result.graph_cut = True
        result.loss = float(loss.detach())
        del loss
        watchdog.check()
    finally:
        handle.remove()
        watchdog.end()
        result.seconds = time.monotonic() - started
        result.peak_rss_delta = watchdog.peak - rss_start if rss_start else None
        if cuda:
            torch.cuda.synchronize()
            result.peak_cuda_delta = torch.cuda.max_memory_allocated() - cuda_start
