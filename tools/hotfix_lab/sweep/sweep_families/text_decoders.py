"""Dense text decoders and encoder-decoders whose sizes must agree: rotary dims (GPT-J, CodeGen),
``head_dim`` / kv-head / window defaults (Ministral, Nemotron), T5Gemma / T5Gemma2 encoder, BLT, and
Gemma-style stacks with 5.x per-layer overrides (DiffusionGemma, EmbeddingGemma2).

The generic shrink sets each size field small on its own; these families tie several together:

* rotary dims (``rotary_dim``) must fit in the shrunk head size.
* per-layer lists (``layer_types``, ...) were built for the default depth and must be cut to
  ``num_hidden_layers`` (keeping one layer of each kind).
* 5.x per-layer overrides (``per_layer_config``) keyed by the default depth's layer indices.
* cross-attention and global/local widths derived once in ``__init__`` follow the shrunk sizes; a
  release bug worked around on the config (t5gemma2_encoder), said where it is done.
Shared helpers are in ``_text_common``.
"""

from __future__ import annotations

from ._text_common import _cut_layer_lists, _head_dim, _set


def _reset_per_layer(text, **overrides):
    """Rebuild 5.x per-layer overrides (per_layer_config, keyed by the default depth's layer indices) for
    the cut layer list: on each full-attention layer, heads twice as wide plus ``overrides``.  The per-layer
    attributes can be read only once the old overrides are gone."""
    text.per_layer_config = None
    overrides = dict(overrides, head_dim=2 * text.head_dim)
    text.per_layer_config = {i: dict(overrides) for i, kind in enumerate(text.layer_types) if kind == "full_attention"}


# ------------------------------------------------------------------------------------------ fixes


def _fix_gptj(config):
    config.rotary_dim = config.n_embd // config.n_head // 2  # rotary on half of each head


def _fix_codegen(config):
    # codegen's fused qkv is split over mp_num=4 model-parallel shards: heads must divide by 4
    config.n_head = 4
    config.rotary_dim = config.n_embd // config.n_head // 2


def _fix_ministral(config):
    _head_dim(config)
    _cut_layer_lists(config)
    config.sliding_window = 4  # below the 8-token batch, so the window really masks


def _fix_nemotron(config):
    config.num_key_value_heads = config.num_attention_heads  # default None: no GQA


def _fix_t5gemma(config):
    # the decoder's cross-attention projects encoder states of cross_attention_hidden_size (set from the
    # encoder's size only in __init__)
    config.decoder.cross_attention_hidden_size = config.encoder.hidden_size
    for side in (config.encoder, config.decoder):
        _cut_layer_lists(side)


def _fix_t5gemma2_encoder(config):
    # the composite T5Gemma2Config hands dropout_rate to its encoder's text config; alone it is missing
    text = config.text_config
    if not hasattr(text, "dropout_rate"):
        text.dropout_rate = 0.0
    _cut_layer_lists(text)
    config.mm_tokens_per_image = 4  # 4x4 patches pooled to 2x2 image tokens
    vocab = text.vocab_size
    _set(config, boi_token_index=vocab - 3, eoi_token_index=vocab - 2, image_token_index=vocab - 1)


def _fix_blt(config):
    # byte-level local encoder/decoder around a global transformer twice as wide (cross_attn_k=2 patch
    # queries per patch); hash n-gram embeddings sized down; fixed-size patches (no entropy patcher pass)
    hidden = config.encoder_config.hidden_size
    config.global_config.hidden_size = hidden * config.cross_attn_k
    for side in (config.encoder_config, config.decoder_config):
        side.hidden_size_global = config.global_config.hidden_size
    for part in (config.patcher_config, config.encoder_config, config.decoder_config, config.global_config):
        if hasattr(part, "head_dim"):  # head_dim was fixed from the defaults: follow the (new) width
            part.head_dim = part.hidden_size // part.num_attention_heads
    _set(config, encoder_hash_byte_group_size=[2, 3], encoder_hash_byte_group_vocab=64, patch_in_forward=False)


def _fix_diffusion_gemma(config):
    # Gemma-4-style MoE text stack whose expert sizes default to None (checkpoints set them); the full
    # attention layers are per-layer overrides (per_layer_config: wider heads) keyed by the default depth's
    # layer indices, so the overrides are rebuilt for the cut layer list (sliding, full: the last must be full)
    text = config.text_config
    _set(text, num_experts=4, top_k_experts=2, moe_intermediate_size=32, sliding_window=4)
    if getattr(text, "num_global_key_value_heads", 0) is None:  # 5.11: None, which its attention divides by
        text.num_global_key_value_heads = text.num_key_value_heads
    _cut_layer_lists(text)
    _reset_per_layer(text)
    config.canvas_length = 4
    if config.vision_config is None:  # 5.12 - 5.16: no default vision config, yet the encoder builds its tower
        from transformers import CONFIG_MAPPING

        from hotfix_lab.sweep.sweep_shrink import shrink_config

        config.vision_config = shrink_config(CONFIG_MAPPING["gemma4_vision"]())
    _set(config.vision_config, position_embedding_size=64)  # a 10240-entry table in the (idle) vision tower


def _diffusion_gemma_batch(model, config, g):
    """A prompt (encoded into the shared KV cache) and a fixed canvas: without one the model samples a
    random canvas of canvas_length tokens, different in every forward."""
    import torch

    vocab = min(config.text_config.vocab_size, 100)
    return {
        "input_ids": torch.randint(3, vocab, (2, 8), generator=g),
        "decoder_input_ids": torch.randint(3, vocab, (2, config.canvas_length), generator=g),
    }


def _fix_embedding_gemma2(config):
    # Gemma-style text stack (sliding + full layers; full layers have wider heads and fewer kv heads as
    # per-layer overrides); the composite also holds vision/audio towers the text batch leaves idle
    text = getattr(config, "text_config", None) or config
    _cut_layer_lists(text)
    _set(text, sliding_window=4, hidden_size_per_layer_input=16, embedding_dim=32)
    _reset_per_layer(text, num_key_value_heads=1)


CONFIGS = {
    "embedding_gemma2": _fix_embedding_gemma2,
    "embedding_gemma2_text": _fix_embedding_gemma2,
    "diffusion_gemma": _fix_diffusion_gemma,
    "blt": _fix_blt,
    "t5gemma": _fix_t5gemma,
    "t5gemma2_encoder": _fix_t5gemma2_encoder,
    "ministral": _fix_ministral,
    "nemotron": _fix_nemotron,
    "gptj": _fix_gptj,
    "codegen": _fix_codegen,
}


INPUTS = {
    "diffusion_gemma": _diffusion_gemma_batch,
}
