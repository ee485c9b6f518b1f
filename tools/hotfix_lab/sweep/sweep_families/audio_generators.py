"""Speech and music generators over codec tokens or mel spectrograms: CSM, Kyutai STT, Dia, CLVP,
MusicGen (and MusicGen Melody).

What the generic builder misses for them: codebook counts, codebook vocabularies and the special
audio ids must fit the shrunk codec and vocabularies; cross-attention layouts follow the shrunk
text encoder; inputs are codebook frames (batch, frames, codebooks) or codes flattened per codebook,
with text ids or encoder states beside them.  Shared helpers are in ``_audio_common``.
"""

from __future__ import annotations

from ._audio_common import _ids, _no_dropout, _takes, _tiny_codec


def _csm(config):
    """CSM: a text+audio backbone over num_codebooks codebook streams (32) and a depth decoder that
    predicts the other codebooks; both must agree on the codebook count and the backbone width, the
    depth decoder has one position per codebook (+1), and the special ids must lie inside the
    shrunk vocabularies (text ids below text_vocab_size, codebook ids below vocab_size)."""
    _tiny_codec(config)
    depth = config.depth_decoder_config
    config.num_codebooks = depth.num_codebooks = 4
    depth.backbone_hidden_size = config.hidden_size
    depth.max_position_embeddings = depth.num_codebooks + 1
    config.text_vocab_size = 100
    config.audio_token_id, config.audio_eos_token_id = 98, 99
    config.codebook_pad_token_id = config.vocab_size - 1
    config.codebook_eos_token_id = 0


def _csm_inputs(model, config, generator):
    """Codebook frames (batch, frames, num_codebooks), as the model takes while generating; labels
    of the same shape train backbone and depth decoder."""
    import torch

    ids = torch.randint(1, config.vocab_size - 1, (2, 7, config.num_codebooks), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones(2, 7, dtype=torch.long), "labels": ids.clone()}


def _kyutai_stt(config):
    """Kyutai STT embeds one text stream + num_codebooks audio streams in one table of
    vocab + num_codebooks x codebook_vocab_size + 1 rows, the last row being the audio padding id
    (69569 by default): codebook sizes and the special audio ids are set to fit the shrunk sizes."""
    _tiny_codec(config)
    config.num_codebooks = 4
    config.codebook_vocab_size = config.codec_config.codebook_size + 1  # + the audio BOS
    config.audio_bos_token_id = config.codebook_vocab_size - 1
    config.audio_pad_token_id = config.vocab_size + config.num_codebooks * config.codebook_vocab_size
    if isinstance(getattr(config.codec_config, "num_quantizers", None), int):
        config.codec_config.num_quantizers = config.num_codebooks


def _kyutai_stt_inputs(model, config, generator):
    """(batch, frames, 1 + num_codebooks) ids: a text token and one token per codebook per frame."""
    import torch

    text = torch.randint(3, config.vocab_size, (2, 8, 1), generator=generator)
    audio = torch.randint(0, config.codebook_vocab_size - 1, (2, 8, config.num_codebooks), generator=generator)
    return {"input_ids": torch.cat([text, audio], -1), "attention_mask": torch.ones(2, 8, dtype=torch.long)}


def _dia(config):
    """Dia's decoder cross-attends to the text encoder with its own head layout
    (cross_hidden_size 1024 = encoder width, 16 x 128 heads); that layout follows the shrunk encoder.
    Fewer audio channels (9 -> 3), with a delay pattern of the same length."""
    encoder, decoder = config.encoder_config, config.decoder_config
    decoder.cross_hidden_size = encoder.hidden_size
    decoder.cross_num_attention_heads = encoder.num_attention_heads
    decoder.cross_num_key_value_heads = getattr(encoder, "num_key_value_heads", encoder.num_attention_heads)
    decoder.cross_head_dim = encoder.head_dim
    decoder.num_channels = 3
    config.delay_pattern = list(range(decoder.num_channels))


def _dia_inputs(model, config, generator):
    """Text ids for the encoder, audio codes (batch, frames, num_channels) for the decoder."""
    import torch

    decoder = config.decoder_config
    codes = torch.randint(3, decoder.vocab_size, (2, 6, decoder.num_channels), generator=generator)
    batch = {"input_ids": _ids(config.encoder_config.vocab_size, generator, length=8),
             "attention_mask": torch.ones(2, 8, dtype=torch.long), "decoder_input_ids": codes}
    if _takes(model, "labels"):
        batch["labels"] = codes.clone()
    return batch


