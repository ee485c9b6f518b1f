"""check_model in-process on plain torch modules (no transformers): missing gradients and saved bytes,
the model's state restored, unsupported models, float64 tolerance, the memory and time guards.

The same engine on real models, in fresh interpreters, and the CLI: tests/e2e/test_checker.py.
"""

from __future__ import annotations

import json
import random

import torch
from torch import nn



# -- in-process unit tests (plain torch modules: no transformers import) -----------


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.mix = nn.Linear(8, 8)

    def forward(self, h, context=None):
        return torch.tanh(self.proj(h) + (0 if context is None else self.mix(context)))


class _Toy(nn.Module):
    """A model with HF-style gradient_checkpointing_enable that passes a grad tensor by keyword.

    Not a transformers GradientCheckpointingLayer, so hotfix does not touch it:
    under reentrant checkpointing the layers' parameters and ``context`` get
    no gradient (the input x does not require grad) -- the bug class itself.
    """

    supports_gradient_checkpointing = True

    def __init__(self):
        super().__init__()
        self.context = nn.Linear(8, 8)
        self.layers = nn.ModuleList([_Layer() for _ in range(2)])
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        from functools import partial

        from torch.utils.checkpoint import checkpoint

        kwargs = gradient_checkpointing_kwargs or {"use_reentrant": True}
        self._gradient_checkpointing_func = partial(checkpoint, **kwargs)
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self):
        return self.gradient_checkpointing

    def forward(self, x):
        from functools import partial

        ctx = self.context(x)
        h = self.drop(x)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                h = self._gradient_checkpointing_func(partial(layer, context=ctx), h)
            else:
                h = layer(h, context=ctx)
        return self.norm(h)


def _toy():
    torch.manual_seed(0)
    return _Toy(), torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_detects_missing_gradients_and_reports_saved_bytes():
    from hotfix.diagnostics import check_model

    model, x = _toy()
    report = check_model(model, x)
    re, nre, default = report.mode("reentrant"), report.mode("non-reentrant"), report.mode("default")
    assert re.status == "wrong" and len(re.missing) == 10 and re.total == 12, re.summary()
    assert nre.status == "equal" and nre.equal == 12, nre.summary()  # dropout: same seed, same masks
    assert default.status == "wrong" and "use_reentrant=True" in default.checkpoint_function
    assert not report.safe and report.unsafe_modes == ["reentrant", "default"]
    assert report.per_parameter["layers.0.proj.weight"]["reentrant"] == "missing"
    assert report.reference.saved_bytes > 0 and re.saved_bytes is not None
    assert report.tolerance == {"float32": 1e-6}
    text = report.format()
    assert "UNSAFE with reentrant, default" in text and "layers.0.proj.weight" in text
    json.dumps(report.to_dict())


def test_restores_model_state():
    from hotfix.diagnostics import check_model

    model, x = _toy()
    model.eval()
    model.layers[1].train()  # a mixed training flag survives too
    grads = {}
    for name, p in model.named_parameters():
        p.grad = torch.full_like(p, 7.0)
        grads[name] = p.grad
    running = model.norm.running_mean.clone()
    torch.manual_seed(123)
    random.seed(5)
    expected_rand = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(5)
    flags = [(m, m.training) for m in model.modules()]
    check_model(model, x)
    assert (torch.rand(3).tolist(), random.random()) == (expected_rand[0].tolist(), expected_rand[1])
    assert all(m.training == t for m, t in flags)
    assert all(p.grad is grads[n] for n, p in model.named_parameters())
    assert torch.equal(model.norm.running_mean, running)
    assert model.gradient_checkpointing is False and "_gradient_checkpointing_func" not in model.__dict__
    # and with checkpointing on before the check, it is on (same function) after
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # (what the model stores; a read goes through hotfix's class-level slot and comes back wrapped)
    fn = model.__dict__["_gradient_checkpointing_func"]
    report = check_model(model, x, modes=["non-reentrant"])
    assert report.safe and model.gradient_checkpointing is True and model.__dict__["_gradient_checkpointing_func"] is fn


class _InputGradsToy(_Toy):
    """5.x's gradient_checkpointing_enable(): it also hooks the input embeddings and keeps the handles both as
    ``_require_grads_hooks`` (a list) and, for old callers, ``_require_grads_hook``."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        super().gradient_checkpointing_enable(gradient_checkpointing_kwargs)
        hooks = [self.context.register_forward_hook(lambda module, args, output: output.requires_grad_(True))]
        self._require_grads_hooks, self._require_grads_hook = hooks, hooks[0]


def test_a_check_leaves_no_input_grads_handles_behind():
    from hotfix.diagnostics import check_model

    model, x = _InputGradsToy(), torch.randn(4, 8)
    check_model(model, x, modes=["non-reentrant"])
    assert not model.context._forward_hooks  # the hook is gone, and with it both names of its handles
    assert "_require_grads_hooks" not in vars(model) and "_require_grads_hook" not in vars(model)
    model.gradient_checkpointing_enable()
    handles = model._require_grads_hooks
    check_model(model, x, modes=["non-reentrant"])
    assert model._require_grads_hooks is handles and len(model.context._forward_hooks) == 1  # as before the check


def test_not_supported_and_float64_tolerance():
    from hotfix.diagnostics import check_model

    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    report = check_model(model, torch.randn(3, 4, dtype=torch.float64))
    assert report.reference.status == "reference"
    assert all(m.status == "not-supported" for m in report.modes)
    assert not report.safe and report.verdict.startswith("not supported")
    assert report.tolerance == {"float64": 1e-10}


class _Runaway(nn.Module):
    """Each forward module call keeps 32 MiB alive: memory grows until stopped."""

    def __init__(self, sleep=0.0):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.sleep = sleep
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True
        self._gradient_checkpointing_func = lambda f, *a: f(*a)

    def forward(self, x):
        import time

        if not self.gradient_checkpointing:
            return self.lin(x)
        hoard = []
        for _ in range(2000):
            hoard.append(torch.ones(8 * 2**20))  # 32 MiB
            x = self.lin(x)
            time.sleep(self.sleep)
        return x


def test_memory_guard_aborts_the_mode_not_the_process():
    from hotfix.diagnostics import check_model

    model = _Runaway()
    report = check_model(model, torch.randn(2, 4), modes=["reentrant"], memory_limit=256 << 20, time_limit=60)
    m = report.mode("reentrant")
    assert m.status == "guard" and "memory guard" in m.error and "256.0 MiB" in m.error, m.error
    assert model.gradient_checkpointing is False and model.lin.weight.grad is None


def test_time_guard():
    from hotfix.diagnostics import check_model

    report = check_model(_Runaway(sleep=0.05), torch.randn(2, 4), modes=["reentrant"], memory_limit=64 << 30,
                         time_limit=0.5)
    m = report.mode("reentrant")
    assert m.status == "guard" and "time guard" in m.error
