"""dots3 Note (5.x): an MLA mixture-of-experts text model with a Qwen-VL-style patch-grid vision tower
and an audio tower; the text model alone is ``dots3_note_text``.

Both the text model and the vision tower are heterogeneous 5.x configs: ``per_layer_config`` holds
overrides keyed by the default depth's layer indices (sliding-window attention layers with their own
MLA head layout; vision MoE layers with their own expert counts), and ``layer_types`` /
``mlp_layer_types`` are lists for the default depth.  What the generic builder misses:

* the rotary width of each attention kind is ``head_dim x partial_rotary_factor``, the factor having
  been computed from the default sizes (64 / 256); it must equal the shrunk ``qk_rope_head_dim``;
* cut to two layers the lists keep two indexed-attention, dense layers: the sliding layer, the MoE
  MLP and the per-layer overrides would never run, so they are rebuilt for a 2-layer stack;
* the vision adapter's widths (``adapter_in_dim`` = tower width, ``adapter_out_dim`` = text width)
  and the audio adapter's output width keep their defaults; the image / video / audio ids lie far
  outside the shrunk vocabulary;
* the vision tower takes flat patches plus ``image_grid_thw`` (the shared Qwen-VL patch maker), the
  text one placeholder per merged patch.
"""

from __future__ import annotations

from ._vision_grid_qwen_common import _BATCH, _RESERVED, _int, _patches


def _fix_text(text):
    """A 2-layer stack with one indexed-attention (DSA) and one sliding-window layer, a dense and a
    sparse MLP, the sliding layer with its own (smaller) MLA layout as in the published config."""
    text.per_layer_config = None  # drop the default-depth overrides before the lists are rebuilt
    text.num_hidden_layers = 2
    text.layer_types = ["indexed_attention", "sliding_attention"]
    text.mlp_layer_types = ["dense", "sparse"]
    text.sliding_window = 4  # shorter than the batch, so the window really masks
    for key, small in (("index_head_dim", 16), ("index_n_heads", 2), ("index_topk", 4)):
        if _int(text, key):
            setattr(text, key, small)
    # every attention kind rotates qk_rope_head_dim channels of a head_dim-wide head
    text.head_dim = text.qk_nope_head_dim + text.qk_rope_head_dim
    for params in text.rope_parameters.values():
        params["partial_rotary_factor"] = text.qk_rope_head_dim / text.head_dim
    text.per_layer_config = {1: {"num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 8}}


def _fix_vision(vision, text_hidden):
    """Two blocks, the second a 2-expert MoE (its expert count a per-layer override); adapter widths
    follow the shrunk tower and text model."""
    vision.per_layer_config = None
    vision.num_hidden_layers = 2
    vision.mlp_layer_types = ["dense", "sparse"]
    vision.num_local_experts, vision.num_experts_per_tok = 2, 1
    vision.per_layer_config = {1: {"num_local_experts": 2}}
    vision.adapter_in_dim = vision.hidden_size
    vision.adapter_merge_size = vision.spatial_merge_size
    vision.adapter_out_dim = text_hidden


def _fix_note(config):
    text = config.text_config
    _fix_text(text)
    _fix_vision(config.vision_config, text.hidden_size)
    audio = config.audio_config
    if _int(audio, "adapter_out_dim"):
        audio.adapter_out_dim = text.hidden_size
    # the special ids go to the top of the shrunk vocabulary (text tokens are drawn below them)
    for offset, key in enumerate(("image_token_id", "video_token_id", "audio_token_id")):
        setattr(config, key, text.vocab_size - 1 - offset)


def _note_batch(model, config, generator):
    """One image per sample: its flat patches and (t, h, w) grid, and text holding one image
    placeholder per merged patch between ordinary tokens."""
    import torch

    pixels, grid_thw, per_image = _patches(config.vision_config, generator)
    vocab = config.text_config.vocab_size
    rows = []
    for _ in range(_BATCH):
        head = torch.randint(3, vocab - _RESERVED, (3,), generator=generator).tolist()
        tail = torch.randint(3, vocab - _RESERVED, (3,), generator=generator).tolist()
        rows.append(head + [config.image_token_id] * per_image + tail)
    return {"input_ids": torch.tensor(rows), "pixel_values": pixels, "image_grid_thw": grid_thw}


CONFIGS = {
    "dots3_note": _fix_note,
    "dots3_note_text": _fix_text,
}

INPUTS = {
    "dots3_note": _note_batch,
}
