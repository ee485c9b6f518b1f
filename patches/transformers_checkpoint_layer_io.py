"""transformers >= 4.35: a reentrant-checkpointed layer's inputs and outputs that the checkpoint cannot see.

What breaks: ``GradientCheckpointingLayer`` (4.52+) checkpoints ``partial(layer, **kwargs)`` with only
the positional tensors as inputs.  Under reentrant checkpointing a tensor needing grad that reaches the
layer any other way (by keyword, in a container, a shared mapping or a Cache) is re-walked by every
recomputation ("Trying to backward through the graph a second time", Whisper) or cut off (LayoutLM).
On every release, also where a model calls ``self._gradient_checkpointing_func(layer.__call__, ...)``
itself, nested outputs are cut off (pvt_v2, LiLT), tensors stored into a shared mapping are constants
(Gemma-3n/4 KV sharing), and a discarded output gets zeros instead of no gradient (LiLT).

How this fixes it: slots on the classes that receive a checkpoint function hand it out wrapped; the
wrapper lifts those tensors into checkpoint inputs and returns nested/stored tensors as extra outputs
(``checkpointing.inputs``/``outputs``/``shared_state``; what a call holds: ``checkpointing.structure``; an unsloth
backward that needs its first input to need grad gets a 0-byte anchor first).  Nothing to lift, or a
non-reentrant call: the original call.  docs/fixes/transformers-checkpoint-layer-io.md.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from hotfix import Lost, Mechanism
from hotfix.checkpointing import BACKWARD_TWICE
from hotfix.checkpointing.code import code_objects
from hotfix.checkpointing.slot import ATTRIBUTE
from hotfix.checkpointing.slot_fix import MODELING_UTILS, CheckpointFunctionFix, on_every_reached_release

#: transformers 4.52+: GradientCheckpointingLayer, which binds keywords in a partial
MODELING_LAYERS = "transformers.modeling_layers"


def checkpoint_with_lifted_inputs(fix: CheckpointFunctionFix) -> Callable:
    """The wrapt wrapper the slots put around a layer's checkpoint function, reporting through ``fix``.

    Built when the fix first applies, not at module level: loading this patch must not import
    torch (a tokenizer-only user has transformers without torch), and the targets have imported
    it by then.  Bound once here, the helpers cost no import per checkpointed call.
    """
    import torch

    from hotfix.checkpointing.inputs import anchored, first_input_needs_grad, is_reentrant, lift_closure_tensors
    from hotfix.checkpointing.outputs import FlatOutputs
    from hotfix.checkpointing.shared_state import UNSAFE, SharedStateWrites
    from hotfix.checkpointing.structure import hides_nothing
    from hotfix.checkpointing.torch_wrapper import packed_upstream
    from hotfix.checkpointing.unsloth import FirstInputRule

    tensor = torch.Tensor
    first_input = FirstInputRule(fix)
    unused_claimed = []  # once the unused-outputs repair was claimed, later calls skip the check

    def notice_unused_outputs() -> None:
        unused_claimed.append(True)
        fix.repaired("a layer output the loss does not use gets no gradient, not zeros")

    def lift_layer_inputs(wrapped, instance, args, kwargs):  # named: a wrapper chain reads which fix is where
        # Non-reentrant checkpointing connects keyword, nested and stored tensors itself: the call as made.
        if not args or not is_reentrant(wrapped, kwargs):
            return wrapped(*args, **kwargs)
        function, inputs = args[0], args[1:]
        writes = None
        # handed down: where nothing needing grad hides from the checkpoint, frozen-inputs need not look again
        no_hidden_grad = hides_nothing(function, inputs)
        if not no_hidden_grad:
            packed = packed_upstream(wrapped, function)  # torch's checkpoint_wrapper made these inputs itself
            watched = SharedStateWrites.around(function, inputs, warn=fix.warn_once)
            if watched is UNSAFE:  # a mapping without a private copy: the call as upstream makes it (said once)
                return wrapped(*args, **kwargs)
            if watched is not None:
                writes, function, inputs = watched
            count = len(inputs)
            lifted = lift_closure_tensors(function, inputs)
            if lifted is not None:
                function, inputs = lifted
                # A lifted leaf (a parameter by keyword) is right upstream too: its gradient accumulates
                # directly.  A tensor with a history is re-walked by each recomputation upstream.
                if any(tensor.grad_fn is not None and id(tensor) not in packed for tensor in inputs[count:]):
                    fix.repaired("tensors passed by keyword became checkpoint inputs")
                if not first_input_needs_grad(inputs) and first_input.needs_grad_first():
                    function, inputs = anchored(function, inputs, first=True)
            elif isinstance(function, functools.partial):  # searched (bound values, nested inputs), none needs grad
                no_hidden_grad = True
        outputs = FlatOutputs(function, writes, notice=None if unused_claimed else notice_unused_outputs,
                              no_hidden_grad=no_hidden_grad)
        result = wrapped(outputs, *inputs, **kwargs)
        # one tensor back from a layer that nests nothing (the usual call): no outputs to watch, nothing to rebuild
        # (a nested output comes back as a tuple, or bare from a checkpoint that unwraps a tuple of one: rebuilt)
        if type(result) is not tensor or outputs.nested:
            outputs.watch_unused(result)
            if outputs.nested:
                fix.repaired("tensors nested in a layer's output or stored into a shared mapping became checkpoint "
                             "outputs")
                return outputs.rebuild(result)
        return result

    return lift_layer_inputs


def calls_checkpoint_with_partial(layer_class: type) -> bool:
    """Does the layer class read ``_gradient_checkpointing_func`` next to ``partial``?

    True for 4.53-4.57 (``__call__``) and 5.x (``__init_subclass__`` ->
    ``forward_with_checkpointing``).  False means upstream rewrote the call
    and this patch's assumptions no longer hold.
    """
    for attribute in ("__call__", "__init_subclass__", "forward"):
        for code in code_objects(layer_class.__dict__.get(attribute)):
            if ATTRIBUTE in code.co_names and "partial" in code.co_names:
                return True
    return False


# Where upstream drops the state before any checkpoint function sees it (census: docs/versions.md): under
# checkpointing, GradientCheckpointingLayer sets past_key_values=None, so what a layer shares through the Cache
# is gone from the checkpointed forward, with any checkpoint function (non-reentrant too).  Measured against a
# step without checkpointing with use_cache=True, the released configs' default (the census's "+cache" cells).
GEMMA3N_CACHE_SHARING = (
    "Gemma-3n shares keys/values between layers (num_kv_shared_layers) through the Cache, which checkpointing "
    "drops (GradientCheckpointingLayer sets past_key_values=None): with use_cache=True (its config's default) the "
    "shared layers compute their own, another forward than without checkpointing (5.0 builds the Cache in training "
    "too; 5.6 shares them outside the Cache)")
GEMMA4_CACHE_SHARING = (
    "Gemma-4 with num_kv_shared_layers (E2B/E4B) shares keys/values between layers through the Cache, which "
    "checkpointing drops (GradientCheckpointingLayer sets past_key_values=None): with use_cache=True (its config's "
    "default) the shared layers compute their own, another forward than without checkpointing "
    "(huggingface/transformers#45242; 5.5.2 shares them outside the Cache, #45312)")
DIFFUSION_GEMMA_CACHE = (
    "DiffusionGemma's decoder reads the encoder's keys/values from the Cache, which checkpointing drops "
    "(GradientCheckpointingLayer sets past_key_values=None): another forward than without checkpointing (5.12 - "
    "5.14 turn checkpointing off for the model; 5.15 keeps the Cache)")


class TransformersCheckpointLayerIO(CheckpointFunctionFix):
    name = "transformers-checkpoint-layer-io"
    aliases = ("transformers-keyword-tensors",)  # its name until 0.1.0; still accepted as an opt-out
    reentrant_only = True  # its wrapper hands every non-reentrant call on as it is
    # modeling_utils: the classes models store a checkpoint function on (direct callers, every release);
    # modeling_layers (4.52+): GradientCheckpointingLayer, which binds keywords in a partial.
    targets = (MODELING_UTILS, MODELING_LAYERS)
    # Ranges equal to the census's evidence (docs/versions.md, tests/versions/test_version_gates.py).
    # Below 4.35.0 each model calls torch's checkpoint from its own code (no gradient_checkpointing_func
    # to hook): LiLT's nested and unused outputs are older than that, and out of this fix's reach.
    mechanisms = (
        Mechanism("keyword-tensors", {"transformers": ">=4.52.0"},
                  summary="a tensor needing grad passed by keyword (Whisper encoder_hidden_states=, DeBERTa-v2, WavLM, "
                          "LayoutLM, a third-party GradientCheckpointingLayer)"),
        on_every_reached_release("nested-outputs",
            "a layer output that nests its tensors (pvt_v2's ((hidden,), h, w), LiLT before 4.53)"),
        Mechanism("shared-mapping", {"transformers": ">=4.53.0"},
                  summary="tensors a layer stores into a mapping shared across layers (Gemma-3n/4 KV sharing)",
                  lost=(Lost({"transformers": ">=5.0.0,<5.6.0"}, GEMMA3N_CACHE_SHARING, ("gemma3n", "gemma3n_text")),
                        Lost({"transformers": ">=5.5.0,<5.5.2"}, GEMMA4_CACHE_SHARING, ("gemma4", "gemma4_text")))),
        Mechanism("cache-contents", {"transformers": ">=4.56.0"},
                  summary="keys/values a layer reads from a Cache it is handed (DiffusionGemma's decoder)",
                  lost=(Lost({"transformers": ">=5.11.0,<5.12.0"}, DIFFUSION_GEMMA_CACHE, ("diffusion_gemma",)),)),
        on_every_reached_release("unused-outputs",
            "a layer output the loss never uses gets zeros instead of no gradient (LiLT)"),
    )
    symptom = (f"{BACKWARD_TWICE} - Whisper training with gradient checkpointing (decoder gets "
               "encoder_hidden_states= by keyword)")
    upstream = ("huggingface/transformers#38913 (every layer on GradientCheckpointingLayer, 4.53.0; the class "
                "itself since 4.52.0)")
    fixed_in = None  # no release fixes the general case as of 5.23.0

    def build_wrapper(self) -> Callable:
        return checkpoint_with_lifted_inputs(self)

    def drift(self, module: Any) -> Optional[str]:
        if module.__name__ != MODELING_LAYERS:
            return super().drift(module)
        layer = getattr(module, "GradientCheckpointingLayer", None)
        if not isinstance(layer, type):
            return "GradientCheckpointingLayer is missing"
        if not calls_checkpoint_with_partial(layer):
            return "GradientCheckpointingLayer no longer calls self._gradient_checkpointing_func(partial(...), *args)"
        return None

    def _apply(self, module: Any) -> None:
        super()._apply(module)
        if module.__name__ == MODELING_LAYERS:  # transformers' own class: its slot serves every such layer
            layer = module.GradientCheckpointingLayer
            self.replace(layer, ATTRIBUTE, self.coverage.slot(layer))


patch = TransformersCheckpointLayerIO()
