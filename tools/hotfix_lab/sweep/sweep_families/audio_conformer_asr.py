"""Conformer / FastConformer speech encoders and their CTC, RNN-T / TDT and encoder-decoder ASR heads
(Parakeet, LASR, Nemotron ASR / diarization, Canary, Cohere ASR, Granite Speech 5, wav2vec2-BERT),
and the Gemma 3n / Gemma 4 audio conformers.

What the generic builder misses for them: the feature width of ``input_features`` must be the
config's own mel-bin count (``num_mel_bins`` / ``feature_size`` / ``input_feat_size``), laid out
(batch, time, mels); conv subsampling stacks need enough frames to leave at least one after every
stride; many forwards also need a feature mask; transducers need blank-prefixed decoder ids and
encoder-decoders decoder ids.  Default subsampling widths (256 channels) are shrunk so a probe stays fast.
Shared helpers are in ``_audio_common``.
"""

from __future__ import annotations

from ._audio_common import _audio, _encoder_features, _features, _ids, _subconfigs, _takes


# size fields the generic shrink does not know, with the small value they get (kept if already smaller)
_EXTRA_SMALL = {
    "subsampling_conv_channels": 16,  # conv subsampling front-ends (256 by default)
    "decoder_hidden_size": 32,  # RNN-T prediction network / joint width (640)
    "prompt_intermediate_size": 32,
    "num_prompts": 8,
}


