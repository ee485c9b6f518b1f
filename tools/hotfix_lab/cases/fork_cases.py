"""Cases run on a LlamaFactory or axolotl release's checkpointer, loaded on CPU by fork_loader.py.

    python fork_cases.py FUNCTION CASE [CASE ...] [--activate CASE ...]     one JSON line per case

FUNCTION: a key of ``fork_loader.FUNCTIONS`` (llamafactory-unsloth, llamafactory-torch, axolotl-offload,
axolotl-offload-disk); the release comes from PYTHONPATH.  Every case is one training step without
checkpointing and one with checkpointing turned on the way the fork does it (hotfix's ``check_model``,
every parameter gradient compared at 1e-6 relative; a missing gradient is never equal to a zero one).

hotfix: by default ``import hotfix`` runs first (activation, as the start-up hook would); with
``HOTFIX_DISABLE=1`` the cases before ``--activate`` run upstream, then hotfix is activated in the
same process and the cases after it run again (tools/hotfix_lab/census/forks.py does this).

``copy`` (not a gradient case): is the model still deep-copyable, its checkpoint function picklable.

Cases (``CASES``): a lab model (a ``PreTrainedModel`` whose layers are ``GradientCheckpointingLayer``
on transformers >= 4.52, called as ``_gradient_checkpointing_func(layer.__call__, ...)`` before, as
transformers' own models are) in five shapes, and real tiny models (Whisper; Gemma-3n's text model and
Gemma-4 with KV sharing, built by the sweep's builder).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Dict

from hotfix_lab.infra import fork_loader

#: lab shapes: (a context tensor needing grad reaches each layer, the first layer's input is frozen, what a layer
#: returns: "tuple" = (hidden,), "tensor" = hidden, "several" = (hidden, aux) with aux in the loss, "none" =
#: (hidden, None))
LAB = {
    "plain": (False, False, "tuple"),  # what the forks were written for: hidden_states only
    "tensor-output": (False, False, "tensor"),  # transformers >= 4.54's decoder layers return a tensor
    "several-outputs": (False, False, "several"),
    "output-with-none": (False, False, "none"),  # Whisper's layers on transformers 4.56: (hidden, None)
    "keyword": (True, False, "tuple"),  # Whisper-style: one context tensor (with a history) into every layer
    "keyword-frozen-first": (True, True, "tuple"),  # ... and the first layer's hidden states need no grad
}
#: real models: case -> (sweep model type, first transformers release that has it)
REAL = {"whisper": ("whisper", "4.0"), "gemma3n": ("gemma3n_text", "4.53.0"), "gemma4": ("gemma4+kv_shared", "5.5.0")}
CASES = tuple(LAB) + tuple(REAL)


def lab_model(case: str, seed: int = 0):
    """``(model, batch)``: the lab model of ``case`` (LAB), seeded, in training mode."""
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

    with_context, frozen_first, returns = LAB[case]
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer as LayerBase  # 4.52+
        by_keyword = True
    except ImportError:
        LayerBase, by_keyword = nn.Module, False

    class LabLayer(LayerBase):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.mix = nn.Linear(8, 8)
            self.aux = nn.Linear(8, 8)

        def forward(self, hidden, context=None):
            hidden = torch.tanh(self.proj(hidden) + (self.mix(context) if context is not None else 0))
            if returns == "tensor":
                return hidden
            if returns == "several":
                return hidden, torch.sigmoid(self.aux(hidden))
            if returns == "none":
                return hidden, None
            return (hidden,)

    class LabConfig(PretrainedConfig):
        model_type = "hotfix-fork-lab"

    class LabModel(PreTrainedModel):
        config_class = LabConfig
        base_model_prefix = "lab"
        supports_gradient_checkpointing = True

        def __init__(self, config):
            super().__init__(config)
            self.context = nn.Linear(8, 8)
            self.embed = nn.Linear(8, 8)
            self.layers = nn.ModuleList([LabLayer() for _ in range(3)])
            self.gradient_checkpointing = False

        def _init_weights(self, module):
            pass  # the seeded default initialisation stays

        def forward(self, x, labels):
            context = self.context(x) if with_context else None
            hidden = self.embed(x)
            extra = 0
            for layer in self.layers:
                if by_keyword:
                    out = layer(hidden, context=context)  # GradientCheckpointingLayer: context in the partial
                elif self.gradient_checkpointing and self.training:
                    out = self._gradient_checkpointing_func(layer.__call__, hidden, context)  # < 4.52
                else:
                    out = layer(hidden, context)
                if returns == "several":
                    hidden, aux = out
                    extra = extra + aux.mean()
                else:
                    hidden = out if returns == "tensor" else out[0]
            loss = (hidden - labels).pow(2).mean() + extra
            return type("Out", (), {"loss": loss})()

    torch.manual_seed(seed)
    model = LabModel(LabConfig()).train()
    if frozen_first:
        model.embed.requires_grad_(False)
    g = torch.Generator().manual_seed(seed + 1)
    return model, {"x": torch.randn(4, 8, generator=g), "labels": torch.randn(4, 8, generator=g)}


def _compare(report) -> Dict:
    from hotfix_lab.cases import grad_case

    result = grad_case.case_result(report, {})
    for key in ("total", "loss"):
        result.pop(key, None)
    return result


def _release_has(first: str) -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) >= Version(first)


def case_copy(enable: Callable) -> Dict:
    """The lab model with the fork's checkpointing on: can it be deep-copied (TRL's reference model), and can
    the checkpoint function its layers hold be pickled?  "ok" or the error, for each."""
    import copy
    import pickle

    from hotfix.diagnostics.compare import short_error

    model, _ = lab_model("plain")
    enable(model)
    result = dict(status="ok")
    held = next(m.__dict__["_gradient_checkpointing_func"] for m in model.modules()
                if "_gradient_checkpointing_func" in m.__dict__)
    for name, attempt in (("deepcopy", lambda: copy.deepcopy(model)), ("pickle", lambda: pickle.dumps(held))):
        try:
            attempt()
            result[name] = "ok"
        except Exception as exc:
            result[name] = short_error(exc)
    return result


def run_case(case: str, enable: Callable) -> Dict:
    from hotfix.diagnostics.checker import check_model

    if case == "copy":
        return case_copy(enable)
    mode = [("fork", enable)]
    if case in LAB:
        model, batch = lab_model(case)
        return _compare(check_model(model, batch, modes=mode, rtol=1e-6, cut="raise"))
    model_type, first = REAL[case]
    if not _release_has(first):
        return dict(status="n/a", error=f"absent: transformers has no {model_type} before {first}")
    if case == "whisper":
        from hotfix_lab.infra import tiny_models

        model, batch = tiny_models.BUILDERS["whisper"]()
        return _compare(check_model(model, batch, modes=mode, rtol=1e-6, cut="raise"))
    from hotfix_lab.sweep import sweep_worker  # tools/hotfix_lab/sweep: its builder, inputs and loss

    found = list(sweep_worker._model_types([model_type], with_variants=True))
    name, class_name, config_name = next(((n, c, k) for n, c, k in found if n == model_type), (None, None, None))
    if name is None:
        return dict(status="n/a", error=f"absent: transformers has no {model_type}")
    row = sweep_worker.check_one(name, class_name, config_name, memory_limit=3 * 2**30, time_limit=120,
                                 modes=mode)[0]
    step = row.get("modes", {}).get("fork")
    if step is None:
        return dict(status="error", error=f"{row.get('result')}: {row.get('detail', '')}"[:200])
    status = {"equal": "equal", "wrong": "differs"}.get(step["status"], step["status"])
    return dict(status=status, summary=step["summary"], missing=step["missing"], wrong=step["wrong"],
                max_error=step["max_error"])


def _header(function: str, phase: str) -> None:
    from importlib import metadata

    from hotfix.registry import registry

    fork, _ = fork_loader.FUNCTIONS[function]
    import transformers

    patches = registry.patches()
    print(json.dumps(dict(case="header", phase=phase, function=function, release=metadata.version(fork),
                          transformers=transformers.__version__, hotfix_active=registry.active,
                          applied=sorted(name for name, p in patches.items() if p.applied))), flush=True)


def _run(function: str, module, cases, phase: str) -> None:
    from hotfix.diagnostics.compare import short_error

    enable, why = fork_loader.enabler(function, module)
    for case in cases:
        if enable is None:
            result = dict(status="n/a", error=why)
        else:
            try:
                result = run_case(case, enable)
            except Exception as exc:  # report, do not hide the other cases
                result = dict(status="crash", error=short_error(exc))
        print(json.dumps(dict(case=case, phase=phase, **result)), flush=True)


def main(argv) -> int:
    function, argv = argv[0], argv[1:]
    first, then = (argv[: argv.index("--activate")], argv[argv.index("--activate") + 1:]) \
        if "--activate" in argv else (argv, None)
    import hotfix  # noqa: F401  (activates, unless HOTFIX_DISABLE)

    module = fork_loader.load(fork_loader.FUNCTIONS[function][0])
    phase = "upstream" if os.environ.get("HOTFIX_DISABLE") else "hotfix"
    _header(function, phase)
    _run(function, module, first, phase)
    if then is not None:
        os.environ.pop("HOTFIX_DISABLE", None)
        assert hotfix.activate()
        _header(function, "hotfix")
        _run(function, module, then, "hotfix")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
