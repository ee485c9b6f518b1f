"""The sweep's generic shrink: a config's usual size fields set small, dropout off (sweep_families' fixes run after it
and may call it on a sub-config; the worker calls it first)."""

from __future__ import annotations

SMALL = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "hidden_dim": 64,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "num_key_value_heads": 2, "num_kv_heads": 2,
    "intermediate_size": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "ffn_dim": 64, "d_ff": 64,
    "n_inner": 64, "d_kv": 16, "head_dim": 16, "attention_head_size": 16,
    "vocab_size": 128, "max_position_embeddings": 64, "n_positions": 64,
    "num_experts": 2, "num_local_experts": 2, "n_routed_experts": 2, "num_experts_per_tok": 1,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "kv_lora_rank": 16,
    "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "image_size": 32, "patch_size": 8, "num_mel_bins": 8, "max_source_positions": 16,
    "max_target_positions": 32, "projection_dim": 32, "projection_size": 32, "encoder_hidden_size": 32,
}
_LIST_LAYER_ATTRS = ("depths", "hidden_sizes", "num_heads", "embed_dims")


def shrink_config(config, depth: int = 0):
    """Set the usual size fields of a config (and its sub-configs) small; dropout off."""
    from transformers import PretrainedConfig

    for key, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig) and depth < 3:
            shrink_config(value, depth + 1)
        elif key in SMALL and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, key, min(value, SMALL[key]))
        elif isinstance(value, float) and ("dropout" in key or key.endswith(("layerdrop", "pdrop")) or key in (
                "mask_time_prob", "mask_feature_prob", "drop_path_rate")):
            setattr(config, key, 0.0)  # layers skipped at random would make the two runs differ
    fields = vars(config)  # not getattr: 5.x per-layer attributes raise when read globally
    if isinstance(fields.get("num_key_value_heads"), int) and isinstance(fields.get("num_attention_heads"), int):
        config.num_key_value_heads = min(fields["num_key_value_heads"], fields["num_attention_heads"])
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                    "cls_token_id", "mask_token_id", "unk_token_id"):
            tid = getattr(config, key, None)
            if isinstance(tid, int) and tid >= vocab:
                setattr(config, key, 1)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config
