"""Load a LlamaFactory or axolotl release's copy of unsloth's offloaded checkpointer on CPU.

The cases run on it live in ``fork_cases.py`` (the script the tests and tools/hotfix_lab/census/forks.py start).

The release comes from sys.path (the caller puts .matrix/<fork>-<version> first on PYTHONPATH), so
importlib.metadata sees its dist-info and hotfix's version gates see the real version.

Why stubs: each fork's package ``__init__`` imports half of its training stack (datasets, trl,
deepspeed, accelerate's launchers...).  We register bare package objects (``__path__`` only, so no
``__init__`` runs) down to the folder holding the checkpointing code, and stand-ins for the two
small modules that code imports from its own package (a logger, LlamaFactory's layer-norm names);
then importing the checkpointing module loads the release's real file.  Its backward moves the saved
activation back with ``.to("cuda")``: on a torch without CUDA that move goes to the CPU
(``zoo_loader.send_cuda_moves_to_the_cpu``).

What each fork's file is, per release (read from every release on PyPI; tools/hotfix_lab/census/forks.py):

* llamafactory: ``llamafactory/model/model_utils/checkpointing.py``; ``get_unsloth_gradient_checkpointing_func``
  (``use_unsloth_gc``, 0.9.0+) and ``get_custom_gradient_checkpointing_func`` (every checkpointed call, 0.8.0+).
* axolotl: ``axolotl/utils/gradient_checkpointing/`` (0.5.2 - 0.9.2) or
  ``axolotl/monkeypatch/gradient_checkpointing/`` (0.10.0+); the wrapper axolotl sets as
  ``transformers.modeling_utils.checkpoint`` (``gradient_checkpointing: unsloth`` / ``offload`` /
  ``offload_disk``).
"""

from __future__ import annotations

import logging
import os
import sys
import types
from functools import partial
from typing import Any, Callable, Optional, Tuple

from hotfix_lab.infra.zoo_loader import send_cuda_moves_to_the_cpu

#: 0.8.0+, 0.7.1
LLAMAFACTORY = ("llamafactory.model.model_utils.checkpointing", "llamafactory.model.utils.checkpointing")
AXOLOTL = ("axolotl.monkeypatch.gradient_checkpointing", "axolotl.utils.gradient_checkpointing")
#: the checkpoint functions of tools/hotfix_lab/census/forks.py and the tests: (fork, variant)
FUNCTIONS = {
    "llamafactory-unsloth": ("llamafactory", "unsloth"),  # use_unsloth_gc: true
    "llamafactory-torch": ("llamafactory", "torch"),  # its default: torch's checkpoint behind its own wrapper
    "axolotl-offload": ("axolotl", "offload"),  # gradient_checkpointing: unsloth / offload (legacy)
    "axolotl-offload-disk": ("axolotl", "offload_disk"),
}


def _root(package: str) -> str:
    """The sys.path entry holding ``package`` (found without importing it)."""
    for entry in sys.path:
        if os.path.isdir(os.path.join(entry or ".", package)):
            return entry or "."
    raise SystemExit(f"no {package} release on sys.path")


