"""MiniCPM's packed NaViT-style SigLIP vision towers (MiniCPM-OCR, MiniCPM-V 4.7), a neighbour of the
patch-grid GLM family (``vision_grid_glm``) with another image layout: all patches of all images packed
into one image, and ``target_sizes`` (patch rows, columns) per image instead of a ``grid_thw``.  The
facts come from transformers' own ModelTesters.
"""

from __future__ import annotations

from ._vision_grid_glm_common import _first


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


CONFIGS = {
    "minicpm_ocr_vision": fix_minicpm_vision,
    "minicpmv4_7_vision": fix_minicpm_vision,
}

INPUTS = {
    "minicpm_ocr_vision": minicpm_vision_batch,
    "minicpmv4_7_vision": minicpm_vision_batch,
}
