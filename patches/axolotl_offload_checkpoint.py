"""axolotl >= 0.5.2: the offloading checkpoints return a gradient for ``hidden_states`` only.

What breaks: ``gradient_checkpointing: offload`` (``unsloth``) and ``offload_disk`` run axolotl's copies of
unsloth's first offloading Function, which recompute a layer with its other arguments as the original
objects and return one gradient: a tensor needing grad passed any other way (by keyword from transformers
4.52, Whisper, Gemma-3n) is walked again ("Trying to backward through the graph a second time"); a layer
returning several values fails, and before 0.15.0 (axolotl#3412) one returning a tensor.  Its wrapper reads
``decoder_layer.func.__self__``: hotfix's transformers fixes act through this fix's wrappers only (``hotfix.relations``).

How this fixes it: each wrapper (``hf_grad_checkpoint_*``, module attributes axolotl reads when it sets up
training) is replaced by a function under its name that calls the same Function through
``checkpointing.forks.checkpoint_through`` (every input and output connected, axolotl's offload kept); not
training, the wrapper as written.  Plain functions (models stay deep-copyable and picklable); revert
restores the attributes.  docs/fixes/axolotl-offload-checkpoint.md.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing import BACKWARD_TWICE

#: the wrappers axolotl sets as transformers' checkpoint (0.5.2 - 0.7.0 call the first the unsloth wrapper)
WRAPPERS = ("hf_grad_checkpoint_offload_wrapper", "hf_grad_checkpoint_unsloth_wrapper",
            "hf_grad_checkpoint_disk_offload_wrapper")

#: what ``checkpoint_through`` reports -> the mechanism whose repair it is, for the host copy and the disk copy
REPAIRS = {
    "host": {"inputs": "offload-extra-inputs", "outputs": "offload-several-outputs", "tensor": "offload-tensor-output"},
    "disk": {"inputs": "offload-extra-inputs", "outputs-none": "offload-several-outputs"},  # Disco takes every gradient
}
SAID = {
    "offload-extra-inputs": "tensors besides hidden_states got their gradients through axolotl's offloading checkpoint",
    "offload-several-outputs": "a layer returning several values went through axolotl's offloading checkpoint",
    "offload-tensor-output": "a layer returning a tensor went through axolotl's offloading checkpoint",
}


def function_of(module: Any, wrapper: Any) -> Any:
    """The ``torch.autograd.Function`` of ``module`` that ``wrapper``'s code names: one, or None."""
    import torch

    names = set(getattr(getattr(wrapper, "__code__", None), "co_names", ()))
    found = [value for name, value in vars(module).items() if name in names and isinstance(value, type)
             and issubclass(value, torch.autograd.Function)]
    return found[0] if len(found) == 1 else None


def _bound_call(function: Any) -> bool:
    """Is ``function`` transformers' own call, a bound method or a partial of one, that axolotl's wrapper reads?

    Not hotfix's wrappers of the call: they show its layer too (``checkpointing.layer_call``), but axolotl's wrapper calls
    that layer in their place (without their lifted inputs or anchor), or reads a ``.func`` they do not have.
    """
    if isinstance(function, functools.partial):
        function = function.func
    return inspect.ismethod(function)


class AxolotlOffloadCheckpoint(Patch):
    name = "axolotl-offload-checkpoint"
    targets = ("axolotl.monkeypatch.gradient_checkpointing", "axolotl.utils.gradient_checkpointing")
    # Ranges equal to the fork census's evidence (docs/census/forks.md, tools/hotfix_lab/census/forks.py): every release
    # on PyPI was read and measured; 0.5.2 is the first with code (0.5.0's distributions are empty).
    mechanisms = (
        Mechanism("offload-extra-inputs", {"axolotl": ">=0.5.2"},
                  summary="a tensor needing grad besides hidden_states (by keyword, positional) is re-walked and "
                          "gets no gradient (Whisper, Gemma-3n)"),
        Mechanism("offload-several-outputs", {"axolotl": ">=0.5.2"},
                  summary="a layer returning several values: the host copy's backward takes one gradient, the disk "
                          "copy (0.9.2+) hands a None among them to autograd (Whisper's (hidden, None))"),
        Mechanism("offload-tensor-output", {"axolotl": ">=0.5.2,<0.15.0"}, fixed_in="0.15.0",
                  summary="offload (host): a layer returning a tensor (its backward unpacks a 1-tuple)"),
    )
    symptom = (f"{BACKWARD_TWICE} - axolotl gradient_checkpointing: offload (Whisper, Gemma-3n); "
               "ValueError: too many values to unpack (tensor-returning layers)")
    upstream = ("axolotl-ai-cloud/axolotl#1528 (the copy, 0.5.2+), #3412 (tensor outputs, 0.15.0); "
                "monkeypatch/gradient_checkpointing/offload_cpu.py, offload_disk.py")
    fixed_in = None  # 0.19.0 (latest) still has it

    def _functions(self, module: Any) -> Dict[str, Any]:
        """wrapper name -> the Function it calls, for every wrapper the module has."""
        return {name: function_of(module, getattr(module, name)) for name in WRAPPERS if hasattr(module, name)}

    def drift(self, module: Any) -> Optional[str]:
        from hotfix.checkpointing.forks import function_drift

        functions = self._functions(module)
        if not functions:
            return "none of " + ", ".join(WRAPPERS) + " is there"
        for name, cls in functions.items():
            if cls is None:
                return f"{name} no longer calls one torch.autograd.Function of the module"
            reason = function_drift(cls, cls.__name__)
            if reason:
                return reason
        return None

    def _apply(self, module: Any) -> None:
        from hotfix.checkpointing.forks import RepairNotice, checkpoint_through

        def through(wrapper: Any, cls: Any):
            notice = RepairNotice(self, REPAIRS["disk" if cls.__name__ == "Disco" else "host"], SAID)

            # A plain function under the wrapper's own name, not a wrapt proxy: the layers hold
            # partial(it, use_reentrant=...), and a model must stay deep-copyable and picklable.
            @functools.wraps(wrapper)
            def offload_through(function, *inputs, **kwargs):
                def unchanged():
                    # axolotl's wrapper replaces the call by the layer it reads from it; hotfix's wrapper of
                    # the call (the transformers fixes) must run: the same Function, with it as the layer call
                    if _bound_call(function):
                        return wrapper(function, *inputs, **kwargs)
                    return cls.apply(function, *inputs)

                return checkpoint_through(cls.apply, function, inputs, notice, unchanged)

            return offload_through

        for name, cls in self._functions(module).items():
            self.replace(module, name, through(getattr(module, name), cls))


patch = AxolotlOffloadCheckpoint()
