"""Granite-4 Vision, a neighbour of the patch-grid GLM family (``vision_grid_glm``) with another image
layout: LLaVA-Next anyres crops (base image + pinpoint crops) with window Q-Former projectors injected
into text layers.  The Q-Former, projector layer maps and pinpoints must agree with the shrunk vision
and text sizes, and the multimodal token ids must fit the shrunk vocabulary.  The facts come from
transformers' own ModelTesters.
"""

from __future__ import annotations

from ._vision_grid_glm_common import _first, fix_token_ids, text_ids


def fix_granite4_vision(config):
    """Granite-4 Vision (LLaVA-Next anyres + window Q-Former projectors injected into text layers): the
    Q-Former's width and heads derive from the vision width at construction (heads = width // 64), the
    projector maps vision layers to text layers that must exist, and the anyres pinpoints must fit the image."""
    vision, text, qformer = config.vision_config, config.text_config, config.qformer_config
    vision.hidden_size, vision.intermediate_size, vision.image_size, vision.patch_size = 64, 64, 8, 2
    qformer.hidden_size = qformer.encoder_hidden_size = vision.hidden_size
    qformer.num_attention_heads = vision.hidden_size // 64
    qformer.intermediate_size = 64
    config.image_grid_pinpoints = [[vision.image_size, vision.image_size]]
    config.downsample_rate = "1/2"
    config.projector_dropout = 0.0
    last = text.num_hidden_layers - 1
    config.deepstack_layer_map = [(vision.num_hidden_layers - 1, 0)]  # a vision layer into the first text layer
    config.spatial_target_layers = [last] * 4  # the four offset groups into the last text layer
    fix_token_ids(config)


def anyres_batch(model, config, generator, crops: int = 2):
    """LLaVA-Next anyres: ``(batch, crops, channels, size, size)`` pixels (base image + one pinpoint crop),
    ``image_sizes``, and as many placeholders as the model makes features (``fit_image_tokens``)."""
    import torch
    from hotfix_lab.sweep.sweep_inputs import fit_image_tokens

    vision = config.vision_config
    size = _first(vision.image_size)
    batch = {"input_ids": text_ids(config, generator),
             "pixel_values": torch.randn(2, crops, vision.num_channels, size, size, generator=generator),
             "image_sizes": torch.tensor([[size, size]] * 2)}
    batch = fit_image_tokens(model, config, batch)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


CONFIGS = {
    "granite4_vision": fix_granite4_vision,
}

INPUTS = {
    "granite4_vision": anyres_batch,
}
