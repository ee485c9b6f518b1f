"""Neural audio codecs and audio towers built on them: SEANet-style (Mimi, Pocket TTS tokenizer),
DAC-fronted (PE Audio), X-Codec2 / NeuCodec, Higgs Audio V2 tokenizer.

What the generic builder misses for them: codecs take a mono waveform (batch, 1, samples) whose
length their hop size divides, or continuous latents for a bare decoder; their up/down sampling
stages, filters and codebooks are shrunk so a probe stays fast, and sizes tied to them follow.
Shared helpers are in ``_audio_common``.
"""

from __future__ import annotations

from ._audio_common import _ids, _subconfigs, _takes, _tiny_codec


def _waveform(samples=1920, name="input_values"):
    """INPUTS entry for a codec / raw-audio encoder: a mono waveform (batch, 1, samples)."""

    def make(model, config, generator):
        import torch

        channels = getattr(config, "audio_channels", 1) or 1
        return {name: torch.randn(2, channels, samples, generator=generator)}

    return make


def _latents(frames=4):
    """INPUTS entry for a codec decoder: continuous latents (batch, hidden_size, frames)."""

    def make(model, config, generator):
        import torch

        return {"latents": torch.randn(2, config.hidden_size, frames, generator=generator)}

    return make


def _tiny_dac(config):
    """DAC-based audio towers: two down/up sampling stages (hop 8 instead of 1920), small codebooks."""
    for sub in _subconfigs(config):
        if getattr(sub, "model_type", None) != "dac":
            continue
        sub.downsampling_ratios, sub.upsampling_ratios, sub.hop_length = [2, 4], [4, 2], 8
        sub.decoder_hidden_size = min(sub.decoder_hidden_size, 32)
        sub.n_codebooks, sub.codebook_size, sub.codebook_dim = 2, 64, 8


def _pe_audio_inputs(model, config, generator):
    """A mono waveform (batch, 1, samples) for the DAC-fronted audio tower, + text ids for the CLIP-like pair.

    The pair's similarity is multiplied by a learnt scale that starts at exactly 0 (not exp(0)), so a
    fresh model's loss and logits give both towers zero gradients; the scale is set to 1, as training
    would move it, so the towers' gradients are really compared.
    """
    import torch

    batch = {"input_values": torch.randn(2, 1, 128, generator=generator)}
    scale = getattr(model, "text_audio_logit_scale", None)
    if isinstance(scale, torch.nn.Parameter) and not scale.detach().any():
        with torch.no_grad():
            scale.fill_(1.0)
    if _takes(model, "input_ids"):
        batch["input_ids"] = _ids(config.text_config.vocab_size, generator, length=8)
        batch["attention_mask"] = torch.ones(2, 8, dtype=torch.long)
    if _takes(model, "return_loss"):
        batch["return_loss"] = True
    return batch


def _semantic_codec(config):
    """X-Codec2 / NeuCodec: an acoustic encoder whose width doubles at each of its 5 downsampling
    stages (hop 320) beside a wav2vec2-BERT semantic encoder.  Two stages (hop 8) keep it tiny (the
    ISTFT head's hop and n_fft derive from them); the quantizer reads the concatenated acoustic and
    semantic states, so quantization_dim (2048 = 1024 + 1024) is the sum of both shrunk widths."""
    config.downsampling_ratios = [2, 4]
    config.quantization_dim = config.hidden_size + config.semantic_model_config.hidden_size
    # With 0.02-scale weights the finite scalar quantizer rounds every projected value to level 0,
    # so the decoder (bias-free linears and norms) receives exact zeros and gets zero gradients;
    # 0.1 puts the codes on other levels (0.05 still does not, 0.2 saturates the encoder's tanh).
    config.initializer_range = 0.1


def _semantic_codec_inputs(model, config, generator):
    """Waveform (batch, 1, samples) and the semantic encoder's stacked-mel features
    (batch, frames, feature_projection_input_dim): the two streams are concatenated frame by frame,
    so frames = samples / encoder hop."""
    import math

    import torch

    frames = 16
    hop = math.prod(config.downsampling_ratios)
    width = config.semantic_model_config.feature_projection_input_dim
    return {"input_values": torch.randn(2, 1, frames * hop, generator=generator),
            "input_features": torch.randn(2, frames, width, generator=generator),
            "input_features_mask": torch.ones(2, frames, dtype=torch.long)}


CONFIGS = {
    # codecs and the speech / music generators built on them
    "mimi": _tiny_codec,
    "mimi_encoder": _tiny_codec,
    "mimi_decoder": _tiny_codec,
    "pocket_tts_audio_tokenizer": _tiny_codec,
    "pocket_tts_audio_tokenizer_encoder": _tiny_codec,
    "pocket_tts_audio_tokenizer_decoder": _tiny_codec,
    "pe_audio": _tiny_dac,
    "pe_audio_encoder": _tiny_dac,
    "xcodec2": _semantic_codec,
    "neucodec": _semantic_codec,
}


INPUTS = {
    # codecs and the speech / music generators built on them
    "mimi": _waveform(),
    "mimi_encoder": _waveform(),
    "mimi_decoder": _latents(),
    "pocket_tts_audio_tokenizer": _waveform(),
    "pocket_tts_audio_tokenizer_encoder": _waveform(),
    "pocket_tts_audio_tokenizer_decoder": _latents(),
    "pe_audio": _pe_audio_inputs,
    "pe_audio_encoder": _pe_audio_inputs,
    "xcodec2": _semantic_codec_inputs,
    "neucodec": _semantic_codec_inputs,
}


UNBUILDABLE = {
    "higgs_audio_v2_tokenizer": "HiggsAudioV2TokenizerModel requires torchaudio (module-level import, resamples "
                                "its input); torchaudio is not installed here",
}
