"""Helpers shared by the audio families (``audio_*`` modules): the audio sub-config, its mel-bin
width, random log-mel features, dropout zeroing, token ids, a forward's parameters, nested sub-configs,
the speech-encoder INPUTS entry and the SEANet-codec shrink.  No tables: the model types are in the
``audio_*`` modules.
"""

from __future__ import annotations

_AUDIO_SUBS = ("encoder_config", "audio_config", "audio_encoder_config", "asr_config", "encoder")


_MEL_KEYS = ("num_mel_bins", "input_feat_size", "feature_size", "n_mels", "input_feat_per_channel")


def _audio(config):
    """The sub-config that describes the audio encoder (the config itself for a bare encoder)."""
    for key in _AUDIO_SUBS:
        sub = getattr(config, key, None)
        if sub is not None and not isinstance(sub, (dict, str)):
            return _audio(sub)
    return config


def _mels(config, default=80):
    """The mel-bin width the model's first layer expects (looked up in the audio sub-config too)."""
    for owner in (config, _audio(config)):
        for key in _MEL_KEYS:
            value = getattr(owner, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return default


def _features(config, generator, frames, time_first=True, batch=2, stack=1, width=None):
    """Random log-mel features, (batch, frames, mels) or (batch, mels, frames).

    ``stack``: how many mel frames the feature extractor concatenates into one input row;
    ``width``: the row width itself, where the config names it (a number or a config field).
    """
    import torch

    if isinstance(width, str):
        width = getattr(_audio(config), width)
    mels = width or _mels(config) * stack
    shape = (batch, frames, mels) if time_first else (batch, mels, frames)
    return torch.randn(*shape, generator=generator)


def _no_dropout(config):
    """Zero the dropout fields the generic shrink misses (``*_layerdrop``, GPT-2-style ``*_pdrop``):
    a layer skipped at random in training mode gets no gradient in one run and some in the other."""
    for sub in _subconfigs(config):
        for key, value in list(vars(sub).items()):
            if isinstance(value, float) and (key.endswith("layerdrop") or key.endswith("pdrop")):
                setattr(sub, key, 0.0)


def _takes(model, name):
    """Whether the model's forward has a parameter ``name``."""
    import inspect

    return name in inspect.signature(model.forward).parameters


def _ids(vocab, generator, length=6, batch=2, low=3):
    import torch

    return torch.randint(low, max(low + 1, min(vocab, 100)), (batch, length), generator=generator)


def _subconfigs(config, depth=0):
    """The config and every nested sub-config (audio / asr / diarization / head ...)."""
    yield config
    if depth < 3:
        for value in list(vars(config).values()):
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                yield from _subconfigs(value, depth + 1)


def _encoder_features(frames=64, mask=False, stack=1, time_first=True, mask_name="attention_mask", width=None):
    """INPUTS entry for a speech encoder / CTC model: features (+ an all-ones frame mask).

    ``stack``: frames stacked per row, a number or the name of the config field that holds it.
    """

    def make(model, config, generator):
        import torch

        rows = getattr(_audio(config), stack) if isinstance(stack, str) else stack
        batch = {"input_features": _features(config, generator, frames, time_first, stack=rows, width=width)}
        if mask:
            batch[mask_name] = torch.ones(2, frames, dtype=torch.long)
        return batch

    return make


def _tiny_codec(config):
    """SEANet-style codecs (Mimi and its kin, also inside CSM / Kyutai): a few filters, two up/down
    sampling stages, small codebooks.  The decoder's grouped upsampling conv has ``upsample_groups``
    groups (512) over ``hidden_size`` channels, so groups must follow the shrunk width."""
    for sub in _subconfigs(config):
        if not isinstance(getattr(sub, "upsample_groups", None), int):
            continue
        sub.upsample_groups = sub.hidden_size
        if isinstance(getattr(sub, "num_filters", None), int):
            sub.num_filters = min(sub.num_filters, 8)
        if isinstance(getattr(sub, "upsampling_ratios", None), list):
            sub.upsampling_ratios = [8, 4]
        for key, small in (("codebook_size", 64), ("codebook_dim", 64), ("vector_quantization_hidden_dimension", 64)):
            if isinstance(getattr(sub, key, None), int):
                setattr(sub, key, min(getattr(sub, key), small))
