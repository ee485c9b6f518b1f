"""transformers >= 4.53: tensors passed by keyword to a checkpointed layer lose their gradient path.

What breaks
-----------
From 4.53 (PR 38913) every model layer subclasses
``transformers.modeling_layers.GradientCheckpointingLayer``, which, while
checkpointing and training, calls::

    self._gradient_checkpointing_func(partial(<layer call>, **kwargs), *args)

Only ``args`` become inputs of the checkpoint.  A keyword tensor that requires
grad (Whisper decoder's ``encoder_hidden_states=``, WavLM's ``position_bias=``,
DeBERTa-v2's ``rel_embeddings=``) sits in the closure; with reentrant
checkpointing (the 4.x default) each layer's backward re-walks its history:
"RuntimeError: Trying to backward through the graph a second time", unbounded
memory (WavLM), or parameters that silently get no gradient (LayoutLM,
Whisper with frozen decoder embeddings).  In 5.x the call moved into a
per-class ``forward_with_checkpointing`` made by ``__init_subclass__``; the
``partial(..., **kwargs)`` call is the same, so the same fix covers both.

The mirror image on the way out: reentrant checkpointing connects only the
*top-level* tensors a layer returns.  ``PvtV2EncoderLayer`` (a whole stage)
returns ``((hidden_states,), height, width)``: the nested hidden states leave
the checkpoint detached, and every parameter before the last stage silently
gets no gradient (tiny pvt_v2: 52 of 54 tensors, 4.53.3 to 5.23.0).

The same on a side channel: 5.x Gemma-4 with KV sharing (``num_kv_shared_layers``,
E2B/E4B) has one layer store its keys/values into ``shared_kv_states``, a
mapping every layer is handed, for later layers to read.  Stored during a
no-grad forward, they are constants: wrong gradients, no error (tiny Gemma-4,
5.23.0: 24 of 63 parameter gradients, up to 46 % off).  And through a cache:
5.x DiffusionGemma's decoder layers read the encoder's keys/values from
``past_key_values`` (a ``DynamicCache``), so each layer's recomputation walks
the encoder's graph again ("Trying to backward through the graph a second
time", tiny DiffusionGemma, 5.23.0, full fine-tuning and LoRA).  And for an
output the loss never uses (``LiltLayer`` returns text and layout streams; the
last layout output is discarded): the checkpoint is handed zeros for it, and
the parameters feeding only it get zero gradients where a run without
checkpointing gives them none (tiny LiLT, 5.23.0).

How this patch fixes it
-----------------------
Both shapes read ``self._gradient_checkpointing_func`` at call time.  We put a
data descriptor of that name on ``GradientCheckpointingLayer``
(``hotfix.patches._checkpoint_slot``): the function that transformers (or unsloth, or
PEFT) stores on each layer stays in the layer's ``__dict__`` untouched (copies
and pickles of the model hold no hotfix object), and reading it returns that
same function wrapped (wrapt ``FunctionWrapper``) so that closure tensors
needing grad are lifted into real checkpoint inputs
(``hotfix.patches._checkpoint_inputs``).  Because a data descriptor on the class wins
over the instance dict, layers built before hotfix was imported are fixed too,
whatever checkpoint function they hold.  Tensors in containers, shared
mappings and caches handed to the layer are lifted the same way.  When the
checkpoint is reentrant,
the layer call is also wrapped in ``hotfix.patches._checkpoint_outputs.FlatOutputs``:
if its output nests a tensor, the checkpoint returns all of them as one flat
tuple of outputs, and the layer's own structure is rebuilt around them after
the call.  A call handed a mutable mapping has its layer call watched
(``hotfix.patches._checkpoint_shared_state``): tensors it stores there become
further checkpoint outputs and are stored back connected; later layers then
get them lifted into their inputs.  A call with two or more outputs needing
grad has them hooked (``FlatOutputs.watch_unused``): one that gets no gradient
in backward is detached in the recomputation.  Under ``torch.compile`` the raw
function is handed out: dynamo traces the checkpoint itself, and the bug does
not occur there.
The wrapper only runs where transformers already decided to checkpoint
(``gradient_checkpointing and training``); with nothing to lift it makes the
original call unchanged.  Reverting deletes the descriptor: every layer sees
its original function again.
"""

from __future__ import annotations

from typing import Any, Optional

from hotfix.patches._checkpoint_slot import ATTRIBUTE, CheckpointFunctionSlot, code_objects
from hotfix.patch import Mechanism, Patch