def _clvp(config):
    """The text / speech encoders rotate max(projection_dim // (2 x heads), 32) = 32 channels of every
    head, so their heads must be at least 32 wide: hidden 64 over 2 heads.  Fewer mel attention
    blocks in the conditioning encoder (6 -> 2).  The speech decoder's output is argmax-ed into speech
    ids, and where a stop token appears the default ``decoder_fixing_codes`` (83, 45, 45, 248) are
    written in: 248 is past the shrunk speech vocabulary (an IndexError whenever an argmax lands on
    the stop token, e.g. once LoRA adapters move the logits), so the codes are kept inside it."""
    for encoder in (config.text_config, config.speech_config):
        encoder.hidden_size, encoder.num_attention_heads = 64, 2
    config.decoder_config.num_mel_attn_blocks = 2
    vocab = config.speech_config.vocab_size
    config.decoder_config.decoder_fixing_codes = [code % vocab for code in config.decoder_config.decoder_fixing_codes]
    _no_dropout(config)  # the decoder's resid_pdrop / embd_pdrop (0.1)


def _clvp_inputs(model, config, generator):
    """Text ids and a (batch, feature_size, frames) mel spectrogram of the reference voice."""
    import torch

    features = torch.randn(2, config.decoder_config.feature_size, 16, generator=generator)
    return {"input_ids": _ids(config.text_config.vocab_size, generator, length=8), "input_features": features,
            "attention_mask": torch.ones(2, 8, dtype=torch.long), "return_loss": True}


def _vits(config):
    """Only the text encoder checkpoints; the rest of VITS (duration predictor, flows, HiFi-GAN vocoder)
    is cost.  Its defaults (192-channel flows, a 512-channel vocoder upsampling 256x over up to
    hundreds of predicted frames, 16 WaveNet layers) saved 0.2-0.6 GB per step and ran into the
    sweep's time guard on a busy 2-core machine: narrower, shallower, upsampling 4x."""
    config.flow_size = config.upsample_initial_channel = config.duration_predictor_filter_channels = 32
    config.upsample_rates, config.upsample_kernel_sizes = [2, 2], [4, 4]
    config.resblock_kernel_sizes, config.resblock_dilation_sizes = [3], [[1, 3]]
    config.prior_encoder_num_flows = config.duration_predictor_num_flows = 2
    config.prior_encoder_num_wavenet_layers = config.posterior_encoder_num_wavenet_layers = 2
    config.depth_separable_num_layers = 2


def _musicgen(config):
    """The model type's class (MusicgenModel) is the bare decoder stack, which reads the decoder's
    fields (dropout, num_codebooks, ...) from the config it gets, while the model type's config class
    is the composite (text encoder + EnCodec + decoder).  The decoder's fields are copied onto the
    composite so it describes the decoder it builds.  (Before 5.x the composite cannot even be built
    from defaults: it raises without the three sub-configs, before this fix runs.)"""
    decoder = config.decoder
    for key, value in decoder.to_dict().items():
        if key not in ("model_type", "architectures", "transformers_version") and not hasattr(config, key):
            setattr(config, key, value)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        setattr(config, key, getattr(decoder, key))


def _musicgen_factory(config_class):
    """Before 5.x the composite config raises unless given all three sub-configs (as dicts with their
    model_type), so it is built from small ones: a T5 text encoder, an EnCodec audio encoder and the
    family's own decoder config (MusicgenDecoderConfig / MusicgenMelodyDecoderConfig, found by name).
    5.x accepts the same dicts.  Sizes are small already; shrink_config shrinks the rest."""
    import transformers

    decoder_class = getattr(transformers, config_class.__name__.replace("Config", "DecoderConfig"))
    text = transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4)
    audio = transformers.EncodecConfig(hidden_size=32, num_filters=4, codebook_size=64, upsampling_ratios=[2, 2])
    decoder = decoder_class(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            ffn_dim=37, num_codebooks=4, audio_channels=1, tie_word_embeddings=False)
    return config_class(text_encoder=text.to_dict(), audio_encoder=audio.to_dict(), decoder=decoder.to_dict())


def _musicgen_inputs(model, config, generator):
    """Decoder codes flattened to (batch x num_codebooks, frames), and text-encoder states to attend to."""
    import torch

    codes = torch.randint(0, config.vocab_size, (2 * config.num_codebooks, 6), generator=generator)
    batch = {"input_ids": codes}
    if _takes(model, "encoder_hidden_states"):
        batch["encoder_hidden_states"] = torch.randn(2, 5, config.hidden_size, generator=generator)
    return batch


CONFIGS = {
    # codecs and the speech / music generators built on them
    "csm": _csm,
    "kyutai_speech_to_text": _kyutai_stt,
    "dia": _dia,
    "clvp": _clvp,
    "vits": _vits,
    "musicgen": _musicgen,
    "musicgen_melody": _musicgen,
}


INPUTS = {
    # codecs and the speech / music generators built on them
    "csm": _csm_inputs,
    "kyutai_speech_to_text": _kyutai_stt_inputs,
    "dia": _dia_inputs,
    "clvp": _clvp_inputs,
    "musicgen": _musicgen_inputs,
    "musicgen_melody": _musicgen_inputs,
}


FACTORIES = {
    # the composite raises without its three sub-configs before 5.x
    "musicgen": _musicgen_factory,
    "musicgen_melody": _musicgen_factory,
}