def _bare(name: str, path: Optional[str] = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [path] if path else []
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


class _Logger(logging.LoggerAdapter):
    """LlamaFactory's logger methods (``info_rank0``, ``warning_rank0_once``...) on a plain logger."""

    def __getattr__(self, name):
        base = name.replace("_rank0", "").replace("_once", "")
        return getattr(self.logger, base)


def _llamafactory_stubs(root: str) -> None:
    package = os.path.join(root, "llamafactory")
    _bare("llamafactory", package)
    extras = _bare("llamafactory.extras")
    log = types.ModuleType("llamafactory.extras.logging")
    log.get_logger = lambda name=None: _Logger(logging.getLogger(name or "llamafactory"), {})
    constants = types.ModuleType("llamafactory.extras.constants")
    constants.LAYERNORM_NAMES = {"norm", "ln"}
    for module in (log, constants):
        sys.modules[module.__name__] = module
        setattr(extras, module.__name__.rpartition(".")[2], module)
    _bare("llamafactory.model", os.path.join(package, "model"))
    for name in LLAMAFACTORY:
        _bare(name.rpartition(".")[0], os.path.join(root, *name.split(".")[:-1]))


def _axolotl_stubs(root: str) -> None:
    package = os.path.join(root, "axolotl")
    _bare("axolotl", package)
    _bare("axolotl.utils", os.path.join(package, "utils"))
    log = types.ModuleType("axolotl.utils.logging")
    log.get_logger = lambda name=None, **_: logging.getLogger(name or "axolotl")
    sys.modules[log.__name__] = log
    sys.modules["axolotl.utils"].logging = log
    _bare("axolotl.monkeypatch", os.path.join(package, "monkeypatch"))
    _bare("axolotl.kernels", os.path.join(package, "kernels"))  # 0.21+: its AMP decorators, from kernels.utils


def load(fork: str) -> types.ModuleType:
    """Import the release's checkpointing module (the fix's target), with its package stubbed."""
    import importlib.metadata  # noqa: F401  (axolotl's module reads importlib.metadata.version)

    root = _root(fork)
    send_cuda_moves_to_the_cpu()
    if fork == "llamafactory":
        _llamafactory_stubs(root)
        candidates = [(name, os.path.join(root, *name.split(".")) + ".py") for name in LLAMAFACTORY]
    else:
        _axolotl_stubs(root)
        candidates = [(name, os.path.join(root, *name.split("."), "__init__.py")) for name in AXOLOTL]
    for name, path in candidates:
        if os.path.isfile(path):
            return importlib.import_module(name)
    raise SystemExit(f"no checkpointing module in the {fork} release at {root}")


def _disk_on_cpu(module: types.ModuleType) -> None:
    """Disco's manager, made before its first use with prefetching into host memory (no CUDA here)."""
    disco = getattr(module, "Disco", None)
    if disco is not None and disco._manager is None:
        manager_class = sys.modules[disco.__module__].DiskOffloadManager
        disco._manager = manager_class(prefetch_size=1, prefetch_to_gpu=False, save_workers=1)


def axolotl_wrapper(module: types.ModuleType, variant: str) -> Optional[Callable]:
    """The function axolotl sets as ``transformers.modeling_utils.checkpoint`` for ``variant``, or None."""
    if variant == "offload_disk":
        return getattr(module, "hf_grad_checkpoint_disk_offload_wrapper", None)
    # 0.5.2 - 0.7.0 call it the unsloth wrapper (``gradient_checkpointing: unsloth``)
    return getattr(module, "hf_grad_checkpoint_offload_wrapper", None) or \
        getattr(module, "hf_grad_checkpoint_unsloth_wrapper", None)


def enabler(function: str, module: types.ModuleType) -> Tuple[Optional[Callable[[Any], None]], str]:
    """``(enable(model), "")``: turns checkpointing on through the fork as the fork does; ``(None, why)`` where
    the release has no such function."""
    fork, variant = FUNCTIONS[function]
    if fork == "llamafactory":
        if variant == "unsloth" and not hasattr(module, "get_unsloth_gradient_checkpointing_func"):
            return None, "absent: no use_unsloth_gc before llamafactory 0.9.0"
        if not hasattr(module, "_gradient_checkpointing_enable"):
            return None, "absent: no _gradient_checkpointing_enable"

        def enable_llamafactory(model):
            # prepare_model_for_training: the model's enabler becomes LlamaFactory's (read now: a fix may
            # have replaced it), then it is called
            options = {"use_unsloth_gc": True} if variant == "unsloth" else {}
            method = partial(module._gradient_checkpointing_enable, **options)
            model.gradient_checkpointing_enable = types.MethodType(method, model)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

        return enable_llamafactory, ""
    wrapper = axolotl_wrapper(module, variant)
    if wrapper is None:
        return None, f"absent: no {variant} wrapper in this release"

    def enable_axolotl(model):
        # PatchManager._apply_gradient_checkpointing_patches, then the Trainer's enable call
        import transformers.modeling_utils

        _disk_on_cpu(module)
        transformers.modeling_utils.checkpoint = axolotl_wrapper(module, variant)  # read now: a fix may wrap it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

    return enable_axolotl, ""
