"""Patch-grid vision-language models of the Qwen-VL lineage (and the models built on their recipe):
whole models, their text models, Muse-Glimmer's drafter and Muse-Spark's waveform audio tower (the
vision towers alone are in ``vision_grid_qwen_towers``).

Their vision tower does not take an image tensor: ``pixel_values`` is a flat list of patches (one
row of ``in_channels x temporal_patch_size x patch_size**2`` values per patch in Qwen-VL) and
``image_grid_thw`` / ``grid_thw`` (one ``(t, h, w)`` row per image, in patches) says how the rows
form images.  Every ``spatial_merge_size**2`` patches are merged into one feature, and the text
holds exactly that many image placeholder tokens per image (usually between vision start / end
markers), whose 3-D rotary positions (M-RoPE) the model derives from the same grid.  So the
generic builder fails on them in three ways:

* the text rotary's ``mrope_section`` (time, height, width) must sum to half the rotary width, and
  the defaults are for a 128-wide head; on 4.5x releases a missing ``rope_scaling`` dict is read;
* the vision tower keeps its full depth and its layer-index lists (``fullatt_block_indexes``,
  ``deepstack_visual_indexes``, ``layer_types``) and a merger output (``out_hidden_size`` /
  ``text_hidden_size``) that must equal the text hidden size;
* special token ids lie far outside a shrunk vocabulary, and the batch needs the grid metadata,
  the matching number of placeholders and (5.x) ``mm_token_type_ids``.

:func:`_fix_vl` fixes a config (whole model, text model) and :func:`_grid_batch` makes the batch
(the tower fix and the patch maker are shared, in ``_vision_grid_qwen_common``).  The relatives
differ only in how a patch is laid out (``layout``: Qwen's flat rows, Kimi-K2.5's per-patch images,
Inkling2's merged blocks, Inkling's space-time cubes) and in how many placeholders an image takes
(HunYuan-VL adds row separators and begin / end features); those are arguments, not separate code
paths.
"""

from __future__ import annotations

from functools import partial

from ._vision_grid_qwen_common import (_BATCH, _RESERVED, _fix_layers, _fix_vision, _head_dim, _int, _patches, _set,
                                       _text, _vision)


# ---------------------------------------------------------------- config fixes


def _mrope_section(half, axes=3):
    """Rotary sections summing to ``half``: the first ``axes - 1`` equal, the remainder to the last.

    Ernie-4.5-VL (height, width, time) interleaves the first two and needs them equal; Qwen's
    (time, height, width) splits take any sizes; HunYuan-VL's four axes get equal parts.
    """
    side = half // axes
    return [side] * (axes - 1) + [half - side * (axes - 1)]


