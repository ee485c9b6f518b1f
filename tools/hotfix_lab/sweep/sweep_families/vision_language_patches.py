"""Vision-language models and towers that take images as flattened patches with their grid.

SigLIP2 (NaFlex) and its kin (LFM2-VL), Gemma 4's tower, MiniMax-M3-VL (Qwen2-VL-style patch rows
with ``image_grid_thw``), Molmo2 (crops as patch rows with a pooling index) and DeepSeek-VL-Hybrid
(a low- and a high-resolution view of each image).  What the generic builder cannot guess:

* the patch layout: ``pixel_values`` (batch, patches, C*P*P) or all images' patch rows, with
  ``pixel_attention_mask`` / ``spatial_shapes``, per-patch positions, grids or pooling indices;
* position tables and projectors sized for the tiny patch grid (``num_patches``, pooling kernels,
  the merged / projector widths derived from the full-size text width);
* the number of image placeholders, tried against the model's own mismatch check
  (``with_placeholders``) or computed from the config.

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

from ._vision_language_common import _ids, _image_size, _pixels, with_placeholders


# --------------------------------------------------------------------------- NaFlex patches (SigLIP2 and kin)


def _naflex_config(config):
    # A 4x4 patch grid; the learned position table is sqrt(num_patches) wide and gets resized.
    vision = getattr(config, "vision_config", None) or config
    vision.num_patches = 16


def _naflex_inputs(config, generator, grid=4):
    """Images as flattened patches (batch, patches, C*P*P) with a patch mask and each image's grid."""
    import torch

    vision = getattr(config, "vision_config", None) or config
    width = getattr(vision, "num_channels", 3) * vision.patch_size ** 2
    return {"pixel_values": torch.randn(2, grid * grid, width, generator=generator),
            "pixel_attention_mask": torch.ones(2, grid * grid, dtype=torch.long),
            "spatial_shapes": torch.tensor([[grid, grid]] * 2)}


def _naflex_tower_batch(model, config, generator):
    return _naflex_inputs(config, generator)


def _naflex_pair_batch(model, config, generator):
    return dict(_naflex_inputs(config, generator), input_ids=_ids(config, generator))


def _lfm2_vl_config(config):
    _naflex_config(config)
    config.projector_hidden_size = 64  # 2560 by default


def _lfm2_vl_batch(model, config, generator):
    batch = dict(_naflex_inputs(config, generator), input_ids=_ids(config, generator))
    return with_placeholders(model, config, batch)


def _gemma4_vision_config(config):
    config.pooling_kernel_size = 2  # 2x2 pooling of a 4x4 patch grid (3x3 by default)


def _gemma4_vision_batch(model, config, generator):
    """Gemma 4's tower: flattened patches (batch, patches, 3*P*P) and each patch's (x, y) cell."""
    import torch

    grid = 4
    cells = torch.tensor([[x, y] for y in range(grid) for x in range(grid)])
    return {"pixel_values": torch.rand(2, grid * grid, 3 * config.patch_size ** 2, generator=generator),
            "pixel_position_ids": cells.expand(2, -1, -1).clone()}


def _deepseek_vl_hybrid_config(config):
    """The high-resolution SAM tower: a 32 px image, a global-attention layer that a 2-layer tower
    has (its output is tapped), a narrow neck, and windows that fit the 4x4 patch grid."""
    high = config.high_res_vision_config
    high.image_size = 32
    high.patch_size = 8
    high.global_attn_indexes = [0]  # tapped at hidden_states[index + 1]: a layer output in every release
    high.output_channels = 16
    high.window_size = 2
    if hasattr(high, "mlp_dim"):
        high.mlp_dim = 64


