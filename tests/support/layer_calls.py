"""What the in-process toy models share: calling their layers as transformers' GradientCheckpointingLayer does.

A toy model subclasses :class:`CheckpointedLayers` and calls each layer through :meth:`call_layer`: while
``checkpointing`` is on, the layer's keywords are bound in a ``partial`` and the checkpoint function gets
only the hidden states positionally, as transformers does; ``fix`` wraps that function in the keyword
fix's own wrapper (transformers-checkpoint-layer-io), as hotfix's descriptor hands it out.
"""

from __future__ import annotations

import functools

import torch
import wrapt
from torch.utils.checkpoint import checkpoint

from hotfix.patches.transformers_checkpoint_layer_io import checkpoint_with_lifted_inputs, patch


class CheckpointedLayers(torch.nn.Module):
    def __init__(self, fix: bool, reentrant: bool = True) -> None:
        super().__init__()
        raw = functools.partial(checkpoint, use_reentrant=reentrant)
        self.checkpoint = wrapt.FunctionWrapper(raw, checkpoint_with_lifted_inputs(patch)) if fix else raw
        self.checkpointing = False

    def call_layer(self, layer: torch.nn.Module, hidden: torch.Tensor, **keywords) -> torch.Tensor:
        if self.checkpointing:
            return self.checkpoint(functools.partial(layer.__call__, **keywords), hidden)
        return layer(hidden, **keywords)
