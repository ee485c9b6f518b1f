"""Whisper-style and other spectrogram encoders: Whisper-like towers (Audio Flamingo 3, GLM-ASR,
Voxtral Realtime, Qwen3-ASR), AST, Fun-ASR-Nano, M-CTC-T, SpeechT5, Moonshine Streaming.

What the generic builder misses for them: Whisper-style encoders read (batch, mels, frames)
features whose frame count their learnt position table fixes (twice ``max_source_positions``
after the stride-2 conv); AST's position table is sized from its patch grid; stacked-frame and
multi-channel extractors widen the rows; some models take hidden states or a raw waveform instead
of features.  Shared helpers are in ``_audio_common``.
"""

from __future__ import annotations

from ._audio_common import _audio, _encoder_features, _features, _ids, _no_dropout


def _ast(config):
    """AST cuts the (time, mel) spectrogram into overlapping patches; its position table is sized from
    max_length / num_mel_bins / strides, so a small grid: 24 frames x 16 mels, 2x2 patches at stride 2."""
    config.num_mel_bins, config.max_length = 16, 24
    config.patch_size, config.frequency_stride, config.time_stride = 2, 2, 2


def _ast_inputs(model, config, generator):
    import torch

    return {"input_values": torch.randn(2, config.max_length, config.num_mel_bins, generator=generator)}


def _whisper_like(mask_name=None, frames=None):
    """INPUTS entry for a Whisper-style encoder: (batch, mels, frames) features, where its learnt
    position table (max_source_positions) must equal the frames left after the stride-2 conv."""

    def make(model, config, generator):
        import torch

        audio = _audio(config)
        length = frames or 2 * getattr(audio, "max_source_positions", 16)
        batch = {"input_features": _features(config, generator, length, time_first=False)}
        if mask_name:
            batch[mask_name] = torch.ones(2, length, dtype=torch.long)
        return batch

    return make


def _qwen3_asr_encoder(config):
    """Only the conv stack's width and the output projection shrink: the encoder's length formula
    hard-codes 13 frames per 2 x n_window (100) chunk, so n_window keeps its default."""
    config.downsample_hidden_size = min(config.downsample_hidden_size, 16)
    config.output_dim = min(config.output_dim, 32)


def _fun_asr_nano_encoder(config):
    """The last num_timestamp_prediction_layers layers (20 of 70) form the timestamp branch; with 2 layers
    left, one transcription layer and one timestamp layer."""
    config.num_timestamp_prediction_layers = min(config.num_timestamp_prediction_layers, config.num_hidden_layers - 1)


def _speecht5(config):
    _no_dropout(config)  # encoder_layerdrop / decoder_layerdrop (0.1)


def _speecht5_inputs(model, config, generator):
    """The bare SpeechT5Model has no pre-nets: encoder and decoder both take hidden states
    (batch, length, hidden_size), not a waveform."""
    import torch

    hidden = config.hidden_size
    return {
        "input_values": torch.randn(2, 10, hidden, generator=generator),
        "attention_mask": torch.ones(2, 10, dtype=torch.long),
        "decoder_input_values": torch.randn(2, 6, hidden, generator=generator),
        "decoder_attention_mask": torch.ones(2, 6, dtype=torch.long),
    }


def _mctct(config):
    """attention_head_dim (384) is not among the generic size fields; heads x head_dim = hidden."""
    config.attention_head_dim = config.hidden_size // config.num_attention_heads


def _moonshine_streaming(config):
    """The decoder's attention reads num_key_value_heads, a field the decoder config does not declare
    (the encoder config does): plain multi-head attention, as many key/value heads as heads."""
    if not isinstance(getattr(config, "num_key_value_heads", None), int):
        config.num_key_value_heads = config.num_attention_heads


def _moonshine_streaming_inputs(model, config, generator):
    """A raw 16 kHz waveform (batch, samples), 20 frames of 5 ms, and decoder ids."""
    import torch

    samples = 20 * int(config.encoder_config.sample_rate * config.encoder_config.frame_ms / 1000)
    return {"input_values": torch.randn(2, samples, generator=generator),
            "attention_mask": torch.ones(2, samples, dtype=torch.long),
            "decoder_input_ids": _ids(config.vocab_size, generator)}


def _voxtral_realtime_inputs(model, config, generator):
    """Realtime Voxtral adds one audio embedding to every text token: the encoder halves the mel
    frames, downsample_factor more frames are merged per embedding, so tokens = frames / (2 x factor)."""
    import torch

    tokens = 8
    frames = tokens * 2 * config.downsample_factor
    return {"input_ids": _ids(config.text_config.vocab_size, generator, length=tokens),
            "input_features": _features(config, generator, frames, time_first=False),
            "attention_mask": torch.ones(2, tokens, dtype=torch.long)}


CONFIGS = {
    # Whisper-style and other spectrogram encoders
    "audio-spectrogram-transformer": _ast,
    "qwen3_asr_encoder": _qwen3_asr_encoder,
    "fun_asr_nano_encoder": _fun_asr_nano_encoder,
    "mctct": _mctct,
    "speecht5": _speecht5,
    "moonshine_streaming": _moonshine_streaming,
}


INPUTS = {
    # low-frame-rate features: num_stacked_frames mel frames concatenated per row; positions count
    # from one, so fewer frames than max_position_embeddings
    "fun_asr_nano_encoder": _encoder_features(32, True, "num_stacked_frames", mask_name="input_features_mask"),
    # rows are input_feat_per_channel x input_channels wide
    "mctct": _encoder_features(32, True, stack="input_channels"),
    # Whisper-style encoders: (batch, num_mel_bins, frames)
    "audioflamingo3_encoder": _whisper_like("input_features_mask"),
    "glmasr_encoder": _whisper_like(),
    "voxtral_realtime_encoder": _whisper_like(),
    "qwen3_asr_encoder": _whisper_like("input_features_mask", frames=200),  # two 100-frame chunks
    "voxtral_realtime": _voxtral_realtime_inputs,
    "audio-spectrogram-transformer": _ast_inputs,
    "speecht5": _speecht5_inputs,
    "moonshine_streaming": _moonshine_streaming_inputs,
}


UNBUILDABLE = {
    "voxtral_realtime_text": "MODEL_MAPPING names VoxtralRealtimeTextModel, which transformers does not export "
                             "(absent from voxtral_realtime's __all__), so the class cannot be looked up",
}
