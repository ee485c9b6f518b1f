"""Vision-language models that write images into the text as discrete VQ codes (Chameleon, Emu3).

A VQ image tokenizer turns each image into codes, which the model writes into the text as BPE ids
named by ``vocabulary_map`` (None by default: the map comes with a tokenizer), at the places of the
image placeholders.  What the generic builder cannot guess: a small code book and a 2-level VQ
encoder (GroupNorm of 32 groups) for a tiny image, a vocabulary map whose code ids and ``<image>``
id lie inside the shrunk vocabulary, and the number of placeholders (``with_placeholders``).

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

from ._vision_language_common import _ids, _pixels, with_placeholders


# --------------------------------------------------------------------------- VQ image tokenizers (Chameleon)


def _code_letters(code):
    """Chameleon's spelling of a VQ code in its BPE names: each decimal digit as a letter (0 -> A)."""
    return "".join(chr(ord("A") + int(digit)) for digit in str(code))


def _chameleon_config(config):
    """Chameleon turns images into discrete VQ codes, written into the text as BPE ids named
    ``IMGIMG<code in letters A-J>Z`` by ``vocabulary_map`` (None by default: the map comes with a
    tokenizer).  A 16-code book, its codes mapped to ids 100..115, ``<image>`` the last id; a
    2-level VQ encoder (GroupNorm of 32 groups: widths 32, 64) turning 8 px into 4x4 codes."""
    vq = config.vq_config
    vq.embed_dim = 4
    vq.latent_channels = 4
    vq.num_embeddings = 16
    vq.resolution = 8
    vq.base_channels = 32
    vq.channel_multiplier = [1, 2]
    vq.num_res_blocks = 1
    vq.attn_resolutions = []
    last = config.vocab_size - 1
    config.vocabulary_map = {"<image>": last,
                             **{f"IMGIMG{_code_letters(c)}Z": 100 + c for c in range(vq.num_embeddings)}}
    config.image_token_id = last


def _chameleon_batch(model, config, generator):
    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, config.vq_config.resolution)}
    return with_placeholders(model, config, batch, token=config.image_token_id, key="image_token_id")


def _emu3_config(config):
    """Emu3: like Chameleon, images become VQ codes written as BPE ids; the map names them
    ``<|visual token NNNNNN|>``, ends each code row with ``<|extra_200|>`` and marks placeholders
    ``<image>`` (None by default).  A 16-code book at ids 100..115; a 2-level encoder (GroupNorm of 32
    groups: widths 32, 64) turning 8 px into 4x4 codes (4 rows of 4 codes + end-of-row each)."""
    vq = config.vq_config
    vq.codebook_size = 16
    vq.embed_dim = 4
    vq.latent_channels = 4
    vq.base_channels = 32
    vq.channel_multiplier = [1, 2]
    vq.num_res_blocks = 1
    vq.attn_resolutions = []
    vq.hidden_size = vq.base_channels * vq.channel_multiplier[-1]  # the mid-block attention's width
    vq.num_attention_heads = 1
    vocab = config.text_config.vocab_size
    config.vocabulary_map = {"<image>": vocab - 1, "<|extra_200|>": vocab - 2,
                             **{f"<|visual token {c:06d}|>": 100 + c for c in range(vq.codebook_size)}}
    config.image_token_id = vocab - 1


def _emu3_batch(model, config, generator):
    import torch

    batch = {"input_ids": _ids(config, generator), "pixel_values": _pixels(generator, 8),
             "image_sizes": torch.tensor([[8, 8]] * 2)}
    return with_placeholders(model, config, batch, token=config.image_token_id, key="image_token_id")


CONFIGS = {
    "chameleon": _chameleon_config,
    "emu3": _emu3_config,
}

INPUTS = {
    "chameleon": _chameleon_batch,
    "emu3": _emu3_batch,
}
