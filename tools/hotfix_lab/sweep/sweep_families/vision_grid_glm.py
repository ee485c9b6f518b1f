"""Patch-grid vision-language models outside the Qwen line (GLM-4V and its relatives).

GLM-4V, GLM-OCR, GLM-Image, PaddleOCR-VL, VideoLLaMA3, Cosmos3 and friends take images the
Qwen2-VL way: ``pixel_values`` is a 2-D tensor of flattened patches
(``sum(t*h*w)`` rows of ``channels * temporal_patch * patch**2``) plus a ``grid_thw`` row per
image, and the text carries one placeholder token per *merged* patch
(``t*h*w / spatial_merge**2``).  The generic builder cannot guess any of that, nor that

* the text rotary embedding is split into M-RoPE sections (t, h, w) whose sum must be half the
  rotary dimension (``head_dim * partial_rotary_factor``), which the small head size breaks;
* the vision tower projects to ``out_hidden_size``, which must equal the text hidden size;
* the multimodal token ids (image/video/start/end) lie far beyond the shrunk vocabulary;
* 5.x releases want ``mm_token_type_ids`` (0 text, 1 image, 2 video) to lay out 3-D positions.

So the configs get consistent sizes and in-vocabulary token ids, and the batches are made from
the vision config (patch sizes, merge size, channels) with exactly as many placeholders as
the vision tower makes features.  A few neighbours of the family take other image layouts and
have their own small makers in their own modules: MiniCPM's packed NaViT towers
(``target_sizes``, ``vision_minicpm_navit``), DeepSeek-OCR-2 / Unlimited-OCR (SAM + query encoder on
whole images, ``vision_deepseek_ocr``) and Granite-4 Vision (LLaVA-Next anyres crops with Q-Former
projectors, ``vision_granite_anyres``); the token-id helpers they share are in
``_vision_grid_glm_common``.  The facts come from transformers' own ModelTesters.
"""

from __future__ import annotations

from ._vision_grid_glm_common import _first, _text, fix_token_ids, special_ids, text_ids

# ---------------------------------------------------------------- config helpers


def _vision(config):
    return getattr(config, "vision_config", None) or config


def _head_dim(text):
    head = getattr(text, "head_dim", None)
    if isinstance(head, int) and head > 0:
        return head
    return text.hidden_size // text.num_attention_heads


def _rope_dict(text):
    """The dict that holds rope settings in this release (``rope_parameters`` in 5.x, ``rope_scaling`` before)."""
    for key in ("rope_parameters", "rope_scaling"):
        if hasattr(text, key):
            value = getattr(text, key)
            if value is None:
                value = {"rope_type": "default", "type": "default"} if key == "rope_scaling" else {"rope_type": "default"}
                setattr(text, key, value)
            return value
    return None


def fix_mrope(text):
    """M-RoPE sections (t, h, w) must add up to half the rotary dimension of the small head."""
    rope = _rope_dict(text)
    if rope is None:
        return
    factor = rope.get("partial_rotary_factor", None) or getattr(text, "partial_rotary_factor", None) or 1.0
    half = int(_head_dim(text) * factor) // 2
    quarter = half // 4
    rope["mrope_section"] = [half - 2 * quarter, quarter, quarter]


def fix_vision_width(config):
    """The vision merger projects to ``out_hidden_size``: it must be the text hidden size."""
    vision = getattr(config, "vision_config", None)
    if vision is not None and hasattr(vision, "out_hidden_size"):
        vision.out_hidden_size = _text(config).hidden_size


def fix_vision_tower(config):
    """A vision tower: ``depth`` (its layer count) and ``out_hidden_size`` are not shrunk by name."""
    if isinstance(getattr(config, "depth", None), int):
        config.depth = min(config.depth, 2)
    if hasattr(config, "out_hidden_size"):
        config.out_hidden_size = config.hidden_size
    if hasattr(config, "projection_intermediate_size"):
        config.projection_intermediate_size = 64
    # Qwen2.5-VL style windowed attention: windows of one merged patch, the last layer full
    if getattr(config, "fullatt_block_indexes", None) is not None and isinstance(config.depth, int):
        config.fullatt_block_indexes = [config.depth - 1]
        if isinstance(getattr(config, "window_size", None), int):
            config.window_size = _first(config.patch_size) * (getattr(config, "spatial_merge_size", 1) or 1)
    # Qwen3-VL style learnt positions: a square grid, interpolated to each image's grid
    if isinstance(getattr(config, "num_position_embeddings", None), int):
        config.num_position_embeddings = min(config.num_position_embeddings, 64)
    # Qwen3-VL style deepstack: features of these vision layers are added to the first text layers
    if getattr(config, "deepstack_visual_indexes", None):
        config.deepstack_visual_indexes = list(range(min(2, config.depth)))


