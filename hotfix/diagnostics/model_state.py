"""What a check may change on a model, snapshotted so it can be put back exactly.

Training flags, checkpointing attributes, forward/backward hooks (and the marks that say they are
installed), buffers
(BatchNorm statistics), ``.grad`` of every parameter, the config's attributes
and the RNG states of torch, CUDA, ``random`` and numpy.
"""

from __future__ import annotations

import random
import sys

# transformers 5.x's gradient_checkpointing_enable() calls enable_input_require_grads(), which stores its
# handles as _require_grads_hooks (a list) besides 4.x's _require_grads_hook: both go back with the hooks.
_CKPT_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func", "_require_grads_hook", "_require_grads_hooks")
# Marks that say "my hooks are installed": restored with the hooks, or a model left marked but unhooked
# never installs them again.  transformers 5.x installs its hidden-state capture hooks on the first forward
# that asks for hidden states and marks the model; restored away, the next forward captured nothing
# (5.23 depth_pro: its Dinov2 returned hidden_states=(), IndexError, in every checkpointed mode).
_HOOK_MARKS = ("_output_capturing_hooks_installed",)
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
MISSING = object()


class ModelState:
    """A model's checkable state, taken at construction; ``restore()`` puts it back."""

    def __init__(self, model) -> None:
        import torch

        self.model = model
        self.training = [(m, m.training) for m in model.modules()]
        self.attrs = [(m, {a: m.__dict__.get(a, MISSING) for a in _CKPT_ATTRS + _HOOK_MARKS}) for m in model.modules()]
        self.hooks = [(m, {h: dict(getattr(m, h)) for h in _HOOK_DICTS if isinstance(getattr(m, h, None), dict)})
                      for m in model.modules()]
        self.grads = [(p, p.grad) for p in model.parameters()]
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        config = getattr(model, "config", None)
        self.config = (config, dict(config.__dict__)) if config is not None and hasattr(config, "__dict__") else None
        self.rng = RngState(torch)

    def restore_checkpointing(self) -> None:
        for m, attrs in self.attrs:
            for name, value in attrs.items():
                if value is MISSING:
                    m.__dict__.pop(name, None)
                else:
                    m.__dict__[name] = value
        for m, hooks in self.hooks:
            for name, saved in hooks.items():
                current = getattr(m, name)
                if dict(current) != saved:
                    current.clear()
                    current.update(saved)

    def restore(self) -> None:
        import torch

        self.restore_checkpointing()
        for m, training in self.training:
            m.training = training
        for p, g in self.grads:
            p.grad = g
        with torch.no_grad():
            for b, saved in self.buffers:
                if b.shape == saved.shape:
                    b.copy_(saved)
        if self.config is not None:
            config, saved = self.config
            for key in [k for k in config.__dict__ if k not in saved]:
                del config.__dict__[key]
            config.__dict__.update(saved)
        self.rng.restore()


class RngState:
    def __init__(self, torch) -> None:
        self.torch = torch
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.python = random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = np.random.get_state() if np is not None else None

    def restore(self) -> None:
        self.torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            self.torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)


def seed_everything(seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA device
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)
