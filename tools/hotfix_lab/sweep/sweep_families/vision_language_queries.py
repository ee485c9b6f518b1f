"""Vision-language models that feed the text a fixed number of learned queries (Q-Former, Kosmos-2).

BLIP-2, InstructBLIP (-Video) and the Q-Former alone pool the vision tower's features into
``num_query_tokens`` learned queries; Kosmos-2 splices ``latent_query_num`` image embeddings into
the text where ``image_embeds_position_mask`` is 1.  What the generic builder cannot guess:

* few queries (32 / 64 by default: each becomes one image placeholder in the text), and the
  placeholder id inside the text vocabulary (``with_placeholders`` tries the count the config
  implies, then none, for releases that prepend the queries);
* widths that must agree (the Q-Former cross-attends to the vision width; OPT's embedding width is
  the text width the queries are projected to);
* the Q-Former's own instruction ids (InstructBLIP) and video frames (InstructBLIP-Video).

The facts come from transformers' own tests (each model's ``ModelTester``); the code is ours.
"""

from __future__ import annotations

from ._vision_language_common import _ids, _image_size, _pixels, with_placeholders


# --------------------------------------------------------------------------- Q-Former (BLIP-2 / InstructBLIP)


def _qformer_config(config):
    # Fewer learned queries (32 by default): each becomes one image placeholder in the text.
    config.num_query_tokens = 4
    # OPT (the default language model) embeds tokens at word_embed_proj_dim (512) and projects in;
    # the queries are projected to hidden_size and scattered into those embeddings: same width.
    text = getattr(config, "text_config", None)
    if text is not None and getattr(text, "word_embed_proj_dim", None):
        text.word_embed_proj_dim = text.hidden_size
    qformer = getattr(config, "qformer_config", None)
    if qformer is not None:
        # the Q-Former cross-attends to the vision tower's hidden states
        qformer.encoder_hidden_size = config.vision_config.hidden_size


def _qformer_batch(model, config, generator):
    """BLIP-2-like: the text holds one placeholder per query token; InstructBLIP's Q-Former also
    reads the instruction (its own token ids)."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    video = hasattr(config, "video_token_index")
    size = _image_size(config)
    # InstructBLIP-Video encodes each frame: pixel_values (batch, frames, C, H, W), queries per frame
    pixels = torch.randn(2, 2, 3, size, size, generator=generator) if video else _pixels(generator, size)
    batch = {"input_ids": _ids(config, generator), "pixel_values": pixels}
    if "qformer_input_ids" in params:
        qvocab = getattr(config.qformer_config, "vocab_size", 100)
        batch["qformer_input_ids"] = torch.randint(3, min(qvocab, 100), (2, 6), generator=generator)
        batch["qformer_attention_mask"] = torch.ones(2, 6, dtype=torch.long)
    if "decoder_input_ids" in params and getattr(config, "use_decoder_only_language_model", True) is False:
        batch["decoder_input_ids"] = _ids(config, generator, length=4)
    # The placeholder id must lie inside the text vocabulary.  Releases that scatter the queries
    # into placeholders need num_query_tokens of them per sample (per frame for video); releases
    # that prepend the queries take none (with placeholders the text would be longer, not wrong).
    if video:
        key = "video_token_index"
    else:
        key = "image_token_index" if hasattr(config, "image_token_index") else "image_token_id"
    per_sample = config.num_query_tokens * (2 if video else 1)
    return with_placeholders(model, config, batch, key=key, counts=[per_sample, 0])


def _qformer_alone_batch(model, config, generator):
    """The Q-Former alone: learned-query embeddings cross-attending to (random) image features."""
    import torch

    hidden = config.hidden_size
    width = getattr(config, "encoder_hidden_size", None) or hidden
    return {"query_embeds": torch.randn(2, 4, hidden, generator=generator),
            "encoder_hidden_states": torch.randn(2, 5, width, generator=generator)}


# --------------------------------------------------------------------------- Kosmos-2


def _kosmos2_config(config):
    config.latent_query_num = 4  # image embeddings spliced into the text (64 by default)


def _kosmos2_batch(model, config, generator):
    """Kosmos-2 splices its latent queries into the text where image_embeds_position_mask is 1."""
    import torch

    n = config.latent_query_num
    ids = _ids(config, generator, length=n + 6)
    mask = torch.zeros_like(ids)
    mask[:, 1:1 + n] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "image_embeds_position_mask": mask,
            "pixel_values": _pixels(generator, _image_size(config))}


CONFIGS = {
    "blip-2": _qformer_config,
    "instructblip": _qformer_config,
    "instructblipvideo": _qformer_config,
    "kosmos-2": _kosmos2_config,
}

INPUTS = {
    "blip-2": _qformer_batch,
    "instructblip": _qformer_batch,
    "instructblipvideo": _qformer_batch,
    "blip_2_qformer": _qformer_alone_batch,
    "kosmos-2": _kosmos2_batch,
}
