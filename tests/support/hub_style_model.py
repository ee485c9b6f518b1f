"""A model file written the way Hub repositories ship modeling code for ``trust_remote_code``, without transformers:
tests/support/torch_only_ddp.py loads it by path (``importlib.util.spec_from_file_location``, as a remote-code
loader does from its cache folder), never as an installed module.

The point of the case: ``checkpoint`` is bound at the top of this file, when the script loads it, before any DDP is
built and so before hotfix is active (a torch-only script activates hotfix at its first DDP); each layer then calls
that name itself, reentrant, on a bound method of its own (``self._block_forward``), not on the module.  The model
has a head the loss never reaches (``pooler``): why its script sets find_unused_parameters=True.  Imports torch only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class HubStyleLayer(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)
        self.gradient_checkpointing = False

    def _block_forward(self, hidden):
        return hidden + self.down(nn.functional.gelu(self.up(self.norm(hidden))))

    def forward(self, hidden):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self._block_forward, hidden, use_reentrant=True)
        return self._block_forward(hidden)


class HubStyleModel(nn.Module):
    def __init__(self, vocab_size: int = 32, hidden: int = 16, layers: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(HubStyleLayer(hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size)
        self.pooler = nn.Linear(hidden, hidden)  # a second head this loss never uses: find_unused_parameters=True

    def gradient_checkpointing_enable(self) -> None:
        for layer in self.layers:
            layer.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.head(self.norm(hidden))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
