"""Config variants that switch on optional paths known to pass tensors between layers.

A model type's default config can skip the path where a checkpointed layer receives a tensor
that needs grad other than as its first positional input — the class of bug hotfix repairs.
Each variant here is swept as its own row, ``<model_type>+<name>`` (outside the coverage count,
which counts model types):

``deberta-v2+layer_norm``  relative attention with ``norm_rel_ebd="layer_norm"``: the layer-normed
                           relative embeddings reach every layer as ``rel_embeddings=`` (keyword,
                           needs grad): reentrant checkpointing crashes or drops their gradient.
``gemma4+kv_shared``       (5.x) the last layers reuse the keys/values of an earlier layer of the
                           same type (``num_kv_shared_layers``): the shared key/value tensors pass
                           from layer to layer outside the positional inputs.
``gemma4+kv_shared_cache``  the same with the config's ``use_cache=True`` kept (what a model loaded from
``gemma3n_text+cache``      the Hub trains with): the step without checkpointing builds a Cache, the
                           checkpointed one cannot keep it (GradientCheckpointingLayer sets
                           ``past_key_values=None``).  Where a release shares the keys/values through
                           that Cache (Gemma-4 5.5.0 - 5.5.1, huggingface/transformers#45242; Gemma-3n
                           before its ``shared_kv_states``), checkpointing loses the sharing; the other
                           variants, like every sweep row, run with ``use_cache=False`` on both sides.
"""

from __future__ import annotations


def _deberta_layer_norm(config):
    config.relative_attention = True
    config.norm_rel_ebd = "layer_norm"
    config.position_buckets = 8
    config.pos_att_type = ["p2c", "c2p"]
    config.max_relative_positions = -1


def _gemma4_kv_shared(config):
    text = getattr(config, "text_config", None) or config
    # two producer layers (one per attention type), then two consumers reusing their keys/values
    text.num_hidden_layers = 4
    text.layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    text.num_kv_shared_layers = 2
    # the per-layer input embedding keeps its 262144 rows otherwise: over the 1 GiB step guard at 4 layers
    if getattr(text, "vocab_size_per_layer_input", None):
        text.vocab_size_per_layer_input = text.vocab_size


def _keep_cache(config):
    # shrink_config turned it off for every model; on, as in the released checkpoints' configs
    (getattr(config, "text_config", None) or config).use_cache = True


def _gemma4_kv_shared_cache(config):
    _gemma4_kv_shared(config)
    _keep_cache(config)


VARIANTS = {
    "deberta-v2": {"layer_norm": _deberta_layer_norm},
    "gemma4": {"kv_shared": _gemma4_kv_shared, "kv_shared_cache": _gemma4_kv_shared_cache},
    "gemma3n_text": {"cache": _keep_cache},
}