def _checkpoint_with_lifted_inputs(wrapped, instance, args, kwargs):
    """wrapt wrapper around a layer's checkpoint function."""
    # Imported here, not at module level: loading this patch must not import
    # torch (a tokenizer-only user has transformers without torch); by the time
    # a layer checkpoints, torch is loaded anyway.
    from hotfix.patches._checkpoint_inputs import is_reentrant, lift_closure_tensors
    from hotfix.patches._checkpoint_outputs import FlatOutputs
    from hotfix.patches._checkpoint_shared_state import SharedStateWrites

    if not args:
        return wrapped(*args, **kwargs)
    function, inputs = args[0], args[1:]
    reentrant = is_reentrant(wrapped, kwargs)  # non-reentrant connects nested outputs and stored tensors itself
    watched = SharedStateWrites.around(function, inputs) if reentrant else None
    writes = None
    if watched is not None:
        writes, function, inputs = watched
    lifted = lift_closure_tensors(function, inputs)
    if lifted is not None:
        patch.repaired("tensors passed by keyword became checkpoint inputs")
        function, inputs = lifted
    if not reentrant:
        return wrapped(function, *inputs, **kwargs)
    outputs = FlatOutputs(function, writes, notice=_notice_unused_outputs)
    result = wrapped(outputs, *inputs, **kwargs)
    outputs.watch_unused(result)
    result = outputs.rebuild(result)
    if outputs.nested:
        patch.repaired("tensors nested in a layer's output or stored into a shared mapping became checkpoint outputs")
    return result


def _notice_unused_outputs() -> None:
    patch.repaired("a layer output the loss does not use gets no gradient, not zeros")


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


class TransformersKeywordTensors(Patch):
    name = "transformers-keyword-tensors"
    targets = ("transformers.modeling_layers",)
    affected = {"transformers": ">=4.53.0"}
    # Provisional ranges from reading upstream; tools/census/ measures every release line against them.
    mechanisms = (
        Mechanism("keyword-tensors", {"transformers": ">=4.53.0"},
                  summary="a tensor needing grad passed by keyword (Whisper encoder_hidden_states=, DeBERTa-v2, WavLM, "
                          "LayoutLM)"),
        Mechanism("nested-outputs", {"transformers": ">=4.53.0"},
                  summary="a layer output that nests its tensors (pvt_v2's ((hidden,), h, w))"),
        Mechanism("shared-mapping", {"transformers": ">=4.53.0"},
                  summary="tensors a layer stores into a mapping shared across layers (Gemma-3n/4 KV sharing)"),
        Mechanism("cache-contents", {"transformers": ">=4.56.0"},
                  summary="keys/values a layer reads from a Cache it is handed (DiffusionGemma's decoder)"),
        Mechanism("unused-outputs", {"transformers": ">=4.53.0"},
                  summary="a layer output the loss never uses gets zeros instead of no gradient (LiLT)"),
    )
    symptom = (
        "RuntimeError: Trying to backward through the graph a second time - Whisper training "
        "with gradient checkpointing (decoder gets encoder_hidden_states= by keyword)"
    )
    details = (
        "Any GradientCheckpointingLayer given a grad-requiring tensor by keyword under reentrant "
        "checkpointing: Whisper (crash; frozen decoder embeddings: silent missing grads), "
        "DeBERTa-v2 rel_embeddings= (crash), WavLM position_bias= (memory grows without bound), "
        "LayoutLM (silent missing grads), third-party layers. The tensors become checkpoint inputs. "
        "Also a layer's output that nests its tensors (pvt_v2: ((hidden,), h, w); silent missing grads): "
        "they become checkpoint outputs. Also tensors a layer stores into a mapping shared across layers "
        "(5.x Gemma-4 KV sharing, num_kv_shared_layers > 0: silently wrong gradients): they become checkpoint "
        "outputs, stored back connected. Also keys/values a layer reads from a Cache it is handed (5.x "
        "DiffusionGemma decoder: crash): they become checkpoint inputs. Also a layer output the loss never uses (LiLT's "
        "last layout stream: zero gradients where none are due): it gets no gradient, as without checkpointing."
    )
    upstream = "huggingface/transformers#38913 (GradientCheckpointingLayer, first in 4.53.0)"
    fixed_in = None  # no release fixes the general case as of 5.23.0

    def drift(self, module: Any) -> Optional[str]:
        layer = getattr(module, "GradientCheckpointingLayer", None)
        if not isinstance(layer, type):
            return "GradientCheckpointingLayer is missing"
        if not calls_checkpoint_with_partial(layer):
            return "GradientCheckpointingLayer no longer calls self._gradient_checkpointing_func(partial(...), *args)"
        return None

    def _apply(self, module: Any) -> None:
        from torch.compiler import is_compiling  # modeling_layers imported torch already

        layer = module.GradientCheckpointingLayer
        self.replace(layer, ATTRIBUTE, CheckpointFunctionSlot(layer, _checkpoint_with_lifted_inputs, is_compiling))


patch = TransformersKeywordTensors()