def _shrink_audio(config):
    """Shrink the audio-specific widths of every sub-config; token ids outside the shrunk vocab come back inside.

    Transducers keep their blank as the last vocab id (8192 of 8193 by default): after the vocab
    shrinks to 128 the blank must move to 127, or the prediction network's embedding overflows.
    """
    for sub in _subconfigs(config):
        for key, small in _EXTRA_SMALL.items():
            value = getattr(sub, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(sub, key, min(value, small))
        vocab = getattr(sub, "vocab_size", None)
        if isinstance(vocab, int) and isinstance(getattr(sub, "blank_token_id", None), int):
            sub.blank_token_id = min(sub.blank_token_id, vocab - 1)
        # a head that reads the audio tower states declares their width separately (diarization)
        head, tower = getattr(sub, "head_config", None), getattr(sub, "audio_config", None)
        if hasattr(head, "audio_hidden_size") and hasattr(tower, "hidden_size"):
            head.audio_hidden_size = tower.hidden_size
        # the language prompt is a one-hot over num_prompts, which just shrank
        prompts = getattr(sub, "num_prompts", None)
        if isinstance(prompts, int) and isinstance(getattr(sub, "default_prompt_id", None), int):
            sub.default_prompt_id = min(sub.default_prompt_id, prompts - 1)


def _transducer(frames=64, labels=False):
    """INPUTS entry for an RNN-T / TDT model: features, mask and blank-prefixed decoder ids (+ labels).

    The joint logits are (batch, frames, len(decoder_input_ids), vocab) and depend on encoder,
    prediction network and joint, so they serve as the output without labels.  The transducer loss
    wants one decoder step more than the labels (the blank start) and labels free of the blank id;
    it is asked for only where it runs here (RNN-T's loss needs torchaudio, TDT's is plain torch).
    """

    def make(model, config, generator):
        import torch

        blank = config.blank_token_id
        tokens = _ids(min(config.vocab_size, blank), generator, length=4, low=1)
        batch = {
            "input_features": _features(config, generator, frames),
            "attention_mask": torch.ones(2, frames, dtype=torch.long),
            "decoder_input_ids": torch.cat([torch.full((2, 1), blank), tokens], 1),
        }
        if labels:
            batch["labels"] = tokens
        return batch

    return make


def _speech_seq2seq(frames=64, time_first=True):
    """INPUTS entry for an attention encoder-decoder ASR model: features + decoder ids, with labels for the loss."""

    def make(model, config, generator):
        import torch

        text = getattr(config, "decoder_config", None) or getattr(config, "text_config", None) or config
        tokens = _ids(text.vocab_size, generator, length=6)
        batch = {
            "input_features": _features(config, generator, frames, time_first),
            "attention_mask": torch.ones(2, frames, dtype=torch.long),
            "decoder_input_ids": tokens,
        }
        if _takes(model, "labels"):  # the ...ForConditionalGeneration head: its own loss
            batch["labels"] = tokens
        return batch

    return make


def _granite_speech5(config):
    """Attention works in blocks of ``context_size`` frames (128), which must fit the shrunk positions."""
    _shrink_audio(config)
    encoder = _audio(config)
    encoder.context_size = min(encoder.context_size, 16, encoder.max_position_embeddings)


def _encoder_states(frames=8):
    """INPUTS entry for a model fed another encoder's states: (batch, frames, hidden_size) and a frame mask."""

    def make(model, config, generator):
        import torch

        return {
            "inputs_embeds": torch.randn(2, frames, config.hidden_size, generator=generator),
            "attention_mask": torch.ones(2, frames, dtype=torch.long),
        }

    return make


def _gemma3n_audio(config):
    """The conformer's sizes have their own names (conf_*, sscp_*), unknown to the generic shrink."""
    config.conf_num_attention_heads, config.conf_num_hidden_layers = 2, 2
    config.input_feat_size = min(config.input_feat_size, 16)
    config.sscp_conv_channel_size = [8, 8]


def _gemma3n_audio_inputs(model, config, generator):
    """(batch, frames, input_feat_size) mels; the mask is True at padding, so all False."""
    import torch

    return {"audio_mel": torch.randn(2, 64, config.input_feat_size, generator=generator),
            "audio_mel_mask": torch.zeros(2, 64, dtype=torch.bool)}


def _gemma4_audio(config):
    """The subsampling stack's first width doubles as the mel count (its projection takes
    channels[0] // 4 x channels[1] inputs after two stride-2 convs over the mel axis)."""
    config.subsampling_conv_channels = [16, 8]
    if isinstance(getattr(config, "output_proj_dims", None), int):
        config.output_proj_dims = min(config.output_proj_dims, 32)


def _gemma4_audio_inputs(model, config, generator):
    import torch

    mels = config.subsampling_conv_channels[0]
    return {"input_features": torch.randn(2, 64, mels, generator=generator),
            "attention_mask": torch.ones(2, 64, dtype=torch.bool)}


def _nemo_speechlm(config):
    """Nemotron 3.5 Transcribe: the audio tower as its own type, and a NemotronH text model whose
    ``layers_block_type`` (52 layers: its depth, ``num_hidden_layers`` only reads it) comes from the
    composite's defaults: one layer of each kind (Mamba-2 mixer, MoE, attention) with small mixer sizes
    (left at 52 layers of 128 x 64 heads, one step grows past 1 GiB).  The audio placeholder id
    (131072) is moved inside the shrunk vocabulary."""
    _shrink_audio(config)
    text = config.text_config
    text.layers_block_type = ["linear_attention", "moe", "full_attention"]
    for key, value in (("mamba_num_heads", 4), ("mamba_head_dim", 16), ("ssm_state_size", 16), ("n_groups", 1),
                       ("chunk_size", 4), ("n_routed_experts", 4), ("num_experts_per_tok", 2),
                       ("moe_intermediate_size", 32), ("moe_shared_expert_intermediate_size", 32)):
        if hasattr(text, key):
            setattr(text, key, value)
    config.audio_token_id = text.vocab_size - 1


def _nemo_speechlm_inputs(model, config, generator):
    """Audio features for the tower and text with as many audio placeholders as it makes embeddings."""
    from ._vision_language_common import with_placeholders

    features = _encoder_features(mask=True, mask_name="input_features_mask")(model, config.audio_config, generator)
    batch = dict(features, input_ids=_ids(config.text_config.vocab_size - 1, generator, length=8))
    return with_placeholders(model, config, batch, token=config.audio_token_id, key="audio_token_id")


CONFIGS = {
    # conformer / FastConformer speech encoders and their CTC, transducer and seq2seq heads
    "nemo_speechlm": _nemo_speechlm,
    "parakeet_encoder": _shrink_audio,
    "parakeet_ctc": _shrink_audio,
    "parakeet_rnnt": _shrink_audio,
    "parakeet_tdt": _shrink_audio,
    "lasr_encoder": _shrink_audio,
    "lasr_ctc": _shrink_audio,
    "nemotron3_5_asr": _shrink_audio,
    "nemotron_asr_streaming": _shrink_audio,
    "nemotron_asr_streaming_encoder": _shrink_audio,
    "nemotron3_diarization": _shrink_audio,
    "nemotron3_5_transcribe_audio": _shrink_audio,
    "canary": _shrink_audio,
    "cohere_asr": _shrink_audio,
    "granite_speech5_encoder": _granite_speech5,
    "granite_speech5_ctc": _granite_speech5,
    "gemma3n_audio": _gemma3n_audio,
    "gemma4_audio": _gemma4_audio,
}


INPUTS = {
    "nemo_speechlm": _nemo_speechlm_inputs,
    # conformer / FastConformer speech encoders: (batch, frames, num_mel_bins)
    "parakeet_encoder": _encoder_features(),
    "parakeet_ctc": _encoder_features(),
    "lasr_encoder": _encoder_features(),
    "lasr_ctc": _encoder_features(),
    "nemotron_asr_streaming_encoder": _encoder_features(),
    "nemotron3_diarization": _encoder_features(mask=True),
    "nemotron3_diarization_audio": _encoder_features(mask=True),
    "nemotron3_5_transcribe_asr_audio": _encoder_features(mask=True),
    "nemotron3_5_transcribe_audio": _encoder_features(mask=True, mask_name="input_features_mask"),
    "nemotron3_5_transcribe_word_timestamp": _encoder_states(),
    "parakeet_rnnt": _transducer(),
    "parakeet_tdt": _transducer(labels=True),
    "nemotron3_5_asr": _transducer(),
    "nemotron_asr_streaming": _transducer(),
    "canary": _speech_seq2seq(),
    "cohere_asr": _speech_seq2seq(),
    # the extractor appends deltas (x2) and stacks frame pairs (x2): rows are 4 x num_mel_bins wide
    "granite_speech5_encoder": _encoder_features(mask=True, stack=4),
    "granite_speech5_ctc": _encoder_features(mask=True, stack=4),
    # the extractor stacks two 80-bin frames: rows are feature_projection_input_dim (160) wide
    "wav2vec2-bert": _encoder_features(32, True, width="feature_projection_input_dim"),
    "gemma3n_audio": _gemma3n_audio_inputs,
    "gemma4_audio": _gemma4_audio_inputs,
}
