"""Helpers shared by the patch-grid GLM family (``vision_grid_glm``) and its neighbours with other image
layouts (``vision_minicpm_navit``, ``vision_deepseek_ocr``, ``vision_granite_anyres``): the multimodal
token ids (found on a config, moved into the shrunk vocabulary, avoided in random text).  No tables."""

from __future__ import annotations

# ---------------------------------------------------------------- config helpers

_TOKEN_SUFFIXES = ("_token_id", "_token_index")
# ids the shrink already keeps in range and that text may legitimately contain
_PLAIN_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                 "cls_token_id", "mask_token_id", "unk_token_id")


def _text(config):
    return getattr(config, "text_config", None) or config


def special_ids(config):
    """{name: id} of the multimodal token ids of a config and its text config."""
    found = {}
    for owner in (config, getattr(config, "text_config", None)):
        if owner is None:
            continue
        for key, value in vars(owner).items():
            if key.endswith(_TOKEN_SUFFIXES) and key not in _PLAIN_TOKENS and isinstance(value, int) \
                    and not isinstance(value, bool):
                found.setdefault(key, value)
    return found


def fix_token_ids(config):
    """Move the multimodal token ids into the shrunk vocabulary (its top end, one id each)."""
    vocab = _text(config).vocab_size
    names = sorted(special_ids(config))
    for i, key in enumerate(names):
        for owner in (config, getattr(config, "text_config", None)):
            if owner is not None and isinstance(getattr(owner, key, None), int):
                setattr(owner, key, vocab - 1 - i)


# ---------------------------------------------------------------- input helpers

def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def text_ids(config, generator, length: int = 8, batch: int = 2):
    """Random text ids that avoid every multimodal token id."""
    import torch

    vocab = _text(config).vocab_size
    avoid = set(special_ids(config).values())
    ids = torch.randint(3, min(vocab, 100), (batch, length), generator=generator)
    safe = next(i for i in range(3, vocab) if i not in avoid)
    for tid in avoid:
        ids[ids == tid] = safe
    return ids
