"""A plain-torch mixture of experts for the routing replay's in-process tests (tests/unit/test_moe_routing_replay.py).

Its own module: moe-routing-replay replaces a routing module's global ``torch`` (the tests put it back).  The
block loops over the experts that were hit, as transformers 4.x and most Hub models do (a recomputation that routes
otherwise runs other shapes: non-reentrant checkpointing fails); ``GroupRouter`` picks with ``Tensor.topk`` under
``@torch.no_grad()`` (DeepSeek's and GLM's group routers: reached through the method, not the module's torch).
"""

from __future__ import annotations

import torch
from torch import nn

EXPERTS, TOP_K, WIDTH = 6, 2, 8


class Block(nn.Module):
    def __init__(self, method: bool = False):
        super().__init__()
        self.gate = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(EXPERTS)])
        self.router = GroupRouter() if method else None

    def forward(self, x):
        flat = x.reshape(-1, WIDTH)
        probs = torch.softmax(self.gate(flat), dim=-1)
        if self.router is not None:
            chosen = self.router.choose(probs)
            weights = probs.gather(1, chosen)
        else:
            weights, chosen = torch.topk(probs, TOP_K, dim=-1)
        out = torch.zeros_like(flat)
        for expert in torch.unique(chosen).tolist():  # only the experts that were hit: shapes follow the routing
            rows, slot = torch.where(chosen == expert)
            out.index_add_(0, rows, self.experts[expert](flat[rows]) * weights[rows, slot, None])
        return x + out.reshape(x.shape)


class GroupRouter(nn.Module):
    @torch.no_grad()
    def choose(self, probs):
        return probs.topk(TOP_K, dim=-1).indices


class Model(nn.Module):
    def __init__(self, method: bool = False, layers: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(method) for _ in range(layers)])
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x, checkpoint=None):
        for block in self.blocks:
            x = checkpoint(block, x) if checkpoint is not None else block(x)
        return self.head(x).sum()