def _deepseek_vl_hybrid_batch(model, config, generator):
    """A low-resolution and a high-resolution view of each image, and the placeholders."""
    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, _image_size(config)),
             "high_res_pixel_values": _pixels(generator, config.high_res_vision_config.image_size)}
    # one token per low-res patch; 4.5x's masked_scatter has no count check (accepts fewer), so
    # this count is tried first
    patches = (_image_size(config) // config.vision_config.patch_size) ** 2
    return with_placeholders(model, config, batch, counts=[patches, *range(1, 65)])


def _minimax_m3_vl_config(config):
    # Derived in __post_init__ from the full-size text width: recompute from the shrunk one.
    config.projector_hidden_size = 64
    config.merged_hidden_size = config.text_config.hidden_size * config.vision_config.spatial_merge_size ** 2


def _grid_thw_batch(model, config, generator, grid=4):
    """Qwen2-VL-style towers: all images' patches flattened to rows of C*T*P*P values, with each
    image's (frames, height, width) patch grid; the grid is a multiple of the spatial merge."""
    import torch

    vision = config.vision_config
    temporal = getattr(vision, "temporal_patch_size", 1) or 1
    width = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    width *= temporal * vision.patch_size ** 2
    batch = {"input_ids": _ids(config, generator),
             "pixel_values": torch.randn(2 * grid * grid, width, generator=generator),
             "image_grid_thw": torch.tensor([[1, grid, grid]] * 2)}
    return with_placeholders(model, config, batch)


def _molmo2_config(config):
    """Molmo2: a 4x4-patch crop per image (the position table is one row per patch); the adapter
    concatenates two tower layers that exist (hidden_states[2] and [1]) at the tower's width and
    projects to the text width."""
    vision, adapter, text = config.vision_config, config.adapter_config, config.text_config
    vision.image_size = [32, 32] if isinstance(vision.image_size, (list, tuple)) else 32
    vision.num_position_embeddings = (32 // vision.patch_size) ** 2
    adapter.vision_feature_layer = [1, 0]
    adapter.hidden_size = vision.hidden_size
    adapter.text_hidden_size = text.hidden_size
    config.image_patch_id = text.vocab_size - 1


def _molmo2_batch(model, config, generator, pool=2):
    """Crops as patch rows (images, crops, patches, P*P*C); ``image_token_pooling`` lists, for each
    output token, the flat patch indices it pools (2x2 blocks); ``image_grids`` gives each image's
    (low-res h, w, high-res h, w) token grid; ``mm_token_type_ids`` marks the image tokens."""
    import torch

    side = 32 // config.vision_config.patch_size
    out = side // pool
    width = 3 * config.vision_config.patch_size ** 2
    rows = []
    for image in range(2):
        for i in range(out):
            for j in range(out):
                rows.append([image * side * side + (pool * i + di) * side + pool * j + dj
                             for di in range(pool) for dj in range(pool)])
    n = out * out
    token = config.image_patch_id
    ids = torch.cat([torch.full((2, n), token), _ids(config, generator)], 1)
    kinds = torch.zeros_like(ids)
    kinds[:, :n] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": kinds,
            "pixel_values": torch.randn(2, 1, side * side, width, generator=generator),
            "image_token_pooling": torch.tensor(rows), "image_grids": torch.tensor([[out, out, 0, 0]] * 2),
            "image_num_crops": torch.tensor([1, 1])}


CONFIGS = {
    "siglip2": _naflex_config,
    "siglip2_vision_model": _naflex_config,
    "lfm2_vl": _lfm2_vl_config,
    "gemma4_vision": _gemma4_vision_config,
    "deepseek_vl_hybrid": _deepseek_vl_hybrid_config,
    "minimax_m3_vl": _minimax_m3_vl_config,
    "molmo2": _molmo2_config,
}

INPUTS = {
    "siglip2": _naflex_pair_batch,
    "siglip2_vision_model": _naflex_tower_batch,
    "lfm2_vl": _lfm2_vl_batch,
    "gemma4_vision": _gemma4_vision_batch,
    "deepseek_vl_hybrid": _deepseek_vl_hybrid_batch,
    "minimax_m3_vl": _grid_thw_batch,
    "molmo2": _molmo2_batch,
}
