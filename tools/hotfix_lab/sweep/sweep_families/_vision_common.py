"""Helpers shared by the vision families (``vision_hierarchical``, ``vision_video``, ``vision_detection``,
``vision_segmentation``, ``vision_ocr``, ``vision_backbones``): random image tensors and backbone stage names.
No tables: the model types live in those modules."""

from __future__ import annotations


def _pixels(batch, channels, height, width=None, generator=None):
    import torch

    return torch.randn(batch, channels, height, width or height, generator=generator)


def _set_stages(config, n):
    """Backbone configs name their stages; after changing the stage count the names and the
    requested outputs must follow (``out_features`` must name existing stages)."""
    if not hasattr(config, "stage_names"):
        return
    config.stage_names = ["stem"] + [f"stage{i}" for i in range(1, n + 1)]
    if hasattr(config, "out_features"):
        # the property setter re-aligns out_indices with the new stage names
        config.out_features = [f"stage{n}"]


def _image_batch(model, config, generator):
    size = config.image_size
    size = size[0] if isinstance(size, (list, tuple)) else size
    return {"pixel_values": _pixels(2, getattr(config, "num_channels", 3), size, generator=generator)}
