"""DETR-like object detectors: detr, conditional_detr, deformable_detr, deta.

What the generic shrink cannot guess here: detection models default to a timm backbone, which cannot
be imported here (timm needs torchvision); where the config allows it they are switched to a small
transformers backbone (a tiny ResNet), with few object queries and images large enough for its
32x downsampling.
"""

from __future__ import annotations

from ._vision_common import _pixels


def _resnet_backbone(config, out_stages=(2, 3, 4), queries=8):
    """Replace a DETR-like detector's timm ResNet-50 by a tiny transformers ResNet (four stages of
    one basic block; the detector reads the listed stages) and ask for few object queries.

    ``use_timm_backbone`` / ``backbone`` / ``use_pretrained_backbone`` exist in 4.x configs only:
    with ``backbone`` still naming resnet50 the 4.x builders would ask timm (or the hub) for it."""
    from transformers import ResNetConfig

    config.backbone_config = ResNetConfig(
        num_channels=getattr(config, "num_channels", 3), embedding_size=8, hidden_sizes=[8, 16, 16, 32],
        depths=[1, 1, 1, 1], layer_type="basic", hidden_act="relu",
        out_features=[f"stage{i}" for i in out_stages])
    for key, value in (("use_timm_backbone", False), ("backbone", None), ("use_pretrained_backbone", False),
                       ("backbone_kwargs", None)):
        if hasattr(config, key):
            setattr(config, key, value)
    config.num_queries = queries
    if hasattr(config, "two_stage_num_proposals"):
        config.two_stage_num_proposals = queries
    if hasattr(config, "disable_custom_kernels"):
        config.disable_custom_kernels = True  # the pure-PyTorch deformable attention, no compiled kernel
    return config


def _detr(config):
    _resnet_backbone(config, out_stages=(4,))  # DETR projects the last stage only


def _deta(config):
    # two_stage proposals use torchvision's batched_nms (DetaModel refuses to build without
    # torchvision when two_stage is set); the single-stage path is pure PyTorch
    _resnet_backbone(config)
    config.two_stage = False
    config.assign_first_stage = False


def _detection_batch(model, config, generator):
    # a ResNet downsamples 32x at its last stage: 64 pixels give a 2x2 map there (8x8 at stage 2)
    return {"pixel_values": _pixels(2, getattr(config, "num_channels", 3), 64, generator=generator)}


CONFIGS = {
    "detr": _detr,
    "conditional_detr": _detr,
    "deformable_detr": _resnet_backbone,
    "deta": _deta,
}

INPUTS = {
    "detr": _detection_batch,
    "conditional_detr": _detection_batch,
    "deformable_detr": _detection_batch,
    "deta": _detection_batch,
}
