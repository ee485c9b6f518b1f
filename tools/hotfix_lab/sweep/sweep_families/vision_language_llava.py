"""Vision-language models that project one image per sample into placeholder tokens (LLaVA-like).

LLaVA and its kin (Aya Vision, Cohere2-Vision, VipLLaVA, LLaVA-NeXT / -OneVision anyres tiles,
Mistral3 / Pixtral towers), Llama 4, the fixed-query projectors (Aria, Gemma 3, Step3p7) and PI0's
PaliGemma prefix.  The language model replaces ``image_token_id`` tokens by the projected tower
features, so what the generic builder cannot guess is:

* the number of image placeholders, found by trying counts against the model's own mismatch check
  (``with_placeholders`` in ``_vision_language_common``), or computed from the config;
* image metadata (``image_sizes``, tiles per image for anyres models);
* sizes that must agree between the towers (projector input = vision width, feature layers that
  exist in a 2-layer tower, a projector's patch-to-query table for the tiny patch grid).

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

import importlib.util

from ._vision_language_common import _ids, _image_size, _pixels, with_placeholders


# --------------------------------------------------------------------------- llava-like


def _llava_batch(model, config, generator):
    """Plain LLaVA-like models: one image per sample, square, the tower's size."""
    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, _image_size(config))}
    return with_placeholders(model, config, batch)


def _anyres_config(config):
    # One 32x32 grid point: each image is its base view plus one 32x32 tile (no 336-pixel tiles).
    config.image_grid_pinpoints = [[32, 32]]
    config.vision_config.image_size = 32


def _anyres_batch(model, config, generator):
    """LLaVA-NeXT-like: pixel_values (batch, tiles, C, H, W) with each image's original size."""
    import torch

    size = _image_size(config)
    batch = {"input_ids": _ids(config, generator),
             "pixel_values": torch.randn(2, 2, 3, size, size, generator=generator),
             "image_sizes": torch.tensor([[size, size]] * 2)}
    return with_placeholders(model, config, batch)


def _pixtral_batch(model, config, generator):
    """Pixtral-tower models (Mistral3 and kin): square images plus their sizes in pixels."""
    import torch

    size = _image_size(config)
    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, size),
             "image_sizes": torch.tensor([[size, size]] * 2)}
    return with_placeholders(model, config, batch)


def _mla_text_config(config):
    """Multi-head latent attention text models: derived head sizes follow the shrunk rope / nope sizes."""
    text = getattr(config, "text_config", None) or config
    if getattr(text, "qk_rope_head_dim", None):
        # the rotary embedding reads head_dim, which the config points at the rope slice
        text.head_dim = text.qk_rope_head_dim
        if hasattr(text, "qk_head_dim"):
            text.qk_head_dim = text.qk_nope_head_dim + text.qk_rope_head_dim
    for key, small in (("index_head_dim", 16), ("index_n_heads", 2)):
        if hasattr(text, key):
            setattr(text, key, small)


def _no_skipped_layer(config):
    # The last tower layer feeds the projector, so every tower parameter gets a gradient.
    config.vision_feature_layer = -1


def _llava_next_config(config):
    _anyres_config(config)
    _no_skipped_layer(config)


def _cohere2_vision_config(config):
    config.alignment_intermediate_size = 64  # projector width (36864 by default)


def _vipllava_config(config):
    # The projector concatenates hidden states of these tower layers; a 2-layer tower has 3.
    config.vision_feature_layers = [-2, -1]


# --------------------------------------------------------------------------- Llama 4


def _llama4_config(config):
    """The vision adapter pixel-shuffles the tower's output (width / ratio**2 channels) into an MLP
    whose input is the tower's intermediate size, then projects to the text width."""
    vision = config.vision_config
    ratio = getattr(vision, "pixel_shuffle_ratio", 0.5)
    vision.intermediate_size = int(vision.hidden_size / ratio ** 2)
    vision.projector_input_dim = 32
    vision.projector_output_dim = 32
    vision.vision_output_dim = 32
    text = config.text_config
    for key in ("intermediate_size_mlp",):
        if hasattr(text, key):
            setattr(text, key, 64)


# --------------------------------------------------------------------------- fixed-query projectors


def _aria_config(config):
    # The projector maps a known patch count to a query count: 32 px / 8 px patches = 16 patches
    # per image (the table knows only 1225 and 4900), pooled to 4 queries.
    side = _image_size(config) // config.vision_config.patch_size
    config.projector_patch_to_query_dict = {side * side: 4}


