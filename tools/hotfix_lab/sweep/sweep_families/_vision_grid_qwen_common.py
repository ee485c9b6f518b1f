"""Shared helpers of the Qwen-VL patch-grid modules (``vision_grid_qwen_models``, ``..._towers``).

The vision tower of the Qwen-VL lineage does not take an image tensor: ``pixel_values`` is a flat list
of patches and ``image_grid_thw`` / ``grid_thw`` (one ``(t, h, w)`` row per image, in patches) says how
the rows form images.  Shared by whole models and towers alone: :func:`_fix_vision` (a 2-block tower
whose layer-index lists fit, whose merger emits the text width), :func:`_fix_layers` (one layer of each
kind in hybrid stacks) and :func:`_patches` (patches and grid in the layout a tower reads: Qwen's flat
rows, Kimi-K2.5's per-patch images, Inkling2's merged blocks, Inkling's space-time cubes).  This module
defines no tables.
"""

from __future__ import annotations

# image grid in patches per image: (t, h, w); h and w are multiples of every spatial merge used here
_GRID = (1, 4, 4)
_BATCH = 2
# special ids are moved to the top of the vocabulary; text tokens are drawn below this many top ids
_RESERVED = 16


def _text(config):
    return getattr(config, "text_config", None) or config


def _vision(config):
    return getattr(config, "vision_config", None) or config


def _set(config, name, value):
    """Set ``name`` only where the release's config has it (attributes differ between releases)."""
    if hasattr(config, name):
        setattr(config, name, value)


def _int(config, *names):
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _head_dim(text):
    return _int(text, "head_dim") or text.hidden_size // text.num_attention_heads


# ---------------------------------------------------------------- config fixes


def _fix_layers(config):
    """Keep one layer of each kind (hybrid stacks), and every per-layer list in step with ``layer_types``.

    Cut to two layers, ``layer_types`` would keep its first two entries (Qwen3.5: two linear-attention
    layers), so the full-attention layer, the one that uses M-RoPE, would never run.  Lists indexed by
    layer (``layer_rope_theta``, ``mlp_layer_types``) keep the same layers.
    """
    kinds = getattr(config, "layer_types", None)
    layers = _int(config, "num_hidden_layers", "depth")
    if not isinstance(kinds, (list, tuple)) or not layers or len(kinds) <= layers:
        return
    first = list({kind: i for i, kind in reversed(list(enumerate(kinds)))}.values())[::-1]
    keep = sorted((first + [i for i in range(len(kinds)) if i not in first])[:layers])
    for key, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == len(kinds) and not key.startswith("_"):
            setattr(config, key, [value[i] for i in keep])


def _fix_vision(vision, out_hidden):
    """A 2-block vision tower whose merger emits ``out_hidden`` (the text width; the tower's own if None)."""
    _set(vision, "depth", 2)
    _fix_layers(vision)  # LFM3-VL / Muse: conv or windowed blocks mixed with full attention
    if getattr(vision, "fullatt_block_indexes", None) is not None:
        vision.fullatt_block_indexes = [1]  # block 0 windowed, block 1 full attention
    if getattr(vision, "deepstack_visual_indexes", None) is not None:
        vision.deepstack_visual_indexes = [0]
    if _int(vision, "num_position_embeddings"):
        vision.num_position_embeddings = 64  # a square (8 x 8) learnt position grid, interpolated to the image
    for key in ("pos_emb_height", "pos_emb_width", "posemb_grid_size"):  # learnt grids of 32 / 64 a side
        if _int(vision, key):
            setattr(vision, key, 8)
    patch, merge = _int(vision, "patch_size") or 8, _int(vision, "spatial_merge_size") or 2
    if _int(vision, "window_size"):
        vision.window_size = patch * merge * 2  # windows of 2 x 2 merged tokens, so windowing really splits
    if _int(vision, "max_image_size"):  # HunYuan-VL: a learnt position per patch of a 2048-pixel image
        vision.max_image_size = patch * 8
        _set(vision, "min_image_size", min(_int(vision, "min_image_size") or 0, vision.max_image_size))
    for key in ("projection_hidden_dim",):  # Inkling2's merger MLP is 4096 wide
        if _int(vision, key):
            setattr(vision, key, 64)
    out = out_hidden if out_hidden is not None else vision.hidden_size
    for key in ("out_hidden_size", "text_hidden_size"):
        if _int(vision, key):
            setattr(vision, key, out)
    if out_hidden is not None and hasattr(vision, "embed_dim") and not hasattr(vision, "out_hidden_size"):
        vision.hidden_size = out_hidden  # Qwen2-VL: embed_dim inside the tower, hidden_size = merger output


# ---------------------------------------------------------------- inputs


def _patches(vision, generator, layout="flat", images=_BATCH, grid=_GRID):
    """(pixel_values, grid_thw, features per image) for ``images`` images of ``grid`` patches each.

    ``layout`` is how a patch is stored:
    ``flat``   one row of channels x temporal x patch x patch values per patch (Qwen-VL and most);
    ``conv``   one (channels, patch, patch) image per patch, a (kh, kw) kernel merges and frames are
               averaged (Kimi-K2.5's MoonViT);
    ``merged`` one (patch x merge, patch x merge, channels) block per feature, the grid counted in
               features (Inkling2);
    ``cube``   one (temporal, patch, patch, channels) cube per feature, no grid (Inkling).
    """
    import torch

    t, h, w = grid
    temporal = _int(vision, "temporal_patch_size", "patch_temporal") or 1
    channels = _int(vision, "in_channels", "num_channels") or 3
    patch = vision.patch_size
    if layout == "conv":
        kh, kw = vision.merge_kernel_size
        pixels = torch.randn(images * t * h * w, channels, patch, patch, generator=generator)
        return pixels, torch.tensor([[t, h, w]] * images), h * w // (kh * kw)
    merge = _int(vision, "spatial_merge_size", "merge_size") or 1
    if layout == "merged":
        tokens = t * (h // merge) * (w // merge)
        pixels = torch.randn(images * tokens, patch * merge, patch * merge, channels, generator=generator)
        return pixels, torch.tensor([[t, h // merge, w // merge]] * images), tokens
    if layout == "cube":
        pixels = torch.randn(images * t * h * w, temporal, patch, patch, channels, generator=generator)
        return pixels, None, t * h * w
    pixels = torch.randn(images * t * h * w, channels * temporal * patch * patch, generator=generator)
    return pixels, torch.tensor([[t, h, w]] * images), t * h * w // (merge * merge)
