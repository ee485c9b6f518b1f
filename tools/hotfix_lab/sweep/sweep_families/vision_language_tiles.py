"""Vision-language models that take several views per sample: image lists, tiles and crops.

Idefics 1-3, SmolVLM and kin (images as a list per sample, with a pixel or tile mask), IDEFICS (v1)
and Mllama (cross-attention to the images instead of placeholders), Phi-4 multimodal (a global view
plus sub-crops) and the lone vision towers of the Idefics line.  What the generic builder cannot
guess for them:

* the view layout: ``pixel_values`` (batch, images / tiles, C, H, W) with ``pixel_attention_mask``,
  ``aspect_ratio_ids`` / ``aspect_ratio_mask``, ``image_sizes`` or an image-attention mask;
* the number of image placeholders (perceiver latents, pixel-shuffled patch grids, crop grids with
  row separators), tried against the model's own mismatch check (``with_placeholders``) or computed
  from the config;
* sizes and layer indices that must exist in 2-layer towers (perceiver resampler, cross-attention
  layers, intermediate taps, DeepStack taps).

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

from ._vision_language_common import _ids, _image_size, _pixels, with_placeholders


# --------------------------------------------------------------------------- idefics-like (images as a list per sample)


def _idefics_tokens(config):
    """Image tokens per image: the perceiver's latents (Idefics2), else the patch grid shrunk by the
    pixel shuffle (``scale_factor`` per side: Idefics3, SmolVLM)."""
    perceiver = getattr(config, "perceiver_config", None)
    if perceiver is not None:
        return perceiver.resampler_n_latents
    vision = config.vision_config
    patches = (_image_size(config) // vision.patch_size) ** 2
    return max(patches // getattr(config, "scale_factor", 1) ** 2, 1)


def _multi_image_batch(model, config, generator):
    """Idefics2/3-like: pixel_values (batch, images, C, H, W) with a per-pixel mask of real pixels."""
    import torch

    size = _image_size(config)
    batch = {"input_ids": _ids(config, generator),
             "pixel_values": torch.randn(2, 1, 3, size, size, generator=generator),
             "pixel_attention_mask": torch.ones(2, 1, size, size, dtype=torch.bool)}
    # 4.5x's Idefics2/3 scatter features with masked_scatter and no count check, accepting too few
    # placeholders: try the count the config implies first (then search, for the kin).
    return with_placeholders(model, config, batch, counts=[_idefics_tokens(config), *range(1, 65)])


def _tile_mask_batch(model, config, generator):
    """GraniteDocling: pixel_values (batch, tiles, C, H, W) with a per-tile mask of real tiles."""
    import torch

    size = _image_size(config)
    batch = {"input_ids": _ids(config, generator),
             "pixel_values": torch.randn(2, 1, 3, size, size, generator=generator),
             "pixel_attention_mask": torch.ones(2, 1, dtype=torch.bool)}
    return with_placeholders(model, config, batch)


def _idefics_batch(model, config, generator):
    """IDEFICS (v1) attends to images by cross-attention: an image-attention mask (batch, text, images)
    replaces placeholder tokens."""
    import torch

    size = _image_size(config)
    ids = _ids(config, generator)
    return {"input_ids": ids, "pixel_values": torch.randn(2, 1, 3, size, size, generator=generator),
            "image_attention_mask": torch.ones(2, ids.shape[1], 1, dtype=torch.long)}


def _idefics_config(config):
    # The released checkpoints freeze both towers and start the cross-attention gates at zero, which
    # would leave most parameters without (or with zero) gradients: train everything, random gates.
    config.freeze_text_layers = False
    config.freeze_vision_layers = False
    config.alpha_initializer = "normal"
    config.alpha_type = "vector"  # the "normal" initialiser of a scalar gate calls torch.normal with an int size


def _idefics2_config(config):
    # The perceiver resampler keeps its own sizes (64 latents x 16 heads x 96 by default).
    perceiver = getattr(config, "perceiver_config", None)
    if perceiver is not None:
        perceiver.resampler_n_latents = 4
        perceiver.resampler_depth = 2
        perceiver.resampler_n_heads = 2
        perceiver.resampler_head_dim = 16
        perceiver.num_key_value_heads = min(getattr(perceiver, "num_key_value_heads", 2) or 2, 2)


def _granite_docling_config(config):
    """The connector's output is scattered into the text embeddings: its width is the text width, and the
    DeepStack taps must name layers a 2-layer tower has."""
    vision = getattr(config, "vision_config", None) or config
    text = getattr(config, "text_config", None)
    if text is not None:
        vision.out_hidden_size = text.hidden_size
    else:
        vision.out_hidden_size = 32
    vision.deepstack_visual_indexes = [0]


def _tower_batch(model, config, generator):
    """A vision tower alone: images only (the generic batch gives it token ids)."""
    return {"pixel_values": _pixels(generator, _image_size(config), getattr(config, "num_channels", 3))}


# --------------------------------------------------------------------------- Mllama (tiles, cross-attention)


def _mllama_config(config):
    """Cross-attention layers and the tower's intermediate taps must exist in 2-layer models; the
    projector input is the tower's width times (taps + 1); one tile per image."""
    vision = config.vision_config
    vision.num_global_layers = 1
    vision.intermediate_layers_indices = [0]
    vision.vision_output_dim = vision.hidden_size * 2
    vision.max_num_tiles = 1
    vision.supported_aspect_ratios = [[1, 1]]
    vision.image_size = 32
    text = config.text_config
    text.cross_attention_layers = [1]
    # 4.5x's text config leaves rope_scaling None while the rotary embedding indexes it
    if getattr(text, "rope_scaling", 0) is None and not getattr(text, "rope_parameters", None):
        text.rope_scaling = {"rope_type": "default"}


