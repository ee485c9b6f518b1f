"""Hierarchical (Swin-like) vision transformers: swin, swinv2, donut-swin, maskformer-swin, swin2sr.

What the generic shrink cannot guess here: these models keep per-stage lists (``depths``,
``num_heads``) that the shrink leaves at their full length; the last stage's width
``embed_dim * 2 ** (stages - 1)`` must equal ``hidden_size``, every stage's heads must divide its
width, and ``window_size`` must divide each stage's feature map (``image_size / patch_size``
halved per stage).
"""

from __future__ import annotations

from ._vision_common import _set_stages


def _hierarchical(config, embed_dim=16, depths=(2, 1), heads=(1, 2), window=2, image=32, patch=4, widening=True):
    """Two small stages: widths embed_dim, 2*embed_dim (heads divide them), window 2 divides the
    8x8 / 4x4 feature maps of a 32-pixel image cut in 4-pixel patches.  The first stage has two
    blocks so that the second one runs the shifted-window path (and its attention mask)."""
    config.embed_dim = embed_dim
    config.depths = list(depths)
    config.num_heads = list(heads)
    config.window_size = window
    config.image_size = image
    config.patch_size = patch
    if hasattr(config, "num_layers"):
        config.num_layers = len(depths)
    if hasattr(config, "hidden_size"):
        config.hidden_size = embed_dim * 2 ** (len(depths) - 1) if widening else embed_dim
    if hasattr(config, "pretrained_window_sizes"):
        config.pretrained_window_sizes = [0] * len(depths)
    _set_stages(config, len(depths))
    return config


def _swin2sr(config):
    # no downsampling between stages: every stage keeps embed_dim and a 16x16 map (window 4 divides it)
    _hierarchical(config, embed_dim=16, depths=(2, 1), heads=(2, 2), window=4, image=16, patch=1, widening=False)


CONFIGS = {
    "swin": _hierarchical,
    "swinv2": _hierarchical,
    "donut-swin": _hierarchical,
    "maskformer-swin": _hierarchical,
    "swin2sr": _swin2sr,
}