def fix_grid_vlm(config):
    """Config fix for a patch-grid vision-language model (either the composite or its text part)."""
    fix_mrope(_text(config))
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        fix_vision_tower(vision)
    fix_vision_width(config)
    fix_token_ids(config)
    if isinstance(getattr(config, "projector_hidden_size", None), int):  # Cosmos3-Edge's projector MLP
        config.projector_hidden_size = 64


def fix_cohere_compass(config):
    """Cohere Compass text: ``rope_parameters`` is keyed by layer type and empty by default (checkpoints fill
    it); give the sliding layers M-RoPE and leave the full-attention layers without rope (NoPE), as Cohere2
    does, with a window shorter than the batch so the sliding mask matters."""
    text = _text(config)
    layers = text.num_hidden_layers
    text.layer_types = (["sliding_attention", "full_attention"] * layers)[:layers]
    text.rope_parameters = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": None}
    half = _head_dim(text) // 2
    text.rope_parameters["sliding_attention"]["mrope_section"] = [half - 2 * (half // 4), half // 4, half // 4]
    if getattr(text, "sliding_window", None):
        text.sliding_window = 4
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        fix_vision_tower(vision)
    fix_vision_width(config)
    fix_token_ids(config)


def fix_glm5_next(config):
    """GLM-5-Next: the grid VLM, and its text model as ``fix_glm5_next_text``."""
    fix_grid_vlm(config)
    fix_glm5_next_text(_text(config))


def fix_glm5_next_text(text):
    """GLM-5-Next text: per-layer lists sized for 45 layers, and linear/indexer attention widths of 128 x 64
    (left at 128, the linear-attention step alone grows past 1 GiB)."""
    layers = text.num_hidden_layers
    # one linear-attention layer and one indexed (sparse) attention layer; dense MLP first, then MoE
    text.layer_types = ["linear_attention", "indexed_attention"][:layers]
    text.mlp_layer_types = ["dense", "sparse"][:layers]
    if getattr(text, "indexer_types", None) is not None:
        text.indexer_types = ["full"] * layers
    for key, value in (("linear_head_dim", 16), ("linear_num_heads", 2), ("index_head_dim", 16),
                       ("index_n_heads", 2)):
        if hasattr(text, key):
            setattr(text, key, value)


def fix_glm_image(config):
    """GLM-Image: the VQ-VAE tokenizes the vision features (``latent_channels`` = vision width) into codebook
    ids that become input ids, so the codebook must fit the shrunk vocabulary."""
    fix_grid_vlm(config)
    vq, vision, text = config.vq_config, config.vision_config, config.text_config
    vq.latent_channels = vision.hidden_size
    vq.embed_dim = 32
    vq.num_embeddings = min(64, text.vocab_size)
    if hasattr(text, "vision_vocab_size"):
        text.vision_vocab_size = text.vocab_size


# ---------------------------------------------------------------- input helpers


def grid_pixels(vision, generator, images: int = 2, merge_units: int = 2, temporal: int = 1, merge=None,
                unflatten: bool = False):
    """Patches and ``grid_thw`` for ``images`` images of ``merge_units``^2 merged patches each.

    Rows are patches (``t*h*w`` per image), columns ``channels * temporal_patch * patch**2`` (or, with
    ``unflatten``, each row a ``(channels, patch, patch)`` image).  ``merge`` overrides the config's
    spatial merge size (for models that take it as an input).  Returns (pixels, grid, merge).
    """
    import torch

    patch = _first(getattr(vision, "patch_size", 14))
    tpatch = _first(getattr(vision, "temporal_patch_size", 1) or 1)
    if merge is None:
        merge = getattr(vision, "spatial_merge_size", None) or getattr(vision, "merge_size", None) or 1
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", None) or 3
    side = merge * merge_units
    rows = images * temporal * side * side
    shape = (rows, channels, patch, patch) if unflatten else (rows, channels * tpatch * patch * patch)
    pixels = torch.randn(*shape, generator=generator)
    grid = torch.tensor([[temporal, side, side]] * images)
    return pixels, grid, merge


def with_image_tokens(config, ids, per_image: int, images_per_sample: int = 1):
    """Put ``[start] image*per_image [end]`` blocks at the front of each sample; returns (ids, type ids)."""
    import torch

    tokens = special_ids(config)
    image = tokens.get("image_token_id", tokens.get("image_token_index"))
    block = [tokens[k] for k in ("vision_start_token_id", "image_start_token_id") if k in tokens][:1]
    block += [image] * per_image
    block += [tokens[k] for k in ("vision_end_token_id", "image_end_token_id") if k in tokens][:1]
    front = torch.tensor(block * images_per_sample).expand(ids.shape[0], -1)
    ids = torch.cat([front, ids], 1)
    return ids, (ids == image).long()


def grid_vlm_batch(model, config, generator, unflatten: bool = False):
    """Text with image placeholders, patches and ``image_grid_thw`` (one image per sample)."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    # VideoLLaMA3 takes the merge size per image as an input instead of a config field
    merge = 2 if "image_merge_sizes" in params else None
    pixels, grid, merge = grid_pixels(_vision(config), generator, images=2, merge=merge, unflatten=unflatten)
    per_image = int(grid[0].prod()) // (merge * merge)
    ids, types = with_image_tokens(config, text_ids(config, generator), per_image)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
             "image_grid_thw": grid}
    if "image_merge_sizes" in params:
        batch["image_merge_sizes"] = torch.tensor([merge] * grid.shape[0])
    if "mm_token_type_ids" in params:
        batch["mm_token_type_ids"] = types
    return batch


def unflattened_vlm_batch(model, config, generator):
    """As :func:`grid_vlm_batch`, each patch a ``(channels, patch, patch)`` image (PaddleOCR-VL's SigLIP embedder)."""
    return grid_vlm_batch(model, config, generator, unflatten=True)


def glm_image_batch(model, config, generator):
    """GLM-Image (image-to-image): each sample has one source image, tokenized into its placeholders, and one
    target grid to generate (``images_per_sample`` counts both; only source images have pixels)."""
    import torch

    pixels, grid, merge = grid_pixels(config.vision_config, generator, images=2, merge_units=2)
    per_image = int(grid[0].prod()) // (merge * merge)
    ids, _ = with_image_tokens(config, text_ids(config, generator), per_image)
    target = torch.tensor([[1, 2, 2]])
    grids = torch.cat([grid[:1], target, grid[1:], target])  # source, target per sample
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels,
            "image_grid_thw": grids, "images_per_sample": torch.tensor([2, 2])}


def text_batch(model, config, generator):
    """Token ids with an explicit attention mask (4.5x M-RoPE text models misread 3-D positions without it)."""
    import torch

    ids = text_ids(config, generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def vision_batch(model, config, generator):
    """A vision tower alone: patches (``hidden_states`` or ``pixel_values``) and ``grid_thw``."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    merge = 2 if "merge_sizes" in params else None
    pixels, grid, merge = grid_pixels(config, generator, merge=merge)
    first = "hidden_states" if "hidden_states" in params else "pixel_values"
    batch = {first: pixels, "grid_thw": grid}
    if "merge_sizes" in params:
        batch["merge_sizes"] = torch.tensor([merge] * grid.shape[0])
    return batch


# ---------------------------------------------------------------- tables

_GRID_VLMS = ("glm4v", "glm46v", "glm4v_moe", "glm5_next", "glm_ocr", "glmga", "cosmos3_edge", "cosmos3_omni",
                   "paddleocr_vl", "video_llama_3", "hyperclovax_vision_v2")
_GRID_TEXTS = ("glm4v_text", "glm4v_moe_text", "glm_ocr_text", "glm_image_text")
_GRID_VISIONS = ("glm4v_vision", "glm4v_moe_vision", "glm5_next_vision", "glm_ocr_vision", "cosmos3_edge_vision",
                "video_llama_3_vision")

CONFIGS = {
    **{t: fix_grid_vlm for t in _GRID_VLMS},
    **{t: fix_grid_vlm for t in _GRID_TEXTS},
    **{t: fix_vision_tower for t in _GRID_VISIONS},
    "glm5_next": fix_glm5_next,
    "glm5_next_text": fix_glm5_next_text,
    "glm_image": fix_glm_image,
    "glm_image_vision": fix_vision_tower,
    "cohere_compass": fix_cohere_compass,
    "cohere_compass_text": fix_cohere_compass,
    "cohere_compass_vision": fix_vision_tower,
}

INPUTS = {
    **{t: grid_vlm_batch for t in _GRID_VLMS},
    **{t: text_batch for t in _GRID_TEXTS},
    **{t: vision_batch for t in _GRID_VISIONS},
    "glm_image": glm_image_batch,
    "glm_image_vision": vision_batch,
    "paddleocr_vl": unflattened_vlm_batch,
    "cohere_compass": grid_vlm_batch,
    "cohere_compass_text": text_batch,
    "cohere_compass_vision": vision_batch,
}

UNBUILDABLE = {
    "glm_image_vqmodel": "GlmImageVQVAE defines no forward() (nn.Module._forward_unimplemented); it is only a "
                         "tokenizer whose encode() GlmImageModel calls, with discrete (non-differentiable) output",
}
