"""Two-tower (CLIP-like) and joint text-image / video / audio-visual encoders: no placeholders.

ALIGN and X-CLIP compare a text embedding with an image / video embedding; TVLT, TVP, ViLT and
UDOP encode text (or audio) with images or video in one model.  What the generic builder cannot
guess for them:

* sizes that must agree between the towers (pooled widths equal to the contrastive projection,
  X-CLIP's multi-frame transformer at the projection width, TVP's backbone and position grids);
* inputs beyond one image: video frames (batch, frames, C, H, W), spectrograms, pixel masks,
  UDOP's normalised float boxes and decoder ids.

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

from ._vision_language_common import _ids, _image_size, _pixels


# --------------------------------------------------------------------------- video / audio-visual


def _xclip_config(config):
    # The multi-frame integration transformer (MIT, on the vision config) adds its position table
    # to the projected frame embeddings: its width is the projection width.
    vision = config.vision_config
    vision.num_frames = 2
    for owner, key, small in ((vision, "mit_hidden_size", config.projection_dim), (vision, "mit_intermediate_size", 64),
                              (vision, "mit_num_attention_heads", 2), (config, "prompt_num_attention_heads", 2),
                              (config, "prompt_layers", 2)):
        if hasattr(owner, key):
            setattr(owner, key, small)


def _xclip_batch(model, config, generator):
    """X-CLIP: a video (batch, frames, C, H, W) against text."""
    import torch

    size = _image_size(config)
    frames = config.vision_config.num_frames
    return {"input_ids": _ids(config, generator),
            "pixel_values": torch.randn(2, frames, 3, size, size, generator=generator)}


def _tvlt_config(config):
    # video frames and a spectrogram, both cut in 8x8 patches
    config.image_size = 32
    config.image_patch_size = [8, 8]
    config.audio_patch_size = [8, 8]
    config.num_frames = 2
    config.spectrogram_length = 32
    config.frequency_length = 16
    for key, small in (("decoder_hidden_size", 32), ("decoder_num_attention_heads", 2),
                       ("decoder_num_hidden_layers", 2), ("decoder_intermediate_size", 64)):
        setattr(config, key, small)


def _tvlt_batch(model, config, generator):
    import torch

    return {"pixel_values": torch.randn(2, config.num_frames, 3, config.image_size, config.image_size,
                                        generator=generator),
            "audio_values": torch.randn(2, 1, config.spectrogram_length, config.frequency_length,
                                        generator=generator)}


def _tvp_config(config):
    # 4.x's TvpConfig lacks type_vocab_size although its text embeddings read it.
    if not hasattr(config, "type_vocab_size"):
        config.type_vocab_size = 2
    config.num_frames = 2
    config.max_img_size = 64  # the ResNet backbone downsamples 32x, then the grid encoder max-pools 2x2
    config.visual_prompt_size = 4
    config.max_grid_col_position_embeddings = 8
    config.max_grid_row_position_embeddings = 8
    backbone = getattr(config, "backbone_config", None)
    if backbone is not None and hasattr(backbone, "hidden_sizes"):
        # a ResNet-50 by default (24M parameters): one narrow basic block per stage (still 32x down)
        backbone.embedding_size = 16
        backbone.hidden_sizes = [16, 16, 32, 32]
        backbone.depths = [1, 1, 1, 1]
        backbone.layer_type = "basic"


def _tvp_batch(model, config, generator):
    """TVP: a video (batch, frames, C, H, W) and a text query.  Batch size 1: the 2-D position
    embeddings are viewed with the batch size folded in (``col_shape = (batch, 1, width, hidden)``
    over a ``(width, hidden)`` table), which only fits one sample."""
    import torch

    ids = _ids(config, generator, batch=1)
    size = config.max_img_size
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(1, config.num_frames, 3, size, size, generator=generator)}


def _vilt_batch(model, config, generator):
    """ViLT: text and an image with its pixel mask (no vision_config for the generic batch to read)."""
    import torch

    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    return {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, size),
            "pixel_mask": torch.ones(2, size, size, dtype=torch.long)}


def _udop_batch(model, config, generator):
    """UDOP: document tokens with normalised float boxes (the generic LayoutLM boxes are integer
    pixels), the page image, and decoder ids."""
    import torch

    ids = _ids(config, generator)
    x0 = torch.rand(2, ids.shape[1], 1, generator=generator) * 0.5
    y0 = torch.rand(2, ids.shape[1], 1, generator=generator) * 0.5
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "bbox": torch.cat([x0, y0, x0 + 0.2, y0 + 0.2], -1),
            "pixel_values": _pixels(generator, getattr(config, "image_size", 32)),
            "decoder_input_ids": _ids(config, generator, length=4)}


# --------------------------------------------------------------------------- align


def _align_config(config):
    # The image embedding is the EfficientNet's last stage width (``round_filters(out_channels[-1])``),
    # compared by matmul with the text projection: a two-stage, width-1 tower whose last stage is
    # as wide as the projection keeps both towers equal.
    vision = config.vision_config
    vision.width_coefficient = 1.0
    vision.depth_coefficient = 1.0
    vision.kernel_sizes = [3, 3]
    vision.in_channels = [32, 16]
    vision.out_channels = [16, config.projection_dim]
    vision.strides = [1, 2]
    vision.num_block_repeats = [1, 1]
    vision.expand_ratios = [1, 2]
    vision.depthwise_padding = []
    vision.image_size = 32
    vision.num_hidden_layers = 2


CONFIGS = {
    "align": _align_config,
    "xclip": _xclip_config,
    "tvlt": _tvlt_config,
    "tvp": _tvp_config,
}

INPUTS = {
    "xclip": _xclip_batch,
    "tvlt": _tvlt_batch,
    "tvp": _tvp_batch,
    "vilt": _vilt_batch,
    "udop": _udop_batch,
}