def _gemma3_config(config):
    # The projector average-pools the patch grid (side/sqrt(tokens) wide kernel): 4 tokens from a
    # 4x4 grid, not 256 (which makes a zero kernel).
    config.mm_tokens_per_image = 4


def _trim_layer_lists(config, keys=("layer_types", "activation_sparsity_pattern", "mlp_layer_types",
                                    "no_rope_layers", "kv_source_layers", "indexer_types")):
    """Per-layer lists computed for the full depth keep their length after shrink_config lowered
    num_hidden_layers; layers are counted from them in places: keep the first num_hidden_layers."""
    n = config.num_hidden_layers
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and len(value) > n:
            setattr(config, key, list(value[:n]))


def _gemma3n_text_config(config):
    _trim_layer_lists(config)
    n = config.num_hidden_layers
    # intermediate_size is a per-layer list (shrink_config only shrinks ints)
    if isinstance(config.intermediate_size, (list, tuple)):
        config.intermediate_size = [64] * n
    # per-layer token embeddings: a second vocabulary-sized table (262144 x 256 by default)
    config.vocab_size_per_layer_input = config.vocab_size
    config.hidden_size_per_layer_input = 16
    config.laurel_rank = 8
    # The last num_kv_shared_layers layers reuse the KV of the last earlier layer of their type (15
    # of 35 by default): in two sliding layers, the second reuses the first.
    if hasattr(config, "num_kv_shared_layers"):
        config.layer_types = ["sliding_attention"] * n
        config.num_kv_shared_layers = 1 if n > 1 else 0


def _timm_tower_config(config):
    """A timm vision tower (TimmWrapperConfig) swapped for timm's smallest ConvNeXt (``test_convnext``: 64
    features per position of a 2x2 map at 64x64 pixels, 1x1 at 32x32); its projector reads hidden_size."""
    vision = config.vision_config
    vision.architecture, vision.model_args, vision.hidden_size = "test_convnext", None, 64


# Gemma-3n (the whole model: text + timm vision tower + audio conformer).  Its ids are absolute: the
# vision embedder's table starts at the text's vocab_size_per_layer_input, the audio's after it, and
# the placeholders and the padding id ``text vocab_size - 1`` live in those tables.  Shrunk together:
# text 0..255, vision 256..271 (image 257), audio 272..399 (audio 273).  The tower is timm's smallest
# ConvNeXt (``test_convnext``: a 64-wide 2x2 map from 64x64 pixels, 4 image tokens); the audio sizes
# are those of transformers' own Gemma3nAudioModelTester (48 frames -> 3 encodings, 4 audio tokens).
GEMMA3N_IMAGE, GEMMA3N_AUDIO = 257, 273


def _gemma3n_config(config):
    text, vision, audio = config.text_config, config.vision_config, config.audio_config
    _gemma3n_text_config(text)
    text.vocab_size, text.vocab_size_per_layer_input = 400, 256
    _timm_tower_config(config)
    vision.vocab_offset, vision.vocab_size = 256, 16
    audio.vocab_offset, audio.vocab_size = 272, 128
    for key, value in (("input_feat_size", 32), ("hidden_size", 32), ("conf_num_attention_heads", 4),
                       ("conf_num_hidden_layers", 2), ("sscp_conv_channel_size", (16, 8)), ("conf_conv_kernel_size", 3),
                       ("conf_attention_chunk_size", 4), ("conf_attention_context_left", 5)):
        setattr(audio, key, value)
    config.vision_soft_tokens_per_image = config.audio_soft_tokens_per_image = 4
    config.image_token_id, config.audio_token_id = GEMMA3N_IMAGE, GEMMA3N_AUDIO
    config.boi_token_id, config.eoi_token_id, config.boa_token_id, config.eoa_token_id = 258, 259, 274, 275


def _gemma3n_batch(model, config, generator):
    import torch

    ids = _ids(config, generator, length=14)
    ids[:, 1:5], ids[:, 6:10] = GEMMA3N_IMAGE, GEMMA3N_AUDIO
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": _pixels(generator, size=64),
            "input_features": torch.randn(2, 48, 32, generator=generator),
            "input_features_mask": torch.ones(2, 48, dtype=torch.bool)}


def _perception_lm_config(config):
    """The Perception Encoder tower (timm's vit_pe_core) swapped for timm's ``test_vit`` at 32x32 pixels,
    patch 16: a class token and 4 patches; the projector reads ``model_args["embed_dim"]``."""
    vision = config.vision_config
    vision.architecture, vision.hidden_size = "test_vit", 64
    vision.model_args = {"embed_dim": 64, "img_size": 32, "patch_size": 16, "depth": 2, "num_heads": 2}


