"""A tiny model written as Hub modeling files are (``trust_remote_code``): it checkpoints its own layers.

``checkpoint`` is imported at module level (a name bound at import time, which a replacement of
``torch.utils.checkpoint.checkpoint`` never reaches), and the forward calls it itself, reentrant, once
``gradient_checkpointing_enable()`` has set ``self.gradient_checkpointing``.  Imports torch and transformers,
never hotfix.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, vocab_size=64, hidden_size=16, num_layers=2, **kwargs):
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        super().__init__(**kwargs)


class TinyRemoteBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(self, hidden):
        return hidden + self.down(torch.tanh(self.up(hidden)))


def create_custom_forward(module):
    def custom_forward(*inputs):
        return module(*inputs)

    return custom_forward


class TinyRemoteModel(PreTrainedModel):
    config_class = TinyRemoteConfig
    supports_gradient_checkpointing = True

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyRemoteBlock(config.hidden_size) for _ in range(config.num_layers))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.unused = nn.Linear(config.hidden_size, config.hidden_size)  # why find_unused_parameters is set
        self.gradient_checkpointing = False

    def forward(self, input_ids, labels=None):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden = checkpoint(create_custom_forward(layer), hidden, use_reentrant=True)
            else:
                hidden = layer(hidden)
        logits = self.head(hidden)
        loss = None if labels is None else nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        return CausalLMOutput(loss=loss, logits=logits)