def _fix_mrope(text, axes=3):
    """Make ``mrope_section`` fit the shrunk head: it must sum to half the rotary width."""
    if getattr(text, "head_dim", 0) is None and hasattr(text, "num_attention_heads"):
        text.head_dim = text.hidden_size // text.num_attention_heads  # HunYuan-VL leaves it None
    for name in ("rope_parameters", "rope_scaling"):
        if not hasattr(text, name):
            continue
        rope = getattr(text, name)
        if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
            return  # rotary per layer type (LFM3): no M-RoPE sections
        rope = dict(rope) if isinstance(rope, dict) else {"rope_type": "default"}
        partial_factor = rope.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None)) or 1.0
        while partial_factor < 1 and int(_head_dim(text) * partial_factor) // 2 < axes + 1:
            # Qwen3.5 rotates a quarter of the head: 2 of a 16-wide head, too few for one per axis
            partial_factor = rope["partial_rotary_factor"] = partial_factor * 2
        rope["mrope_section"] = _mrope_section(int(_head_dim(text) * partial_factor) // 2, axes)
        setattr(text, name, rope)
        return  # 5.x aliases rope_scaling to rope_parameters: the first one present is enough


def _fix_text(text):
    """Small hybrid / MoE / MLA text stacks."""
    _fix_layers(text)
    # widths the generic shrink does not know: gated delta-net heads (16 / 32 heads of 128: 1M parameters
    # on a 32-wide model), Qwen4-Exp's hyper-connections, Inkling's sliding-window heads, Muse-Spark's
    # and Ernie-4.5-VL's experts
    for key, small in (("linear_num_key_heads", 2), ("linear_num_value_heads", 2), ("linear_key_head_dim", 16),
                       ("linear_value_head_dim", 16), ("hc_lowrank", 16), ("swa_num_attention_heads", 2),
                       ("swa_num_key_value_heads", 2), ("swa_head_dim", 16), ("moe_hidden_size", 64),
                       ("moe_num_experts", 2), ("moe_k", 1)):
        if _int(text, key) is not None:
            setattr(text, key, min(getattr(text, key), small))
    # Ernie-4.5-VL: (text experts, vision experts) widths, a list the generic shrink does not see
    if isinstance(getattr(text, "moe_intermediate_size", None), (list, tuple)):
        text.moe_intermediate_size = [32] * len(text.moe_intermediate_size)
    # Qwen4-Exp's indexed attention selects key blocks with a QSA indexer whose sizes have no defaults:
    # one indexer key head (required), a head as wide as the rotary part, and a budget of two 2-token
    # blocks so that a 12-token batch really drops some blocks
    indexed = "indexed_attention" in (getattr(text, "layer_types", None) or ())
    if indexed and getattr(text, "indexer_n_heads", 1) is None:
        text.indexer_n_heads, text.indexer_kv_heads, text.indexer_head_dim = 2, 1, _head_dim(text)
        text.indexer_budget, text.indexer_compress_ratio = 4, 2
    # DeepSeek-V3 text (Kimi-K2.5): head_dim is the rotary width and qk_head_dim the query width, both
    # derived in __init__ before the shrink made the rope / nope parts 8 / 8
    rope, nope = _int(text, "qk_rope_head_dim"), _int(text, "qk_nope_head_dim")
    if rope is not None and nope is not None:
        _set(text, "qk_head_dim", rope + nope)
        _set(text, "head_dim", rope)


def _fix_token_ids(config):
    """Move every special token id (image, video, vision start / end, audio ...) into the shrunk vocabulary."""
    vocab = _text(config).vocab_size
    assigned = {}
    for owner in (config, getattr(config, "text_config", None), getattr(config, "vision_config", None)):
        if owner is None:
            continue
        for key in sorted(vars(owner)):
            value = getattr(owner, key)
            if not key.endswith(("_id", "_token_index")):  # image_token_id, im_start_id, image_token_index ...
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < vocab - _RESERVED:
                continue
            if value not in assigned:  # the same id in two places stays one token
                assigned[value] = vocab - 1 - len(assigned)
            setattr(owner, key, assigned[value])


def _fix_vl(config, axes=3):
    """Config fix for a whole vision-language model (or its text model alone)."""
    text = _text(config)
    vision = getattr(config, "vision_config", None)
    _fix_text(text)
    _fix_mrope(text, axes)
    if vision is not None:
        _fix_vision(vision, text.hidden_size)
    if getattr(config, "model_type", None) in ("qwen2_vl", "qwen2_5_vl"):
        # 4.56's Qwen2(.5)-VL configs lack the vision start / end ids that get_rope_index reads; give them
        # Qwen2-VL's published ids (moved into the vocabulary below with the others)
        for key, published in (("vision_start_token_id", 151652), ("vision_end_token_id", 151653)):
            if getattr(config, key, None) is None and getattr(text, key, None) is None:
                setattr(config, key, published)
    # projectors between the towers: LFM3-VL / Muse 4096 wide; Kimi-K2.5 normalises the vision width
    if _int(config, "projector_hidden_size"):
        config.projector_hidden_size = 64
    if _int(config, "projection_hidden_size") and vision is not None:
        config.projection_hidden_size = vision.hidden_size
    if _int(config, "out_hidden_size") and vision is not None and _int(vision, "merge_size"):
        config.out_hidden_size = vision.hidden_size * vision.merge_size**2  # Muse: pixel-shuffled tower output
    audio = getattr(config, "audio_config", None)
    if audio is not None:
        # the audio towers are built but not fed (the batch has no audio): only their size matters
        _fix_audio(audio, text.hidden_size)
    _fix_token_ids(config)


def _fix_audio(audio, out_hidden):
    """An audio tower projecting to ``out_hidden`` (the text width), with small inner widths."""
    for key in ("text_hidden_size", "out_hidden_size", "output_dim"):
        if _int(audio, key):
            setattr(audio, key, out_hidden)
    for key, small in (("downsample_hidden_size", 16), ("mel_vocab_size", 16), ("n_mel_bins", 8)):
        if _int(audio, key):
            setattr(audio, key, min(getattr(audio, key), small))
    if isinstance(getattr(audio, "hidden_sizes", None), (list, tuple)):  # Muse-Spark's conv stages
        audio.hidden_sizes = [16] * len(audio.hidden_sizes)
        audio.depths = [1] * len(audio.depths)


def _fix_muse_spark_audio(audio):
    """Muse-Spark's waveform tower alone: a pyramid of conv stages, one per layer, each with its own
    patch (downsampling) size, width and depth; the lists must have num_hidden_layers entries, which
    the shrunk depth (2) no longer matches, so the first two stages are kept."""
    stages = audio.num_hidden_layers
    audio.patch_sizes = list(audio.patch_sizes)[:stages]
    audio.hidden_sizes, audio.depths = list(audio.hidden_sizes)[:stages], list(audio.depths)[:stages]
    _fix_audio(audio, 32)


# ---------------------------------------------------------------- inputs


def _token(config, *names):
    for owner in (config, _text(config)):
        value = _int(owner, *names)
        if value is not None:
            return value
    return None


def _grid_batch(model, config, generator, layout="flat", row_markers=False):
    """Text with one image per sample, the image's patches and its grid; uses the model's own ids.

    ``row_markers``: the merger adds features beyond the merged patches, which take placeholders too
    (HunYuan-VL: a separator after each row of merged patches, and begin / end features).
    """
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    pixels, grid_thw, per_image = _patches(_vision(config), generator, layout)
    if row_markers:
        per_image += grid_thw[0, 1].item() // _int(_vision(config), "spatial_merge_size") + 2
    vocab = _text(config).vocab_size
    image = _token(config, "image_token_id", "image_token_index")
    start = _token(config, "vision_start_token_id", "image_start_token_id", "image_bos_token_id")
    end = _token(config, "vision_end_token_id", "image_end_token_id")
    rows, types, moe_types = [], [], []
    for _ in range(_BATCH):
        head = torch.randint(3, vocab - _RESERVED, (3,), generator=generator).tolist()
        tail = torch.randint(3, vocab - _RESERVED, (3,), generator=generator).tolist()
        mid = ([start] if start is not None else []) + [image] * per_image + ([end] if end is not None else [])
        rows.append(head + mid + tail)
        types.append([0] * len(head) + [int(tok == image) for tok in mid] + [0] * len(tail))
        moe_types.append([0] * len(head) + [1] * len(mid) + [0] * len(tail))
    batch = {"input_ids": torch.tensor(rows), "pixel_values": pixels}
    if grid_thw is not None:
        batch["image_grid_thw" if "image_grid_thw" in params else "grid_thw"] = grid_thw
    if "mm_token_type_ids" in params:  # 5.x: M-RoPE positions come from the token types
        batch["mm_token_type_ids"] = torch.tensor(types, dtype=torch.int)
    if "moe_mm_token_type_ids" in params:  # Ernie-4.5-VL: image tokens and their markers go to vision experts
        batch["moe_mm_token_type_ids"] = torch.tensor(moe_types, dtype=torch.int)
    return batch


def _waveform_batch(model, config, generator):
    """Raw mono waveforms whose length the tower's total downsampling (samples_per_token) divides:
    8 output tokens per sample."""
    import math

    import torch

    samples = math.prod(config.patch_sizes) * 8
    return {"input_values": torch.randn(_BATCH, samples, generator=generator)}


def _drafter_batch(model, config, generator):
    """Muse-Glimmer's DFlash drafter: a block of noise embeddings denoised against the target model's
    hidden states of ``target_layer_ids`` (concatenated), which the drafter projects to its width."""
    import torch

    block = min(_int(config, "block_size") or 4, 4)
    context = len(config.target_layer_ids) * config.hidden_size
    return {"noise_embeds": torch.randn(_BATCH, block, config.hidden_size, generator=generator),
            "context_hidden_states": torch.randn(_BATCH, 6, context, generator=generator)}


_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp",
       "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker", "ernie4_5_vl_moe", "lfm3_vl", "muse_glimmer",
       "muse_spark", "exaone4_5")
_TEXT = ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text")

CONFIGS = {
    **{t: _fix_vl for t in _VL + _TEXT + ("kimi_k25", "inkling2", "inkling_mm_model")},
    # HunYuan-VL's XD-RoPE has four axes (sequence, width, height, image index)
    "hunyuan_vl": partial(_fix_vl, axes=4),
    "hunyuan_vl_text": partial(_fix_vl, axes=4),
    "muse_spark_audio": _fix_muse_spark_audio,
}

INPUTS = {
    **{t: _grid_batch for t in _VL},
    "kimi_k25": partial(_grid_batch, layout="conv"),
    "inkling2": partial(_grid_batch, layout="merged"),
    "inkling_mm_model": partial(_grid_batch, layout="cube"),
    "hunyuan_vl": partial(_grid_batch, row_markers=True),
    "muse_glimmer_assistant": _drafter_batch,
    "muse_spark_audio": _waveform_batch,
}

UNBUILDABLE = {}
