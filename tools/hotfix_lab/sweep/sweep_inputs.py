"""Dummy inputs for a model the sweep built: what its forward needs, by modality.

:func:`dummy_batch` reads ``main_input_name`` and the forward signature (token ids, pixels, audio
features or waveforms, both towers of a CLIP-like model, decoder ids, LayoutLM boxes).
:func:`fit_image_tokens` makes a vision-language batch consistent: such models replace
``image_token_id`` placeholders in ``input_ids`` by the vision tower's features and refuse a
batch whose count differs ("Image features and image tokens do not match").
"""

from __future__ import annotations

import inspect
import re
from typing import Dict

_MISMATCH = re.compile(r"tokens:? (\d+), features:? (\d+)")


def _sub(config, *names):
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def dummy_batch(model, config, seed: int = 0) -> Dict:
    """A batch for ``model`` from its main_input_name and forward signature."""
    import torch

    g = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    name = getattr(model, "main_input_name", "input_ids")
    batch: Dict = {}
    text = _sub(config, "text_config", "decoder")
    vocab = getattr(config, "vocab_size", None) or getattr(text, "vocab_size", None) or 100
    if name == "input_ids":
        batch["input_ids"] = torch.randint(3, min(vocab, 100), (2, 8), generator=g)
    elif name == "pixel_values":
        vision = _sub(config, "vision_config", "backbone_config")
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(vision, "num_channels", 3)
        batch["pixel_values"] = torch.randn(2, channels, size, size, generator=g)
    elif name == "input_values":
        batch["input_values"] = torch.randn(2, 1600, generator=g)
    elif name == "input_features":
        if getattr(config, "num_mel_bins", None) and getattr(config, "max_source_positions", None):
            batch["input_features"] = torch.randn(2, config.num_mel_bins, 2 * config.max_source_positions, generator=g)
        else:
            feat = getattr(config, "input_feat_per_channel", None) or getattr(config, "feature_size", None) or 80
            chans = getattr(config, "input_channels", 1)
            batch["input_features"] = torch.randn(2, 16, feat * chans, generator=g)
    else:
        raise ValueError(f"no dummy input for main_input_name={name!r}")
    # two-tower / multimodal models (CLIP-like): both inputs
    if "pixel_values" in params and "pixel_values" not in batch and getattr(config, "vision_config", None) is not None:
        vision = config.vision_config
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        batch["pixel_values"] = torch.randn(2, getattr(vision, "num_channels", 3), size, size, generator=g)
    if "input_ids" in params and "input_ids" not in batch and getattr(config, "text_config", None) is not None:
        batch["input_ids"] = torch.randint(3, min(vocab, 100), (2, 8), generator=g)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = torch.randint(3, min(vocab, 100), (2, 6), generator=g)
    if "bbox" in params:
        x0 = torch.randint(0, 30, (2, 8, 1), generator=g)
        y0 = torch.randint(0, 30, (2, 8, 1), generator=g)
        batch["bbox"] = torch.cat([x0, y0, x0 + 5, y0 + 5], dim=-1)
    return batch


def to_dtype(value, dtype):
    """``value`` with every floating tensor cast to ``dtype``, through nested dicts, lists and tuples (the
    structure rebuilt as hotfix rebuilds a checkpointed call's, named tuples and dict subclasses kept);
    token ids, masks and anything else unchanged (``--dtype float64``: batch and model in one dtype)."""
    import torch

    from hotfix.checkpointing.structure import rebuild

    def is_float(item):
        return isinstance(item, torch.Tensor) and item.is_floating_point()

    return rebuild(value, is_float, lambda tensor: tensor.to(dtype))


def image_token_key(config):
    """The name under which this config keeps its image placeholder id (top level or text config), or None."""
    for owner in (config, getattr(config, "text_config", None)):
        for key in ("image_token_id", "image_token_index"):
            if isinstance(getattr(owner, key, None), int):
                return key
    return None


def fit_image_tokens(model, config, batch: Dict) -> Dict:
    """Put as many image placeholder tokens in ``input_ids`` as the vision tower makes features.

    The count is learnt from the model itself, not from per-model formulas: a no-grad forward
    with one placeholder per sample says how many features the images give (F) and how many
    placeholders it found (T1 = batch x the unit it counts in); F / T1 or F / (T1 x hidden)
    placeholders per sample (models count features in tokens or in hidden elements) is tried.  Models without an image token, or
    whose forward fails otherwise, get the batch back unchanged (the check reports what fails).
    """
    import torch

    key = image_token_key(config)
    if key is None or "input_ids" not in batch or "pixel_values" not in batch:
        return batch
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    token = vocab - 1 if isinstance(vocab, int) else getattr(config, key)
    for owner in (config, getattr(config, "text_config", None), getattr(model, "config", None)):
        if owner is not None and hasattr(owner, key):
            setattr(owner, key, token)
    ids = batch["input_ids"]

    def attempt(per_sample):
        trial = dict(batch, input_ids=torch.cat([torch.full((ids.shape[0], per_sample), token), ids], 1))
        try:
            with torch.no_grad():
                model(**trial)
            return trial, None
        except Exception as exc:
            return None, _MISMATCH.search(str(exc)) if isinstance(exc, ValueError) else None

    ok, found = attempt(0)
    if ok is not None or found is None:
        return batch
    ok, found = attempt(1)  # one placeholder per sample: T1 = batch size x the unit placeholders are counted in
    if ok is not None or found is None:
        return ok or batch
    tokens, features = int(found.group(1)), int(found.group(2))
    hidden = getattr(text, "hidden_size", None) or 1
    # features may be counted in tokens or in hidden elements, whatever the placeholders are counted in
    for divisor in (tokens, tokens * hidden):
        if divisor and features % divisor == 0:
            ok, _ = attempt(features // divisor)
            if ok is not None:
                return ok
    return batch


def sweep_loss(output, batch):
    """The model's own loss where it computed one, else a fixed random projection of EVERY float output.

    check-model's default falls back to the first float output only; many multimodal models put
    their vision tower's output first (InstructBLIP), or the encoder's before the decoder's
    (transducers), so the rest of the model would get no gradient in either run and never be
    compared.  Same seed, same structure in every run: the projection is identical across runs.
    """
    from hotfix.diagnostics.step import default_loss, float_tensors, model_loss, random_projection

    tensors = []
    for tensor in float_tensors(output):
        if all(tensor is not seen for seen in tensors):  # an output listed twice counts once
            tensors.append(tensor)
    if model_loss(output) is not None or not tensors:
        # the model's own loss (required grad or not), or the checker's "no loss and no float tensor" error
        return default_loss(output, batch)
    return random_projection(tensors)
