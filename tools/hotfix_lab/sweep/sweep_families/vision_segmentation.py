"""Promptable / in-context segmentation models: SAM, SAM-HQ, SegGPT and SAM3-Lite-Text.

What the generic shrink cannot guess here: their image encoder, prompt encoder and mask decoder
must agree on widths and grid sizes (SAM), the prompt and input images are stacked along the
height (SegGPT), and the batches carry prompts (points, prompt images and masks, text).
"""

from __future__ import annotations

from ._vision_common import _pixels


def _sam(config):
    """SAM: a windowed ViT image encoder, a prompt encoder and a mask decoder that must agree.

    The encoder's neck outputs ``output_channels`` = the decoder's and prompt encoder's hidden size;
    the prompt encoder's dense positional grid (``image_embedding_size``) is the encoder's patch grid
    (``image_size / patch_size``), and its random-Fourier features (``num_pos_feats``) are half that
    hidden size.  A 2-pixel window with layer 1 global runs both attention paths on the 4x4 grid."""
    vision, prompt, decoder = config.vision_config, config.prompt_encoder_config, config.mask_decoder_config
    width = decoder.hidden_size
    vision.output_channels = width
    vision.num_pos_feats = width // 2
    vision.window_size = 2
    vision.global_attn_indexes = [1]
    vision.mlp_dim = 2 * vision.hidden_size
    prompt.hidden_size = width
    prompt.image_size, prompt.patch_size = vision.image_size, vision.patch_size
    prompt.image_embedding_size = vision.image_size // vision.patch_size
    prompt.mask_input_channels = 4
    decoder.mlp_dim, decoder.iou_head_hidden_dim = 64, 32
    if hasattr(decoder, "vit_dim"):  # SAM-HQ fuses the encoder's early features (its hidden size) into the masks
        decoder.vit_dim = vision.hidden_size


def _sam_batch(model, config, generator):
    import torch

    size = config.vision_config.image_size
    # one point prompt per image (batch, point_batch, points, xy), in input-image pixels
    points = torch.rand(2, 1, 1, 2, generator=generator) * size
    return {"pixel_values": _pixels(2, 3, size, generator=generator), "input_points": points}


def _seggpt(config):
    """SegGPT stacks prompt image over input image (and prompt mask over itself) along the height:
    ``image_size`` is (2 * height, width) of one input.  The two streams run as two halves of the
    batch until layer ``merge_index`` averages them; the decoder concatenates the layers listed in
    ``intermediate_hidden_state_indices`` (which must exist, after the merge)."""
    config.image_size, config.patch_size, config.pretrain_image_size = [32, 16], 8, 16
    config.mlp_dim, config.decoder_hidden_size = 64, 16
    config.merge_index = 0
    config.intermediate_hidden_state_indices = [0, 1]


def _seggpt_batch(model, config, generator):
    height, width = config.image_size[0] // 2, config.image_size[1]
    return {name: _pixels(2, 3, height, width, generator=generator)
            for name in ("pixel_values", "prompt_pixel_values", "prompt_masks")}


def _sam3_vision(vision):
    """SAM3 vision: a windowed ViT (global attention at ``global_attn_indexes``, rotary tables sized by
    ``pretrain_image_size``) and an FPN that rescales its grid by ``scale_factors``; the FPN width is the
    DETR / mask decoders' hidden size and ``backbone_feature_sizes`` must list the rescaled grids."""
    bb = vision.backbone_config
    bb.window_size, bb.global_attn_indexes = 2, [1]
    bb.pretrain_image_size = bb.image_size
    grid = bb.image_size // bb.patch_size
    vision.backbone_feature_sizes = [[int(grid * f)] * 2 for f in vision.scale_factors[:3]]


def _sam3_lite_text(config):
    _sam3_vision(config.vision_config)
    config.vision_config.fpn_hidden_size = config.detr_encoder_config.hidden_size
    config.detr_decoder_config.num_queries = 8


def _sam3_batch(model, config, generator):
    import torch

    size = config.vision_config.backbone_config.image_size
    vocab = config.text_config.vocab_size
    return {"pixel_values": _pixels(2, 3, size, generator=generator),
            "input_ids": torch.randint(1, vocab, (2, 8), generator=generator)}


def _text_batch(model, config, generator):
    import torch

    return {"input_ids": torch.randint(1, config.vocab_size, (2, 8), generator=generator)}


CONFIGS = {
    "sam": _sam,
    "sam_hq": _sam,
    "seggpt": _seggpt,
    "sam3_lite_text": _sam3_lite_text,
}

INPUTS = {
    "sam": _sam_batch,
    "sam_hq": _sam_batch,
    "seggpt": _seggpt_batch,
    "sam3_lite_text": _sam3_batch,
    # the text tower alone (its main_input_name says pixel_values, its forward takes token ids)
    "sam3_lite_text_text_model": _text_batch,
}
