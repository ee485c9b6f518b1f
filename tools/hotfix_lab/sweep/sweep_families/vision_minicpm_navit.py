"""MiniCPM's packed NaViT-style SigLIP vision towers (MiniCPM-OCR, MiniCPM-V 4.6/4.7), a neighbour of the
patch-grid GLM family (``vision_grid_glm``) with another image layout: all patches of all images packed
into one image, and ``target_sizes`` (patch rows, columns) per image instead of a ``grid_thw``, and the
vision-language models built on them (a Qwen3.5 hybrid text model).  The facts come from transformers'
own ModelTesters.
"""

from __future__ import annotations

from ._vision_grid_glm_common import _first
from ._vision_grid_qwen_common import _fix_layers
from ._vision_language_common import _ids, _last_token, with_placeholders


def fix_minicpm_vision(config):
    """MiniCPM-OCR / V4.7 SigLIP tower: its window merger runs after layer ``insert_layer_id`` (6 by default,
    past the 2 layers kept), so move it to the first layer to exercise it."""
    if isinstance(getattr(config, "insert_layer_id", None), int):
        config.insert_layer_id = 0


def minicpm_vision_batch(model, config, generator, images: int = 2, side: int = 4):
    """MiniCPM's NaViT-style SigLIP: all patches of all images packed along the width of one
    ``(1, channels, patch, patches*patch)`` image, and ``target_sizes`` (patch rows, columns) per image."""
    import torch

    patch = _first(config.patch_size)
    pixels = torch.randn(1, config.num_channels, patch, images * side * side * patch, generator=generator)
    return {"pixel_values": pixels, "target_sizes": torch.tensor([[side, side]] * images, dtype=torch.int32)}


def fix_minicpm_vlm(config):
    """The vision-language model: an image placeholder id (the config has none, so without one the images
    are never encoded and the tower never reaches the loss), the window merger moved to the first kept
    layer, the full merge pipeline (``"16x"``: the ``vit_merger`` runs; ``"4x"`` skips it), and a text
    model that keeps one layer of each kind (cut to two, Qwen3.5's layer types would leave two
    linear-attention layers and no attention projection for LoRA)."""
    config.image_token_id = _last_token(config)
    config.insert_layer_id = 0
    fix_minicpm_vision(config.vision_config)
    config.downsample_mode = "16x"
    _fix_layers(config.text_config)


def minicpm_vlm_batch(model, config, generator):
    """Text with as many placeholders as the packed images make features (one image per sample); V4.7 lays
    out M-RoPE positions from ``mm_token_type_ids`` (1 marks an image token), which it requires."""
    import inspect

    batch = dict(minicpm_vision_batch(model, config.vision_config, generator), input_ids=_ids(config, generator))
    types = "mm_token_type_ids" if "mm_token_type_ids" in inspect.signature(model.forward).parameters else None
    return with_placeholders(model, config, batch, token=config.image_token_id, token_types=types)


CONFIGS = {
    "minicpm_ocr_vision": fix_minicpm_vision,
    "minicpmv4_7_vision": fix_minicpm_vision,
    "minicpm_ocr": fix_minicpm_vlm,
    "minicpmv4_6": fix_minicpm_vlm,
    "minicpmv4_7": fix_minicpm_vlm,
}

INPUTS = {
    "minicpm_ocr_vision": minicpm_vision_batch,
    "minicpmv4_7_vision": minicpm_vision_batch,
    "minicpm_ocr": minicpm_vlm_batch,
    "minicpmv4_6": minicpm_vlm_batch,
    "minicpmv4_7": minicpm_vlm_batch,
}
