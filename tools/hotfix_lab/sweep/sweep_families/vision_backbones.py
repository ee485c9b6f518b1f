"""Single-image vision models whose sizes must agree with each other: ViT / CNN backbones (RADIO,
Sapiens2, MobileViTV2, ImageGPT, ViT-hybrid), depth estimation (DepthPro) and image matching
(EfficientLoFTR).

What the generic shrink cannot guess here: multi-scale patch encoders and hook lists (DepthPro),
per-stage lists derived at config creation (EfficientLoFTR, MobileViTV2), per-layer head counts
(Sapiens2), position tables sized for the released image size (RADIO), and inputs other than one
image (image pairs for EfficientLoFTR, pixel tokens for ImageGPT).
"""

from __future__ import annotations

from ._vision_common import _pixels, _set_stages


def _depth_pro(config):
    """DepthPro cuts the image into ``patch_size`` squares at each ``scaled_images_ratios`` scale and
    runs ViT encoders whose ``image_size`` must be that patch size; ``intermediate_hook_ids`` index
    the patch encoder's layers and every per-scale / per-hook feature list must have one entry per
    scale / hook.  A 32-pixel image at ratios 0.5 and 1 gives 16-pixel patches (the smallest scale
    must hold one patch); 4-pixel ViT patches make a 4x4 grid."""
    config.patch_size = 16
    config.scaled_images_ratios = [0.5, 1.0]
    config.scaled_images_overlap_ratios = [0.0, 0.25]
    config.scaled_images_feature_dims = [8, 8]
    config.intermediate_hook_ids = [1, 0]
    config.intermediate_feature_dims = [8, 8]
    config.fusion_hidden_size = 8
    for key in ("image_model_config", "patch_model_config", "fov_model_config"):
        sub = getattr(config, key, None)
        if sub is None:
            continue
        sub.image_size, sub.patch_size = config.patch_size, 4
        sub.hidden_size, sub.num_attention_heads, sub.intermediate_size = 16, 2, 32
        if hasattr(sub, "num_hidden_layers"):
            _set_stages(sub, sub.num_hidden_layers)


def _efficientloftr(config):
    """Three RepVGG stages (strides 2, 1, 2: a 32-pixel pair gives 8x8 coarse maps) whose last width
    is hidden_size.  The per-block channel / stride lists are derived from the stage lists when the
    config is created, so they are derived again here for the new stage lists."""
    blocks, strides, widths = [1, 1, 1], [2, 1, 2], [16, 16, 32]
    config.stage_num_blocks, config.stage_stride, config.out_features = blocks, strides, widths
    config.hidden_size, config.intermediate_size = widths[-1], 2 * widths[-1]
    config.stage_in_channels = [1] + widths[:-1]  # the model turns the images to grey first
    config.stage_block_stride = [[s] + [1] * (n - 1) for s, n in zip(strides, blocks)]
    config.stage_block_out_channels = [[w] * n for w, n in zip(widths, blocks)]
    config.stage_block_in_channels = [[i] + o[:-1] for i, o in zip(config.stage_in_channels,
                                                                   config.stage_block_out_channels)]
    config.fine_fusion_dims = list(reversed(widths))[:-1]
    # the 2-D rotary table has hidden_size / 4 frequencies, computed as head_dim * partial_rotary_factor
    # (4) / 2: it only fits with 8 heads (head_dim = hidden_size / 8), the released layout
    config.num_attention_layers, config.num_attention_heads, config.num_key_value_heads = 2, 8, 8
    if getattr(config, "head_dim", None):
        config.head_dim = config.hidden_size // 8
    for key in ("q_aggregation_kernel_size", "kv_aggregation_kernel_size", "q_aggregation_stride",
                "kv_aggregation_stride"):
        setattr(config, key, 1)
    config.fine_kernel_size, config.coarse_matching_border_removal = 2, 0


def _mobilevitv2(config):
    # the network downsamples 32x and the last MobileViT block unfolds patch_size x patch_size
    # patches of that map: 64 pixels leave 2x2 there; channel widths all scale with width_multiplier
    config.image_size, config.patch_size = 64, 2
    config.width_multiplier = 0.25
    config.n_attn_blocks = [1, 1, 1]
    if hasattr(config, "aspp_out_channels"):
        config.aspp_out_channels = 32


def _imagegpt_batch(model, config, generator):
    import torch

    # ImageGPT 4.x derives position ids from the cache length, which is None without a cache
    # (use_cache off, as checkpointing requires): explicit position ids avoid that path
    ids = torch.randint(0, config.vocab_size - 1, (2, 8), generator=generator)
    return {"input_ids": ids, "position_ids": torch.arange(8).unsqueeze(0).expand(2, -1)}


def _radio(config):
    # the patch projection takes flattened channels x patch x patch pixels; the position table is
    # sized for max_img_size (2048 px: 65k positions) and interpolated down, so it is shrunk too
    config.patch_dim = getattr(config, "num_channels", 3) * config.patch_size ** 2
    config.max_img_size = 64


def _sapiens2(config):
    # per-layer key/value head counts are derived for the default 24 layers (full attention in the
    # first / last 8, grouped-query in between); for 2 layers: one full, one grouped (2 heads, 1 kv head)
    n = config.num_hidden_layers
    config.num_first_full_attention_layers, config.num_last_full_attention_layers = 1, 0
    config.num_key_value_attention_heads = 1
    config.num_key_value_heads_per_layer = [config.num_attention_heads] + [1] * (n - 1)
    config.num_register_tokens = 2
    _set_stages(config, n)


CONFIGS = {
    "depth_pro": _depth_pro,
    "efficientloftr": _efficientloftr,
    "mobilevitv2": _mobilevitv2,
    "radio": _radio,
    "sapiens2": _sapiens2,
}

INPUTS = {
    "depth_pro": lambda model, config, g: {"pixel_values": _pixels(2, 3, 32, generator=g)},
    "imagegpt": _imagegpt_batch,
    # image pairs to match: (batch, 2, channels, height, width)
    "efficientloftr": lambda model, config, g: {"pixel_values": _pixels(4, 3, 32, generator=g).view(2, 2, 3, 32, 32)},
}

UNBUILDABLE = {
    # 4.x only (removed in 5.x)
    "vit_hybrid": "ViTHybridPreTrainedModel._init_weights zeroes embeddings.mask_token, which ViTHybridModel(config) "
                  "leaves None (use_mask_token=False): the model cannot be constructed from any config",
}
