"""The tiny random-weight Whisper ``hotfix doctor`` reproduces the bug on: built on CPU in milliseconds, no download.

Each builder returns ``(model, batch)``, the model in training mode and seeded.
Imports torch and transformers, never hotfix: the tests' model builders
(tools/hotfix_lab/infra/tiny_models.py) reuse these by path in interpreters that must start
unpatched.
"""

from __future__ import annotations

import torch


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def whisper(seed=0, frozen_decoder_embeddings=False):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(vocab_size=100, num_mel_bins=8, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2, d_model=16,
                        encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=10,
                        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).train()
    if frozen_decoder_embeddings:
        model.model.decoder.embed_tokens.requires_grad_(False)
        model.model.decoder.embed_positions.requires_grad_(False)
    g = _gen(seed + 1)
    return model, {"input_features": torch.randn(2, 8, 20, generator=g),
                   "labels": torch.randint(3, 100, (2, 5), generator=g)}


def whisper_frozen(seed=0):
    return whisper(seed, frozen_decoder_embeddings=True)


BUILDERS = {
    "whisper": whisper,
    "whisper-frozen-decoder-embeddings": whisper_frozen,
}
