"""llamafactory >= 0.9.0: ``use_unsloth_gc``'s checkpoint returns a gradient for ``hidden_states`` only.

What breaks: LlamaFactory's copy of unsloth's first offloading Function recomputes a layer with its other
arguments as the original objects and returns one gradient: a tensor needing grad passed any other way
(Gemma-3n/4's per-layer inputs, a keyword in transformers >= 4.52's ``partial``) is walked again ("Trying to
backward through the graph a second time", LlamaFactory#10395); a layer returning several values (Whisper),
or before 0.9.3 a tensor, fails.

How this fixes it: ``get_unsloth_gradient_checkpointing_func``'s checkpoint calls the same Function through
``checkpointing.forks.checkpoint_through`` (every input and output connected, LlamaFactory's offload kept).
A plain function (models stay deep-copyable); revert restores the attribute.  LlamaFactory's wrapper of
every checkpointed call reads the layer from ``func.__self__``: hotfix's wrappers of the call show it
(``checkpointing.layer_call``).  docs/fixes/llamafactory-unsloth-gc.md.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

from hotfix import Mechanism, Patch
from hotfix.checkpointing import BACKWARD_TWICE

UNSLOTH_FACTORY = "get_unsloth_gradient_checkpointing_func"

#: what ``checkpoint_through`` reports -> the mechanism whose repair it is
REPAIRS = {"inputs": "unsloth-gc-extra-inputs", "outputs": "unsloth-gc-several-outputs",
           "tensor": "unsloth-gc-tensor-output"}
SAID = {
    "unsloth-gc-extra-inputs": "tensors besides hidden_states got their gradients through use_unsloth_gc's checkpoint",
    "unsloth-gc-several-outputs": "a layer returning several values went through use_unsloth_gc's checkpoint",
    "unsloth-gc-tensor-output": "a layer returning a tensor went through use_unsloth_gc's checkpoint",
}


class LlamaFactoryUnslothGC(Patch):
    name = "llamafactory-unsloth-gc"
    # model/model_utils/ since 0.8.0 (0.7.1 kept the module in model/utils/, years before use_unsloth_gc)
    targets = ("llamafactory.model.model_utils.checkpointing",)
    # Ranges equal to the fork census's evidence (docs/census/forks.md, tools/hotfix_lab/census/forks.py): every release
    # on PyPI was read and measured.  0.9.0 is the first with use_unsloth_gc.
    mechanisms = (
        Mechanism("unsloth-gc-extra-inputs", {"llamafactory": ">=0.9.0"},
                  summary="use_unsloth_gc: a tensor needing grad besides hidden_states (by keyword, positional) "
                          "is re-walked and gets no gradient (Gemma-3n/4, Whisper)"),
        Mechanism("unsloth-gc-several-outputs", {"llamafactory": ">=0.9.0"},
                  summary="use_unsloth_gc: a layer returning several values (its backward takes one gradient)"),
        Mechanism("unsloth-gc-tensor-output", {"llamafactory": ">=0.9.0,<0.9.3"}, fixed_in="0.9.3",
                  summary="use_unsloth_gc: a layer returning a tensor (its backward unpacks a 1-tuple)"),
    )
    symptom = f"{BACKWARD_TWICE} - LlamaFactory use_unsloth_gc: true (Gemma-4, Whisper)"
    upstream = "hiyouga/LlamaFactory#10395 (src/llamafactory/model/model_utils/checkpointing.py, since 0.9.0)"
    fixed_in = None  # 0.9.5 (latest) still has it

    def drift(self, module: Any) -> Optional[str]:
        factory = getattr(module, UNSLOTH_FACTORY, None)
        if factory is None:
            return f"{UNSLOTH_FACTORY} is missing"
        # Read, not called: the class it defines is made per call (and its decorators warn on torch >= 2.4).
        from hotfix.checkpointing.code import code_objects

        forward = [code for code in code_objects(factory) if code.co_name == "forward"]
        if len(forward) != 1 or not any(code.co_name == "backward" for code in code_objects(factory)):
            return f"{UNSLOTH_FACTORY} no longer defines one Function with forward and backward"
        code = forward[0]
        if code.co_argcount != 3 or not code.co_flags & inspect.CO_VARARGS:
            return f"{UNSLOTH_FACTORY}'s Function is no longer forward(ctx, forward_function, hidden_states, *args)"
        return None

    def _apply(self, module: Any) -> None:
        from hotfix.checkpointing.forks import RepairNotice, checkpoint_through

        notice = RepairNotice(self, REPAIRS, SAID)
        factory = getattr(module, UNSLOTH_FACTORY)

        @functools.wraps(factory)
        def get_unsloth_gradient_checkpointing_func(*args, **kwargs):
            apply = factory(*args, **kwargs)

            @functools.wraps(apply)
            def unsloth_checkpoint(function, *inputs, **options):
                if options or not inputs:  # apply(forward_function, hidden_states, *args) is all LlamaFactory makes
                    return apply(function, *inputs, **options)
                return checkpoint_through(apply, function, inputs, notice)

            unsloth_checkpoint.__self__ = getattr(apply, "__self__", None)  # LlamaFactory copies it onto its wrapper
            return unsloth_checkpoint

        self.replace(module, UNSLOTH_FACTORY, get_unsloth_gradient_checkpointing_func)


patch = LlamaFactoryUnslothGC()
