"""The vision towers of the Qwen-VL lineage's patch-grid models, built alone.

A tower takes a flat list of patches (``pixel_values`` or ``hidden_states``) and their grid
(``grid_thw`` / ``image_grid_thw``, one ``(t, h, w)`` row per image), not an image tensor; it keeps its
full depth and layer-index lists (``fullatt_block_indexes``, ``deepstack_visual_indexes``,
``layer_types``) unless told.  :func:`_fix_tower` makes it a 2-block tower (``_fix_vision`` of
``_vision_grid_qwen_common``, its merger emitting the tower's own width) and :func:`_tower_batch`
makes the patches in the tower's layout (Qwen's flat rows, Kimi-K2.5's per-patch images, Inkling2's
merged blocks).  The whole models are in ``vision_grid_qwen_models``.
"""

from __future__ import annotations

from functools import partial

from ._vision_grid_qwen_common import _fix_vision, _patches


# ---------------------------------------------------------------- config fixes


def _fix_tower(config):
    """Config fix for the vision tower alone."""
    _fix_vision(config, None)


# ---------------------------------------------------------------- inputs


def _tower_batch(model, config, generator, layout="flat"):
    """The vision tower alone: patches and their grid, under the names its forward uses."""
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    pixels, grid_thw, _ = _patches(config, generator, layout)
    batch = {next(n for n in ("pixel_values", "hidden_states") if n in params): pixels}
    if grid_thw is not None:
        batch[next(n for n in ("grid_thw", "image_grid_thw") if n in params)] = grid_thw
    return batch


_TOWERS = ("qwen2_5_vl_vision", "qwen3_vl_vision", "qwen3_vl_moe_vision", "qwen3_5_vision", "qwen3_5_moe_vision",
           "qwen4_exp_vision", "hunyuan_vl_vision", "lfm3_vl_vision", "muse_glimmer_vision", "muse_spark_vision",
           "exaone4_5_vision")

CONFIGS = {
    **{t: _fix_tower for t in _TOWERS + ("kimi_k25_vision", "inkling2_vision")},
}

INPUTS = {
    **{t: _tower_batch for t in _TOWERS},
    "kimi_k25_vision": partial(_tower_batch, layout="conv"),
    "inkling2_vision": partial(_tower_batch, layout="merged"),
}

UNBUILDABLE = {}
