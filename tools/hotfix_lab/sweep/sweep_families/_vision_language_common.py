"""Shared helpers of the vision-language modules (``vision_language_*``): text ids, images, placeholders.

Most vision-language models replace ``image_token_id`` tokens of ``input_ids`` by the vision tower's
features and refuse a batch whose count differs, so the text must hold exactly as many placeholders
as the (tiny) tower makes features: :func:`with_placeholders` finds that count by trying counts
against the model's own mismatch check.  This module defines no tables.
"""

from __future__ import annotations

from hotfix_lab.sweep.sweep_inputs import image_token_key  # tools/ is on sys.path wherever sweep_families is


# --------------------------------------------------------------------------- helpers


def _ids(config, generator, length=8, batch=2, low=3):
    """Random text token ids below the text vocabulary (ids 0..2 are left for special tokens)."""
    import torch

    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or 100
    return torch.randint(low, min(vocab, 100), (batch, length), generator=generator)


def _pixels(generator, size=32, channels=3, batch=2):
    import torch

    return torch.randn(batch, channels, size, size, generator=generator)


def _image_size(config, default=32):
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None) or default
    return size[0] if isinstance(size, (list, tuple)) else size


def _set_token(model, config, token, key=None):
    """Point the image placeholder id at ``token`` wherever the model may read it."""
    key = key or image_token_key(config) or "image_token_id"
    for owner in (config, getattr(config, "text_config", None), getattr(model, "config", None),
                  getattr(getattr(model, "model", None), "config", None)):
        if owner is not None and hasattr(owner, key):
            setattr(owner, key, token)
    return token


def _last_token(config):
    text = getattr(config, "text_config", None) or config
    return (getattr(text, "vocab_size", None) or getattr(config, "vocab_size")) - 1


def with_placeholders(model, config, batch, token=None, key=None, counts=range(1, 65), prefix="input_ids",
                      token_types=None):
    """``batch`` with the number of image placeholders per sample that the model accepts.

    The count depends on the tower, the projector's merging / pooling, tiles and newline tokens,
    and differs between releases; rather than one formula per release, the smallest count the model
    accepts is found by no-grad forwards (tiny models: milliseconds each).  Placeholders are
    prepended to the text; the model's own mismatch error ends each try.  An error that is not
    about placeholders is raised at once (it is the real failure).  ``token_types``: the name of an input
    that marks the placeholders with 1, the rest 0 (5.x M-RoPE models lay out positions from it).
    """
    import torch

    token = _set_token(model, config, _last_token(config) if token is None else token, key)
    ids = batch[prefix]
    last = None
    for n in counts:
        trial = dict(batch)
        trial[prefix] = torch.cat([torch.full((ids.shape[0], n), token, dtype=ids.dtype), ids], 1)
        if "attention_mask" in batch:
            trial["attention_mask"] = torch.ones_like(trial[prefix])
        if token_types is not None:
            trial[token_types] = (trial[prefix] == token).int()
        try:
            with torch.no_grad():
                model(**trial)
            return trial
        except Exception as exc:
            text = str(exc).lower()
            if not ("token" in text or "feature" in text or "placeholder" in text):
                raise
            last = exc
    raise last
