"""Text encoders and sequence models with their own inputs: ESM, LiLT, X-MOD, QDQBert; time-series
transformers (Autoformer, Informer, TimeSeriesTransformer) and the Trajectory Transformer.

* time-series transformers need ``prediction_length`` / ``context_length`` and past/future values
  with their time features; trajectory_transformer takes whole discretised transitions; xmod needs a
  default language adapter.
* a few defaults only checkpoints fill (ESM's vocabulary) and widths that must divide (LiLT's layout
  stream), each said where it is done.
Shared helpers are in ``_text_common``.
"""

from __future__ import annotations

from ._text_common import _set


def _fix_esm(config):
    # vocab_size defaults to None (the protein tokenizer's 33 symbols come with checkpoints)
    config.vocab_size = 33
    _set(config, pad_token_id=1, mask_token_id=32)


def _fix_time_series(config):
    # prediction_length has no default (checkpoints set it); context_length and feature_size are derived
    # from it and from the lags / feature counts once in __init__, so set them all together
    _set(config, prediction_length=4, context_length=8, lags_sequence=[1, 2, 3], num_time_features=2,
         num_static_categorical_features=1, cardinality=[5], embedding_dimension=[2], num_static_real_features=1,
         encoder_layerdrop=0.0, decoder_layerdrop=0.0,  # layerdrop skips layers at random in training
         label_length=4, moving_average=3,  # autoformer: decoder seeds from the context's last label_length
         sampling_factor=2)  # informer: ProbSparse samples factor x log(length) queries
    config.feature_size = config.input_size * len(config.lags_sequence) + config._number_of_features


def _time_series_batch(model, config, g):
    """Past window (context + the largest lag) and future window, with time features and static features."""
    import torch

    past = config.context_length + max(config.lags_sequence)
    future = config.prediction_length
    nt = config.num_time_features
    return {
        "past_values": torch.randn(2, past, generator=g),
        "past_time_features": torch.randn(2, past, nt, generator=g),
        "past_observed_mask": torch.ones(2, past),
        "static_categorical_features": torch.randint(0, config.cardinality[0], (2, 1), generator=g),
        "static_real_features": torch.randn(2, 1, generator=g),
        "future_values": torch.randn(2, future, generator=g),
        "future_time_features": torch.randn(2, future, nt, generator=g),
    }


def _fix_trajectory_transformer(config):
    # a transition is observation + action + reward + value tokens; the context holds two transitions
    config.observation_dim, config.action_dim, config.vocab_size = 3, 2, 16
    config.transition_dim = config.observation_dim + config.action_dim + 2
    config.block_size = 2 * config.transition_dim


def _trajectory_batch(model, config, g):
    """Discretised trajectories (one token per dimension) and next-token targets; the loss weighting
    expects whole transitions minus the first token (n_states x transition_dim - 1 tokens)."""
    import torch

    length = 2 * config.transition_dim - 1
    return {
        "trajectories": torch.randint(0, config.vocab_size, (2, length), generator=g),
        "targets": torch.randint(0, config.vocab_size, (2, length), generator=g),
        "attention_mask": torch.ones(2, length),
    }


def _fix_lilt(config):
    # the layout stream embeds each of the 6 box coordinates/sizes in hidden/6 and projects the concat
    # (6 x (hidden // 6)) back from hidden: hidden must divide by 6 (and by channel_shrink_ratio)
    config.hidden_size = 48


def _fix_xmod(config):
    config.default_language = config.languages[0]  # the adapters refuse a batch without a language


CONFIGS = {
    "lilt": _fix_lilt,
    "xmod": _fix_xmod,
    "trajectory_transformer": _fix_trajectory_transformer,
    "autoformer": _fix_time_series,
    "informer": _fix_time_series,
    "time_series_transformer": _fix_time_series,
    "esm": _fix_esm,
}


INPUTS = {
    "trajectory_transformer": _trajectory_batch,
    "autoformer": _time_series_batch,
    "informer": _time_series_batch,
    "time_series_transformer": _time_series_batch,
}


UNBUILDABLE = {
    "qdqbert": "QDQBert's quantized layers need NVIDIA pytorch-quantization (from pypi.ngc.nvidia.com; PyPI's "
               "pytorch-quantization 2.2.1 is a placeholder that only warns), not installed here",
}