def _perception_lm_batch(model, config, generator):
    """One 32x32 tile per sample: pixel_values is (batch, tiles, channels, height, width)."""
    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, 32).unsqueeze(1)}
    return with_placeholders(model, config, batch)


def _step3p7_config(config):
    text = config.text_config
    _trim_layer_lists(text)
    if not getattr(text, "sliding_window", None):
        text.sliding_window = 16  # the text model always builds a sliding-window mask; None (default) fails


# --------------------------------------------------------------------------- PI0 (vision-language-action)


def _pi0_config(config):
    """The action expert (DiT) attends to the PaliGemma prefix's KV cache layer by layer: both
    keep the same depth, heads and head size; the image placeholder id lies inside the vocabulary."""
    vlm, dit = config.vlm_config, config.dit_config
    text = vlm.text_config
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
        if hasattr(text, key):
            setattr(dit, key, getattr(text, key))
    vlm.image_token_id = text.vocab_size - 1
    vlm.vision_config.image_size = 32
    config.chunk_size = 4


def _pi0_batch(model, config, generator):
    """One camera image per sample with its placeholders (tokens per image = patches of the tower),
    the text prompt, and the embedded state + noisy action chunk (chunk_size + 1 rows) for the expert."""
    import torch

    vision = config.vlm_config.vision_config
    per_image = (vision.image_size // vision.patch_size) ** 2
    token = config.vlm_config.image_token_id
    ids = torch.cat([torch.full((2, per_image), token), _ids(config.vlm_config, generator)], 1)
    return {"action_embeds": torch.randn(2, config.chunk_size + 1, config.dit_config.hidden_size, generator=generator),
            "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(2, 1, 3, vision.image_size, vision.image_size, generator=generator),
            "pixel_attention_mask": torch.ones(2, 1, dtype=torch.bool)}


CONFIGS = {
    "llava_next": _llava_next_config,
    "llava_next_video": _llava_next_config,
    "mistral_large4": _mla_text_config,
    "mistral_large4_text": _mla_text_config,  # its text model alone: the same MLA sizes
    "cohere2_vision": _cohere2_vision_config,
    "llama4": _llama4_config,
    "aria": _aria_config,
    "gemma3": _gemma3_config,
    "gemma3n_text": _gemma3n_text_config,
    "gemma3n": _gemma3n_config,
    "fast_vlm": _timm_tower_config,  # FastViT fastvit_mci3 by default
    "perception_lm": _perception_lm_config,
    "step3p7": _step3p7_config,
    "pi0": _pi0_config,
    "llava_onevision": _anyres_config,
    "vipllava": _vipllava_config,
}

INPUTS = {
    "aya_vision": _llava_batch,
    "cohere2_vision": _llava_batch,
    "vipllava": _llava_batch,
    "llava_next": _anyres_batch,
    "llava_next_video": _anyres_batch,
    "llava_onevision": _anyres_batch,
    "mistral3": _pixtral_batch,
    "mistral_large4": _pixtral_batch,
    "lighton_ocr": _pixtral_batch,
    "llama4": _llava_batch,
    "aria": _llava_batch,
    "gemma3": _llava_batch,
    "step3p7": _llava_batch,
    "pi0": _pi0_batch,
    "gemma3n": _gemma3n_batch,
    "fast_vlm": _llava_batch,
    "perception_lm": _perception_lm_batch,
}

_TIMM = ("needs timm ({} vision tower is a TimmWrapperModel); timm needs torchvision, whose CPU build "
         "for torch 2.13.0 is not on PyPI")

UNBUILDABLE = {}
# Gemma-3n, FastVLM and PerceptionLM run where timm imports: torch 2.14.1 with PyPI's torchvision 0.29.1 and
# timm in .matrix/timm-torch2.14.1 (tools/hotfix_lab/sweep/sweep_models.py's release_pythonpath adds it).
if importlib.util.find_spec("timm") is None:
    for _type, _tower in (("gemma3n", "MobileNetV5"), ("fast_vlm", "FastViT fastvit_mci3"),
                          ("perception_lm", "Perception Encoder")):
        UNBUILDABLE[_type] = (_TIMM.format(_tower) + "; swept under torch 2.14.1 instead, with PyPI's "
                              "torchvision 0.29.1 and timm (docs/sweep.md)")