def _mllama_batch(model, config, generator):
    """pixel_values (batch, images, tiles, C, H, W) with each image's aspect-ratio id (1: the only
    supported ratio, 0 is padding), its tile mask and the text-to-tile cross-attention mask."""
    import torch

    size = config.vision_config.image_size
    ids = _ids(config, generator)
    return {"input_ids": ids,
            "pixel_values": torch.randn(2, 1, 1, 3, size, size, generator=generator),
            "aspect_ratio_ids": torch.ones(2, 1, dtype=torch.long),
            "aspect_ratio_mask": torch.ones(2, 1, 1, dtype=torch.long),
            "cross_attention_mask": torch.ones(2, ids.shape[1], 1, 1, dtype=torch.long)}


# --------------------------------------------------------------------------- Phi-4 multimodal


def _phi4_multimodal_config(config):
    """4.5x's config drops its default sub-configs (``Phi4MultimodalVisionConfig()`` is built but not
    kept, and the audio default hangs on the vision one): build them here, small.  Images are one
    32 px crop (4x4 patches, 2x2 after compression) plus the global view; the audio conformer
    keeps 1024-wide channels unless told."""
    import transformers

    from hotfix_lab.sweep.sweep_shrink import shrink_config

    if getattr(config, "vision_config", None) is None:
        config.vision_config = shrink_config(transformers.Phi4MultimodalVisionConfig())
    if getattr(config, "audio_config", None) is None:
        config.audio_config = shrink_config(transformers.Phi4MultimodalAudioConfig())
    vision, audio = config.vision_config, config.audio_config
    vision.image_size = 32
    vision.patch_size = 8
    vision.crop_size = 32
    vision.feature_layer = -1  # the last layer's output, so the whole 2-layer tower is trained
    vision.image_token_id = config.vocab_size - 1  # read once, when the embedding is built
    for key, small in (("num_blocks", 2), ("ext_pw_out_channel", 32), ("depthwise_separable_out_channel", 32),
                       ("nemo_conv_channels", 32), ("hidden_size", 32), ("intermediate_size", 64),
                       ("num_attention_heads", 2)):
        if hasattr(audio, key):
            setattr(audio, key, small)
    audio.audio_token_id = config.vocab_size - 2


def _phi4_multimodal_batch(model, config, generator):
    """``image_pixel_values`` (batch, 1 global + 1 sub crop, C, H, W), each image's size in pixels and
    a per-patch mask; the text holds the image's tokens: the sub-crop grid with one separator per row
    (2 x 3), one global separator, the global grid with separators (2 x 3)."""
    import torch

    vision = config.vision_config
    patches = vision.image_size // vision.patch_size
    side = patches // 2
    per_image = side * (side + 1) * 2 + 1
    ids = torch.cat([torch.full((2, per_image), vision.image_token_id), _ids(config, generator)], 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "image_pixel_values": torch.randn(2, 2, 3, vision.image_size, vision.image_size, generator=generator),
            "image_sizes": torch.tensor([[vision.crop_size, vision.crop_size]] * 2),
            "image_attention_mask": torch.ones(2, 2, patches, patches, dtype=torch.long)}


CONFIGS = {
    "idefics": _idefics_config,
    "idefics2": _idefics2_config,
    "granite_docling": _granite_docling_config,
    "granite_docling_vision": _granite_docling_config,
    "phi4_multimodal": _phi4_multimodal_config,
    "mllama": _mllama_config,
}

INPUTS = {
    "idefics": _idefics_batch,
    "idefics2": _multi_image_batch,
    "idefics3": _multi_image_batch,
    "smolvlm": _multi_image_batch,
    "modernvbert": _multi_image_batch,
    "ultravbert": _multi_image_batch,
    "granite_docling": _tile_mask_batch,
    "idefics3_vision": _tower_batch,
    "smolvlm_vision": _tower_batch,
    "granite_docling_vision": _tower_batch,
    "mllama": _mllama_batch,
    "phi4_multimodal": _phi4_multimodal_batch,
}
